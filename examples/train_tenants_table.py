#!/usr/bin/env python3
"""Table and plot of examples/train-tenants.sh's runs: job completion times of two jobs sharing hosts.

  python3 examples/train_tenants_table.py RESULTS [RUNS]

Reads RUNS/<variant>-seed<N>/job{1,2}/ (RUNS: default RESULTS/runs; server.stats.json, worker*.json, accuracy.json)
and writes RESULTS/results.md (headed by the command and the commit), results.json and jct.png (gnuplot, if installed).

A job's completion time (JCT) is measured on one clock for both jobs: from the moment the first
of the two began training (every one of its workers connected) to the moment its server
applied its last update. Speed-ups are fifo's JCT over the variant's, per seed (same seed), then
the median and range over seeds.
"""
import glob
import json
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_faults  # noqa: E402  (its tolerant JSON reader)
import train_table  # noqa: E402  (its median-and-range format)

JOBS = {1: 'long', 2: 'short'}
ORDER = ['gradlane', 'undeclared', 'fifo']
NOTES = {
    'gradlane': 'gradlaned, each push declares its job\'s work left',
    'undeclared': 'gradlaned, nothing declared (queued bytes compared)',
    'fifo': 'no sidecar: the link shares itself (fair sharing)',
}


def run_row(run_dir):
    jobs = {}
    for job in JOBS:
        d = os.path.join(run_dir, f'job{job}')
        stats = train_faults.read_json(os.path.join(d, 'server.stats.json'))
        if not stats or stats.get('error'):
            return None
        workers = [train_faults.read_json(f) for f in sorted(glob.glob(os.path.join(d, 'worker*.json')))]
        accuracy = train_faults.read_json(os.path.join(d, 'accuracy.json')) or {}
        jobs[job] = {
            'start': stats['start_unix'],
            'end': stats['start_unix'] + stats['seconds'],
            'applied': stats['applied'],
            'dropped': sum(w.get('dropped', 0) for w in workers if w),
            'steps': sum(w.get('steps', 0) for w in workers if w),
            'final_accuracy': accuracy.get('final_accuracy'),
        }
    origin = min(j['start'] for j in jobs.values())
    row = {}
    for job, j in jobs.items():
        row[JOBS[job]] = {
            'jct_s': j['end'] - origin,
            'start_offset_s': j['start'] - origin,
            'applied': j['applied'],
            'dropped': j['dropped'],
            'gradients': j['steps'],
            'final_accuracy': j['final_accuracy'],
        }
    row['mean_jct_s'] = statistics.mean(row[n]['jct_s'] for n in JOBS.values())
    return row


def spread(values, digits=1):
    """median (min–max), as the other training tables print it; '—' for none."""
    values = [v for v in values if v is not None]
    return train_table.fmt(values, digits) if values else '—'


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
    fifo = runs.get('fifo', {})

    def speedups(variant, key):
        out = []
        for seed, row in runs[variant].items():
            if seed in fifo:
                base = fifo[seed][key]['jct_s'] if key != 'mean' else fifo[seed]['mean_jct_s']
                mine = row[key]['jct_s'] if key != 'mean' else row['mean_jct_s']
                out.append(base / mine)
        return out

    lines = ['| variant | seeds | short job JCT (s) | short: fifo / variant | long job JCT (s) | long: fifo / variant | '
             'mean JCT (s) | mean: fifo / variant | dropped (short / long) | final accuracy (short / long) |',
             '|---|---|---|---|---|---|---|---|---|---|']
    summary = {}
    for v in variants:
        rows = list(runs[v].values())
        s = {
            'seeds': sorted(runs[v]),
            'short_jct_s': [r['short']['jct_s'] for r in rows],
            'long_jct_s': [r['long']['jct_s'] for r in rows],
            'mean_jct_s': [r['mean_jct_s'] for r in rows],
            'short_speedup': speedups(v, 'short'),
            'long_speedup': speedups(v, 'long'),
            'mean_speedup': speedups(v, 'mean'),
            'runs': runs[v],
        }
        summary[v] = s
        dropped = (f"{sum(r['short']['dropped'] for r in rows)} of {sum(r['short']['gradients'] for r in rows)} / "
                   f"{sum(r['long']['dropped'] for r in rows)} of {sum(r['long']['gradients'] for r in rows)}")
        accuracy = (f"{spread([r['short']['final_accuracy'] for r in rows], 3)} / "
                    f"{spread([r['long']['final_accuracy'] for r in rows], 3)}")
        lines.append(f"| {v} | {len(rows)} | {spread(s['short_jct_s'])} | {spread(s['short_speedup'], 2)} | "
                     f"{spread(s['long_jct_s'])} | {spread(s['long_speedup'], 2)} | {spread(s['mean_jct_s'])} | "
                     f"{spread(s['mean_speedup'], 2)} | {dropped} | {accuracy} |")
    md = ['# Two jobs sharing hosts: job completion times', '',
          train_table.produced(results) + f' (raw runs: {train_table.shown(runs_dir)})', '',
          'Median (min–max) over seeds; speed-ups per seed against fifo of the same seed.', ''] + lines + [''] + \
         [f'- {v}: {NOTES[v]}' for v in variants] + ['']
    with open(os.path.join(results, 'results.md'), 'w') as f:
        f.write('\n'.join(md))
    with open(os.path.join(results, 'results.json'), 'w') as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    print('\n'.join(lines))
    plot(results, variants, summary)


def plot(results, variants, summary):
    """jct.png: each job's median completion time per variant, the range as error bars."""
    data = os.path.join(results, 'jct.dat')
    with open(data, 'w') as f:
        for i, v in enumerate(variants):
            s = summary[v]
            row = [i, v]
            for key in ('short_jct_s', 'long_jct_s'):
                row += [statistics.median(s[key]), min(s[key]), max(s[key])]
            f.write(' '.join(str(x) for x in row) + '\n')
    png = os.path.join(results, 'jct.png')
    script = (f"set terminal png size 700,420; set output '{png}'; set style data histograms;"
              "set style histogram errorbars gap 1 lw 1; set style fill solid 0.6 border -1;"
              "set ylabel 'job completion time (s)'; set yrange [0:*]; set key below;"
              "set title 'Two jobs sharing worker hosts (median, min-max over seeds)';"
              f"plot '{data}' using 3:4:5:xtic(2) title 'short job', '' using 6:7:8 title 'long job'")
    try:
        subprocess.run(['gnuplot', '-e', script], check=False)
    except OSError:
        print('gnuplot not installed: no jct.png', file=sys.stderr)
    os.remove(data)


if __name__ == '__main__':
    main()
