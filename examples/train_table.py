#!/usr/bin/env python3
"""Collects the summary.json of every run under RESULTS/runs into results.json and a markdown
table results.md: per (straggler, mode) the median and range over seeds."""
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


def main(results):
    rows = {}
    for path in sorted(glob.glob(os.path.join(results, "runs", "*", "train-*", "summary.json"))):
        m = re.search(r"straggler(\d)-(\w+)-seed(\d+)", path)
        if not m:
            continue
        s = json.load(open(path))
        s["straggler"], s["seed"] = int(m.group(1)), int(m.group(3))
        rows.setdefault((s["straggler"], m.group(2)), []).append(s)
    json.dump({f"straggler{k[0]}-{k[1]}": v for k, v in rows.items()}, open(os.path.join(results, "results.json"), "w"), indent=1)
    lines = ["| straggler | mode | seeds | time to target (s) | final accuracy | applied | dropped | updates/s | delay median / max |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (straggler, mode), runs in sorted(rows.items()):
        lines.append(f"| {straggler} | {mode} | {len(runs)} | {fmt([r['time_to_target_s'] for r in runs])} | "
                     f"{fmt([r['final_accuracy'] for r in runs], 4)} | {fmt([r['applied'] for r in runs], 0)} | "
                     f"{fmt([r['dropped'] for r in runs], 0)} | {fmt([r['updates_per_s'] for r in runs])} | "
                     f"{fmt([r['delay_median'] for r in runs])} / {fmt([r['delay_max'] for r in runs], 0)} |")
    target = next(iter(rows.values()))[0]["target"] if rows else None
    text = f"Target accuracy {target}; values are the median (min–max) over seeds.\n\n" + "\n".join(lines) + "\n"
    open(os.path.join(results, "results.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1])
