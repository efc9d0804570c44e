#!/usr/bin/env python3
"""Table and plot of perf/train/tenants.sh's runs: job completion times of jobs sharing hosts.

  python3 perf/train/tenants_table.py RESULTS [RUNS]

Reads RUNS/<variant>-seed<N>/job<J>/ (RUNS: default RESULTS/runs; server.stats.json, worker*.json, accuracy.json)
and writes RESULTS/results.md (headed by the command and the commit), results.json and jct.png (gnuplot, if installed).

A job's completion time (JCT) is measured on one clock for every job of a run: from the moment the
first of them began training (every one of its workers connected) to the moment its server applied
its last update. Speed-ups against fifo are per seed (same seed), then the median and range over
seeds. gradlane against each baseline is the ratio of medians, baseline / gradlane (> 1: gradlane
finishes sooner), with a paired bootstrap 95 % interval: the seeds both ran, resampled with
replacement.
"""
import glob
import json
import os
import random
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, '..', '..', 'trainer')]
import train_summary  # noqa: E402  (its tolerant JSON reader)
import train_table  # noqa: E402  (its median-and-range format)

# Job ids as tenants-job.sh numbers them, shortest first in the table.
JOB_NAMES = {2: 'short', 3: 'medium', 1: 'long'}
ORDER = ['gradlane', 'undeclared', 'priority', 'net-priority', 'fair', 'net-fair', 'fifo']
BASELINES = ['priority', 'net-priority', 'fair', 'net-fair', 'fifo']
NOTES = {
    'gradlane': 'gradlaned, shortest remaining job first: each push declares its job\'s work left',
    'undeclared': 'gradlaned, nothing declared (queued bytes compared)',
    'priority': 'gradlaned, strict priority in the order of the jobs\' total work, least first '
                '(an operator who knows every job\'s length)',
    'net-priority': 'no sidecar: the shaped link queues by job (DSCP) in strict priority, the same order',
    'fair': 'gradlaned, per-job fair sharing: equal bytes to every backlogged job',
    'net-fair': 'no sidecar: the shaped link runs deficit round robin between the jobs (DSCP): equal bytes per job',
    'fifo': 'no sidecar: the link shares itself per flow (the long job has more flows)',
}
RESAMPLES = 10000
BOOT_SEED = 1


def classes_sent(run_dir):
    """Bytes per class of a net-* run's worker-host link (classes-h1.txt, `tc -s class show`):
    {classid minor: bytes} for the DRR or prio classes under the tbf, or None without the file."""
    path = os.path.join(run_dir, 'classes-h1.txt')
    if not os.path.exists(path):
        return None
    sent, current = {}, None
    with open(path) as f:
        for line in f:
            m = re.match(r'class (drr|prio) 10:(\w+)', line)
            if m:
                current = int(m.group(2), 16)
                continue
            m = re.match(r'\s*Sent (\d+) bytes', line)
            if m and current is not None:
                sent[current] = int(m.group(1))
                current = None
    return sent


def marked_by_job(sent, jobs):
    """Whether the DSCP marks put each job in a class of its own: every job's class (1..jobs)
    carried bytes, and the class of unmarked packets (the one above them) at most a fifth of all."""
    total = sum(sent.values())
    unmarked = sum(b for c, b in sent.items() if c > jobs)
    return total > 0 and all(sent.get(c, 0) > 0 for c in range(1, jobs + 1)) and unmarked <= total / 5


