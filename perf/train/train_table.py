#!/usr/bin/env python3
"""Collects the summary.json of every run under RUNS (default RESULTS/runs) into results.json and a
markdown table results.md: per (straggler, mode) the median and range over seeds, headed by the
commands (RESULTS/command.txt) and the commit that produced it.
  python3 perf/train/train_table.py RESULTS [RUNS]"""
import glob
import json
import os
import re
import statistics
import sys


def fmt(values, digits=1):
    values = [v for v in values if v is not None]
    if not values:
        return "not reached"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def produced(results):
    """'Produced at commit <hash> by: <command>' from RESULTS/command.txt and the checkout's HEAD."""
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    path = os.path.join(results, "command.txt")
    commands = [c for c in open(path).read().splitlines() if c.strip()] if os.path.exists(path) else []
    return f"Produced at commit {commit} by: " + ("; ".join(f"`{c}`" for c in commands) or "(no command.txt)")


def shown(path):
    """PATH relative to the repository when it lies inside it (what a committed table names)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rel = os.path.relpath(os.path.abspath(path), root)
    return path if rel.startswith("..") else rel


def main(results, runs=None):
    runs_dir = runs or os.path.join(results, "runs")
    rows = {}
    for path in sorted(glob.glob(os.path.join(runs_dir, "*", "train-*", "summary.json"))):
        # runs/straggler<S>-<mode>-seed<N>[-replica0][-lr<LR>]/train-<mode>/summary.json
        m = re.search(r"straggler(\d)-(\w+)-seed(\d+)((?:-[\w.]+)*)/", path)
        if not m:
            continue
        s = json.load(open(path))
        s["straggler"], s["seed"] = int(m.group(1)), int(m.group(3))
        variants = [v for v in m.group(4).split("-") if v]
        named = {"replica0": "no replica", "aggregate0": "no aggregator, before --link-rate (aa72afc)"}
        labels = [named.get(v, f"lr {v[2:]}" if v.startswith("lr") else v) for v in variants]
        mode = m.group(2) + (f" ({', '.join(labels)})" if labels else "")
        rows.setdefault((s["straggler"], mode), []).append(s)
    json.dump({f"straggler{k[0]}-{k[1]}": v for k, v in rows.items()}, open(os.path.join(results, "results.json"), "w"), indent=1)
    # Speed-up vs fifo: per seed, fifo's time to target / the mode's (same seed, same case), so
    # a slow seed for both does not count as a difference; then median (range) over seeds.
    def speedups(straggler, runs):
        fifo = {r["seed"]: r["time_to_target_s"] for r in rows.get((straggler, "fifo"), [])}
        return [fifo[r["seed"]] / r["time_to_target_s"] for r in runs
                if r["time_to_target_s"] and fifo.get(r["seed"])]

    def per_gradient(r):  # server ingress bytes per gradient applied (summed in, for aggregate)
        b, g = r.get("server_ingress_bytes"), r.get("gradients_applied")
        return b / g / 1e3 if b and g else None

    lines = ["| straggler | mode | seeds | time to target (s) | speed-up vs fifo | final accuracy | updates applied | "
             "gradients applied | dropped | server ingress (MB) | kB in per gradient | delay median / max |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    def time_to_target(runs):  # over the runs that reached it, saying how many did
        reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"]]
        text = fmt(reached)
        return text if len(reached) == len(runs) else f"{text}, reached in {len(reached)} of {len(runs)}"

    for (straggler, mode), runs in sorted(rows.items()):
        lines.append(f"| {straggler} | {mode} | {len(runs)} | {time_to_target(runs)} | "
                     f"{fmt(speedups(straggler, runs), 2)} | "
                     f"{fmt([r['final_accuracy'] for r in runs], 4)} | {fmt([r['applied'] for r in runs], 0)} | "
                     f"{fmt([r.get('gradients_applied') for r in runs], 0)} | "
                     f"{fmt([r['dropped'] for r in runs], 0)} | "
                     f"{fmt([(r.get('server_ingress_bytes') or 0) / 1e6 or None for r in runs], 2)} | "
                     f"{fmt([per_gradient(r) for r in runs], 1)} | "
                     f"{fmt([r['delay_median'] for r in runs])} / {fmt([r['delay_max'] for r in runs], 0)} |")
    target = next(iter(rows.values()))[0]["target"] if rows else None
    text = (f"{produced(results)} (raw runs: {shown(runs_dir)})\n\n"
            f"Target accuracy {target}; values are the median (min–max) over seeds.\n\n" + "\n".join(lines) + "\n")
    open(os.path.join(results, "results.md"), "w").write(text)
    print(text)
    plot(results, runs_dir)


def plot(results, runs_dir):
    """accuracy-straggler<S>.png: test accuracy over wall time, one line per mode, seed 1."""
    import subprocess
    for straggler in (0, 1):
        curves = []
        for mode in ("gradlane", "fifo", "sync", "aggregate"):
            path = os.path.join(runs_dir, f"straggler{straggler}-{mode}-seed1", f"train-{mode}", "accuracy.csv")
            if os.path.exists(path):
                curves.append(f"'{path}' using 1:3 with lines lw 2 title '{mode}'")
        if not curves:
            continue
        png = os.path.join(results, f"accuracy-straggler{straggler}.png")
        script = (f"set terminal png size 800,500; set output '{png}'; set datafile separator ',';"
                  f"set key bottom right; set xlabel 'wall time (s)'; set ylabel 'test accuracy (10,000 images)';"
                  f"set yrange [0.5:0.85]; set grid; set title 'Soft-RoCE, server ingress 4 mbit/s, "
                  f"{'one worker at 1 mbit/s' if straggler else 'no straggler'} (seed 1)';"
                  "plot " + ", ".join(curves))
        subprocess.run(["gnuplot", "-e", script], check=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
