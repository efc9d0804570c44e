#!/usr/bin/env python3
"""The host half of perf/compare-perftest: parses every client output of pairs.sh with ONE
parser (perftest's and gradlane's tools print the same columns), cross-checks each figure
against the client's wall-clock time, and writes compare.json, compare.md and compare.png.

    report.py RAW_DIR OUT_DIR [--note TEXT]
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

TESTS = {  # test: (metric, unit, better, target sizes, target)
    "write_bw": ("bw_avg", "Gb/s", "higher", lambda b: b >= 65536, 0.97),
    "read_bw": ("bw_avg", "Gb/s", "higher", lambda b: b >= 65536, 0.97),
    "write_lat": ("t_typical", "usec", "lower", lambda b: b == 8, 1.10),
    "read_lat": ("t_typical", "usec", "lower", lambda b: b == 8, 1.10),
}
BW_COLUMNS = ["bytes", "iterations", "bw_peak", "bw_avg", "msg_rate"]
LAT_COLUMNS = ["bytes", "iterations", "t_min", "t_max", "t_typical", "t_avg", "t_stdev", "p99", "p999"]
HEADER_FACTS = {"Max inline data": "inline", "CQ Moderation": "cq_mod", "Mtu": "mtu", "Device": "device",
                "Outstand reads": "outstanding_reads", "TX depth": "tx_depth"}


def parse_output(path):
    """The result row under the ' #bytes' title, plus a few header facts. Same code for both tools."""
    facts, row, title = {}, None, None
    with open(path, errors="replace") as f:
        for line in f:
            for key, name in HEADER_FACTS.items():
                m = re.search(re.escape(key) + r"\s*:\s*([^\s\[]+)", line)
                if m and name not in facts:
                    facts[name] = m.group(1)
            if line.startswith(" #bytes"):
                title = line
                continue
            if title is not None and row is None and re.match(r"^\s\d+\s+\d+\s+[\d.]+", line):
                values = [float(v) for v in line.split()]
                columns = BW_COLUMNS if "BW" in title else LAT_COLUMNS
                row = dict(zip(columns, values))
                if "MB/sec" in title:  # perftest's MB is MiB: report Gb/s
                    for k in ("bw_peak", "bw_avg"):
                        row[k] = row[k] * 1048576 * 8 / 1e9
    return row, facts


def implied_seconds(test, row):
    if test.endswith("_bw"):
        return row["bytes"] * row["iterations"] * 8 / (row["bw_avg"] * 1e9) if row["bw_avg"] > 0 else math.inf
    rtt = 2 if test == "write_lat" else 1
    return row["t_typical"] * rtt * row["iterations"] * 1e-6


def load(raw):
    runs = []
    with open(os.path.join(raw, "runs.tsv")) as f:
        names = f.readline().split()
        for line in f:
            runs.append(dict(zip(names, line.split())))
    results = {}
    for r in runs:
        key = (r["test"], int(r["bytes"]), r["impl"])
        entry = {"rep": int(r["rep"]), "attempts": int(r["attempts"]), "rc": int(r["rc"]),
                 "wall_s": int(r["wall_us"]) / 1e6}
        path = os.path.join(raw, f'{r["test"]}-{r["bytes"]}-{r["impl"]}-{r["rep"]}.txt')
        row, facts = parse_output(path) if os.path.exists(path) else (None, {})
        entry["facts"] = facts
        if entry["rc"] != 0 or row is None:
            entry["status"] = "failed"
        else:
            entry.update(row)
            # The figure must fit in the time the client really ran: perftest converts cycles
            # with a CPU-MHz guess that TCG sometimes gets wrong.
            needed = implied_seconds(r["test"], row)
            entry["implied_s"] = needed
            entry["status"] = "ok" if needed <= entry["wall_s"] * 1.02 else "suspect-clock"
        results.setdefault(key, []).append(entry)
    return results


def summarize(results):
    tests = {}
    for (test, size, impl), entries in sorted(results.items()):
        metric = TESTS[test][0]
        good = [e[metric] for e in entries if e["status"] == "ok"]
        t = tests.setdefault(test, {})
        s = t.setdefault(size, {"bytes": size})
        best = (max if TESTS[test][2] == "higher" else min)(good) if good else None
        s[impl] = {"median": statistics.median(good) if good else None, "best": best, "runs": entries,
                   "valid": len(good), "metric": metric}
    out = {}
    for test, sizes in tests.items():
        metric, unit, better, in_target, target = TESTS[test]
        rows = []
        for size in sorted(sizes):
            s = sizes[size]
            for kind in ("best", "median"):
                p = s.get("perftest", {}).get(kind)
                g = s.get("gradlane", {}).get(kind)
                c = s.get("candidate", {}).get(kind)
                suffix = "" if kind == "best" else "_median"
                s["ratio" + suffix] = g / p if p and g else None
                if "candidate" in s:
                    s["candidate_ratio" + suffix] = c / p if p and c else None
            s["in_target"] = in_target(size)
            rows.append(s)
        def geomean(key):
            ratios = [r[key] for r in rows if r["in_target"] and r.get(key)]
            return math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None
        geo = geomean("ratio")
        met = None if geo is None else (geo >= target if better == "higher" else geo <= target)
        out[test] = {"metric": metric, "unit": unit, "better": better, "target": target,
                     "target_ratio": geo, "target_ratio_median": geomean("ratio_median"), "target_met": met,
                     "sizes": rows}
        if any("candidate" in r for r in rows):
            out[test]["candidate_target_ratio"] = geomean("candidate_ratio")
    return out


def human(b):
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n} {unit}"
    return f"{b} B"


def target_text(test):
    _, _, better, _, target = TESTS[test]
    scope = "sizes ≥ 64 KiB" if test.endswith("_bw") else "8 B"
    return f"{'≥' if better == 'higher' else '≤'} {target:.2f} ({scope}, geometric mean)"


def markdown(summary, note):
    lines = ["# gradlane tools vs perftest", ""]
    if note:
        lines += [note, ""]
    candidate = any("candidate_target_ratio" in t for t in summary.values())
    lines += ["| test | target | best-of-runs ratio | met | median ratio |" + (" candidate |" if candidate else ""),
              "| --- | --- | --- | --- | --- |" + (" --- |" if candidate else "")]
    for test, t in summary.items():
        measured = f"{t['target_ratio']:.3f}" if t["target_ratio"] else "n/a"
        med = f"{t['target_ratio_median']:.3f}" if t.get("target_ratio_median") else "n/a"
        extra = ""
        if candidate:
            c = t.get("candidate_target_ratio")
            extra = f" {c:.3f} |" if c else " n/a |"
        lines.append(f"| {test} | gradlane/perftest {target_text(test)} | {measured} | "
                     f"{'yes' if t['target_met'] else 'NO' if t['target_met'] is not None else 'n/a'} | {med} |"
                     + extra)
    for test, t in summary.items():
        metric = "BW average [Gb/s]" if t["metric"] == "bw_avg" else "t_typical [µs]"
        cand = any("candidate" in s for s in t["sizes"])
        lines += ["", f"## {test} — {metric}: best of the valid runs (median in brackets)", "",
                  "| size | perftest | gradlane | ratio | median ratio | valid runs (perftest/gradlane) |"
                  + (" candidate | candidate ratio |" if cand else ""),
                  "| ---: | ---: | ---: | ---: | ---: | :---: |" + (" ---: | ---: |" if cand else "")]
        for s in t["sizes"]:
            fmt = (lambda v: f"{v:.3f}") if t["metric"] == "bw_avg" else (lambda v: f"{v:.2f}")

            def cell(impl):
                best, median = s.get(impl, {}).get("best"), s.get(impl, {}).get("median")
                return f"{fmt(best)} ({fmt(median)})" if best else "n/a"
            ratio = f"{s['ratio']:.3f}" if s["ratio"] else "n/a"
            if s["in_target"]:
                ratio = f"**{ratio}**"
            med = f"{s['ratio_median']:.3f}" if s.get("ratio_median") else "n/a"
            row = (f"| {human(s['bytes'])} | {cell('perftest')} | {cell('gradlane')} | {ratio} | {med} | "
                   f"{s.get('perftest', {}).get('valid', 0)}/{s.get('gradlane', {}).get('valid', 0)} |")
            if cand:
                c = s.get("candidate", {}).get("best")
                cr = s.get("candidate_ratio")
                row += f" {fmt(c) if c else 'n/a'} | {f'{cr:.3f}' if cr else 'n/a'} |"
            lines.append(row)
    lines += ["", "Ratio = gradlane / perftest of the best valid run of each (bold: sizes the target covers); "
              "bandwidth: higher is better, latency: lower is better. Best-of-runs because the noise here is "
              "one-sided: a descheduled vCPU only ever makes a run slower, for either tool. A run is valid when "
              "it exited 0 and its figure fits in the client's wall-clock time.", ""]
    return "\n".join(lines)


def plot(summary, png):
    with tempfile.TemporaryDirectory() as tmp:
        script = ["set terminal pngcairo size 1400,1000 font 'DejaVu Sans,10'", f"set output '{png}'",
                  "set multiplot layout 2,2 title 'gradlane tools vs perftest (same device, alternating runs)'",
                  "set logscale x 2", "set grid", "set key top left", "set termoption noenhanced",
                  "set y2tics", "set ytics nomirror", "set y2range [0.5:1.5]", "set y2label 'ratio gradlane/perftest'"]
        for test in ("write_bw", "read_bw", "write_lat", "read_lat"):
            if test not in summary:
                continue
            t = summary[test]
            data = os.path.join(tmp, f"{test}.dat")
            with open(data, "w") as f:
                for s in t["sizes"]:
                    p = s.get("perftest", {}).get("best")
                    g = s.get("gradlane", {}).get("best")
                    if p and g:  # best of runs, as the table
                        f.write(f"{s['bytes']} {p} {g} {g / p}\n")
            ticks = ", ".join(f'"{human(s["bytes"]).replace(" ", "")}" {s["bytes"]}' for s in t["sizes"][::2])
            script.append(f"set xtics ({ticks})")
            ylabel = "BW average [Gb/s]" if t["metric"] == "bw_avg" else "t_typical [usec]"
            script += [f"set title '{test}'", f"set ylabel '{ylabel}'",
                       "set logscale y" if t["metric"] != "bw_avg" else "unset logscale y",
                       f"plot '{data}' using 1:2 with linespoints lw 2 title 'perftest', "
                       f"'{data}' using 1:3 with linespoints lw 2 title 'gradlane', "
                       f"'{data}' using 1:4 axes x1y2 with impulses lw 6 lc rgb '#9090d0' title 'ratio', "
                       f"{t['target']} axes x1y2 with lines dt 2 lc rgb 'red' title 'target ratio'"]
        script.append("unset multiplot")
        gp = os.path.join(tmp, "plot.gp")
        with open(gp, "w") as f:
            f.write("\n".join(script) + "\n")
        subprocess.run(["gnuplot", gp], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("raw")
    ap.add_argument("out")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    summary = summarize(load(args.raw))
    clock = os.path.join(args.raw, "clocksource")
    if os.path.exists(clock):
        with open(clock) as f:
            args.note += " Clocksource: " + ", ".join(line.strip() for line in f) + "."
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compare.json"), "w") as f:
        json.dump({"note": args.note, "tests": summary}, f, indent=1, default=str)
    md = markdown(summary, args.note)
    with open(os.path.join(args.out, "compare.md"), "w") as f:
        f.write(md)
    try:
        plot(summary, os.path.join(args.out, "compare.png"))
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"report.py: no plot ({e}); is gnuplot installed?", file=sys.stderr)
    print(md)


if __name__ == "__main__":
    main()