def run_row(run_dir):
    jobs = {}
    for d in sorted(glob.glob(os.path.join(run_dir, 'job*'))):
        m = re.match(r'job(\d+)$', os.path.basename(d))
        if not m or int(m.group(1)) not in JOB_NAMES:
            continue
        stats = train_summary.read_json(os.path.join(d, 'server.stats.json'))
        if not stats or stats.get('error'):
            return None
        workers = [train_summary.read_json(f) for f in sorted(glob.glob(os.path.join(d, 'worker*.json')))]
        accuracy = train_summary.read_json(os.path.join(d, 'accuracy.json')) or {}
        jobs[int(m.group(1))] = {
            'start': stats['start_unix'],
            'end': stats['start_unix'] + stats['seconds'],
            'applied': stats['applied'],
            'dropped': sum(w.get('dropped', 0) for w in workers if w),
            'steps': sum(w.get('steps', 0) for w in workers if w),
            'final_accuracy': accuracy.get('final_accuracy'),
        }
    if not jobs:
        return None
    sent = classes_sent(run_dir)
    if sent is not None and not marked_by_job(sent, len(jobs)):
        print(f'{run_dir}: its link did not see each job in a class of its own (bytes per class {sent}): '
              'left out', file=sys.stderr)
        return None
    origin = min(j['start'] for j in jobs.values())
    row = {}
    for job, j in jobs.items():
        row[JOB_NAMES[job]] = {
            'jct_s': j['end'] - origin,
            'start_offset_s': j['start'] - origin,
            'applied': j['applied'],
            'dropped': j['dropped'],
            'gradients': j['steps'],
            'final_accuracy': j['final_accuracy'],
        }
    row['mean_jct_s'] = statistics.mean(row[JOB_NAMES[job]]['jct_s'] for job in jobs)
    return row


def spread(values, digits=1):
    """median (min–max), as the other training tables print it; '—' for none."""
    values = [v for v in values if v is not None]
    return train_table.fmt(values, digits) if values else '—'


def jct(row, key):
    return row['mean_jct_s'] if key == 'mean' else row[key]['jct_s']


def ratio_of_medians(base, mine, key):
    """median(base) / median(mine) over the seeds both ran, with a paired bootstrap 95 % interval."""
    seeds = sorted(set(base) & set(mine))
    if not seeds:
        return None

    def ratio(sample):
        return statistics.median(jct(base[s], key) for s in sample) / statistics.median(jct(mine[s], key)
                                                                                        for s in sample)
    rng = random.Random(BOOT_SEED)
    boot = sorted(ratio([rng.choice(seeds) for _ in seeds]) for _ in range(RESAMPLES))
    return {'ratio': ratio(seeds), 'low': boot[int(0.025 * RESAMPLES)], 'high': boot[int(0.975 * RESAMPLES) - 1],
            'seeds': len(seeds)}


def main():
    results = sys.argv[1]
    runs_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(results, 'runs')
    runs = {}
    for d in sorted(glob.glob(os.path.join(runs_dir, '*-seed*'))):
        m = re.match(r'(.+)-seed(\d+)$', os.path.basename(d))
        row = run_row(d)
        if m and row:
            runs.setdefault(m.group(1), {})[int(m.group(2))] = row
    variants = [v for v in ORDER if v in runs]
    names = [n for n in JOB_NAMES.values() if any(n in r for v in runs.values() for r in v.values())]
    fifo = runs.get('fifo', {})

    def speedups(variant, key):
        return [jct(fifo[seed], key) / jct(row, key) for seed, row in runs[variant].items() if seed in fifo]

    head = ' | '.join(f'{n} job JCT (s) | {n}: fifo / variant' for n in names)
    lines = [f'| variant | seeds | {head} | mean JCT (s) | mean: fifo / variant | dropped ({" / ".join(names)}) | '
             f'final accuracy ({" / ".join(names)}) |',
             '|---|---|' + '---|---|' * len(names) + '---|---|---|---|']
    summary = {}
    for v in variants:
        rows = list(runs[v].values())
        s = {'seeds': sorted(runs[v]), 'runs': runs[v]}
        for n in names:
            s[f'{n}_jct_s'] = [r[n]['jct_s'] for r in rows]
            s[f'{n}_speedup'] = speedups(v, n)
        s['mean_jct_s'] = [r['mean_jct_s'] for r in rows]
        s['mean_speedup'] = speedups(v, 'mean')
        summary[v] = s
        cells = ' | '.join(f"{spread(s[f'{n}_jct_s'])} | {spread(s[f'{n}_speedup'], 2)}" for n in names)
        dropped = ' / '.join(f"{sum(r[n]['dropped'] for r in rows)} of {sum(r[n]['gradients'] for r in rows)}"
                             for n in names)
        accuracy = ' / '.join(spread([r[n]['final_accuracy'] for r in rows], 3) for n in names)
        lines.append(f"| {v} | {len(rows)} | {cells} | {spread(s['mean_jct_s'])} | {spread(s['mean_speedup'], 2)} | "
                     f"{dropped} | {accuracy} |")

    against = []
    if 'gradlane' in runs:
        keys = names + ['mean']
        against = ['| baseline | ' + ' | '.join(f'{k} JCT: baseline / gradlane [95 % CI]' for k in keys) + ' |',
                   '|---|' + '---|' * len(keys)]
        for b in [b for b in BASELINES if b in runs]:
            cells = []
            for k in keys:
                r = ratio_of_medians(runs[b], runs['gradlane'], k)
                summary[b].setdefault('gradlane_ratio', {})[k] = r
                cells.append('—' if r is None else f"{r['ratio']:.2f} [{r['low']:.2f}–{r['high']:.2f}]")
            against.append(f'| {b} | ' + ' | '.join(cells) + ' |')

    count = {1: 'One job', 2: 'Two jobs', 3: 'Three jobs'}.get(len(names), f'{len(names)} jobs')
    md = [f'# {count} sharing hosts: job completion times', '',
          train_table.produced(results) + f' (raw runs: {train_table.shown(runs_dir)})', '',
          'Median (min–max) over seeds; speed-ups per seed against fifo of the same seed.', ''] + lines + [''] + \
         [f'- {v}: {NOTES[v]}' for v in variants] + ['']
    if against:
        md += ['gradlane against each baseline: ratio of the medians over the seeds both ran, with a paired '
               f'bootstrap 95 % interval ({RESAMPLES:,} resamples of the seeds, RNG seed {BOOT_SEED}); > 1: '
               'gradlane finishes sooner.', ''] + against + ['']
    with open(os.path.join(results, 'results.md'), 'w') as f:
        f.write('\n'.join(md))
    with open(os.path.join(results, 'results.json'), 'w') as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    print('\n'.join(lines + [''] + against))
    plot(results, variants, names, summary, count)


def plot(results, variants, names, summary, count):
    """jct.png: each job's median completion time per variant, the range as error bars."""
    data = os.path.join(results, 'jct.dat')
    with open(data, 'w') as f:
        for i, v in enumerate(variants):
            s = summary[v]
            row = [i, v]
            for n in names:
                row += [statistics.median(s[f'{n}_jct_s']), min(s[f'{n}_jct_s']), max(s[f'{n}_jct_s'])]
            f.write(' '.join(str(x) for x in row) + '\n')
    png = os.path.join(results, 'jct.png')
    series = ', '.join(f"'{data if i == 0 else ''}' using {3 + 3 * i}:{4 + 3 * i}:{5 + 3 * i}"
                       f"{':xtic(2)' if i == 0 else ''} title '{n} job'" for i, n in enumerate(names))
    script = (f"set terminal png size 760,420; set output '{png}'; set style data histograms;"
              "set style histogram errorbars gap 1 lw 1; set style fill solid 0.6 border -1;"
              "set ylabel 'job completion time (s)'; set yrange [0:*]; set key below;"
              f"set title '{count} sharing worker hosts (median, min-max over seeds)'; plot {series}")
    try:
        subprocess.run(['gnuplot', '-e', script], check=False)
    except OSError:
        print('gnuplot not installed: no jct.png', file=sys.stderr)
    os.remove(data)


if __name__ == '__main__':
    main()
