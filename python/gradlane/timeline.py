"""Turns gradlaned schedule logs (gradlaned --schedule-log FILE) into a Chrome-trace JSON that
Perfetto (ui.perfetto.dev) or chrome://tracing opens, and optionally a PNG.

    python3 -m gradlane.timeline a.log b.log [--applied server.applied.csv] -o trace.json \
        [--png timeline.png --window 2:3] [--senders]

Each log is a process (a host's gradlaned); in it, one lane per sender endpoint shows each push:
"wait" from its request to its grant (or its drop), then "write" from the transfer's start to
its completion; a lane per receiver shows the applied sequence numbers ("applied" lines, a
counter of the model's version) and the sequences cancelled; an aggregator's lane its aggregates;
the planned slots lie on a lane of their own under each sender. With --applied, a server's
applied log (gradlane_train's SERVER.applied.csv) is a process too, with a lane per worker:
each update from its doorbell at the server to its apply ("queued": the server applies in
sequence order), then the apply. Times are the host's CLOCK_MONOTONIC: the logs of the emulated
hosts of one VM share it; on a real cluster each host's log is its own process and their clocks
are not aligned.

Stands alone (the standard library; matplotlib for --png only): it imports nothing of gradlane.
"""
import argparse
import json
import os
import sys

# Lanes under a process: a sender's pushes, its planned slots, a receiver, an aggregator.
SENDER, SLOTS, RECEIVER, AGGREGATOR = 0, 1, 2, 3
LANE_NAMES = {SENDER: "endpoint {} pushes", SLOTS: "endpoint {} planned slots", RECEIVER: "endpoint {} applies",
              AGGREGATOR: "endpoint {} aggregates"}


class LogError(ValueError):
    """A schedule log line that is not what gradlaned writes."""


def read_log(path):
    """The log's lines as dicts, in order; LogError naming the file and line for a bad one."""
    rows = []
    with open(path, encoding="utf-8") as log:
        for number, line in enumerate(log, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise LogError(f"{path}:{number}: not a JSON line ({e.msg}): is it a gradlaned --schedule-log?") from e
            if not isinstance(row, dict) or "kind" not in row or "at" not in row:
                raise LogError(f"{path}:{number}: a line without 'kind' and 'at': not a gradlaned --schedule-log")
            rows.append(row)
    return rows


APPLIED_COLUMNS = ("sequence", "worker", "step", "skipped", "doorbell_ns", "apply_start_ns", "apply_end_ns")


def read_applied(path):
    """A server's applied log (CSV, a row per sequence in apply order) as dicts of ints; LogError
    naming the file and line for a row that is not one, or a log without the time columns."""
    import csv

    rows = []
    with open(path, encoding="utf-8", newline="") as log:
        reader = csv.DictReader(log)
        missing = [c for c in APPLIED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise LogError(f"{path}: no column {', '.join(missing)}: not a server's applied log with apply times "
                           "(gradlane_train writes one as SERVER.applied.csv)")
        for number, row in enumerate(reader, 2):
            try:
                rows.append({c: int(row[c]) for c in APPLIED_COLUMNS})
            except (TypeError, ValueError):
                raise LogError(f"{path}:{number}: a row whose {', '.join(APPLIED_COLUMNS)} are not integers") from None
    return rows


def _us(ns, origin):
    return (ns - origin) / 1000.0


def applied_events(name, rows, pid, origin):
    """Chrome trace events of one server's applied log (read_applied), as process `pid`: per worker
    a lane with each update's wait at the server ("queued", from its doorbell to its apply) and its
    apply; skipped sequences on a lane of their own."""
    skips = SLOTS  # worker 0's planned-slots lane: no worker's pushes are drawn there
    events, workers, skipped = [], set(), False
    for row in rows:
        seq = row["sequence"]
        if row["skipped"]:
            if row["apply_end_ns"]:
                events.append({"name": f"skipped seq {seq}", "ph": "i", "s": "t", "pid": pid, "tid": skips,
                               "ts": _us(row["apply_end_ns"], origin)})
                skipped = True
            continue
        if not row["apply_start_ns"]:
            continue  # applied before its times were known (a log from an older server)
        tid, args = row["worker"] * 4 + SENDER, {"seq": seq, "step": row["step"]}
        workers.add(row["worker"])
        if row["doorbell_ns"]:
            events.append({"name": "queued", "ph": "X", "pid": pid, "tid": tid, "ts": _us(row["doorbell_ns"], origin),
                           "dur": max(row["apply_start_ns"] - row["doorbell_ns"], 0) / 1000.0, "args": args})
        events.append({"name": f"apply seq {seq}", "ph": "X", "pid": pid, "tid": tid,
                       "ts": _us(row["apply_start_ns"], origin),
                       "dur": max(row["apply_end_ns"] - row["apply_start_ns"], 0) / 1000.0, "args": args})
    events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"server {name}"}})
    lanes = [(worker * 4 + SENDER, f"worker {worker} at the server") for worker in sorted(workers)]
    for tid, lane in lanes + ([(skips, "skipped sequences")] if skipped else []):
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": lane}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return events


def trace_events(logs, applied=()):
    """Chrome trace events for [(name, rows)] of schedule logs and [(name, rows)] of servers'
    applied logs, and a summary {name: counts}. Times in µs from the first line of all logs."""
    starts = [row["at"] for _, rows in logs for row in rows]
    starts += [t for _, rows in applied for row in rows for t in (row["doorbell_ns"], row["apply_start_ns"]) if t]
    if not starts:
        raise LogError("the logs hold no line: did gradlaned schedule anything?")
    origin = min(starts)
    events, summary = [], {}
    for pid, (name, rows) in enumerate(applied, len(logs) + 1):
        events += applied_events(name, rows, pid, origin)
        summary[name] = {"applies": sum(1 for r in rows if r["apply_start_ns"]),
                         "skipped": sum(1 for r in rows if r["skipped"])}
    for pid, (name, rows) in enumerate(logs, 1):
        lanes = set()
        counts = {"requests": 0, "grants": 0, "writes": 0, "drops": 0, "applied_through": 0}

        def lane(kind, endpoint):
            lanes.add((kind, endpoint))
            return endpoint * 4 + kind

        requests = {}  # request id -> request line
        for row in rows:
            kind, at = row["kind"], row["at"]
            if kind == "request":
                requests[row["request"]] = row
                counts["requests"] += 1
            elif kind in ("go", "redirect", "drop"):
                asked = requests.get(row["request"])
                sender = row["sender"]
                if asked is not None and asked["at"] <= at:
                    events.append({"name": "wait", "ph": "X", "pid": pid, "tid": lane(SENDER, sender),
                                   "ts": _us(asked["at"], origin), "dur": (at - asked["at"]) / 1000.0,
                                   "args": {"request": row["request"], "part": row.get("part", 0),
                                            "computed_on": asked.get("computed_on")}})
                if kind == "drop":
                    counts["drops"] += 1
                    events.append({"name": f"dropped: {row.get('reason', '?')}", "ph": "i", "s": "t", "pid": pid,
                                   "tid": lane(SENDER, sender), "ts": _us(at, origin),
                                   "args": {"request": row["request"], "delay": row.get("delay")}})
                    continue
                counts["grants"] += 1
                to = f"seq {row['seq']}" if kind == "go" else f"aggregate {row['aggregate']}"
                events.append({"name": f"slot: {to}", "ph": "X", "pid": pid, "tid": lane(SLOTS, sender),
                               "ts": _us(row["slot_start"], origin),
                               "dur": max(row["slot_end"] - row["slot_start"], 0) / 1000.0,
                               "args": {"origin": row.get("origin"), "bytes": row.get("bytes"),
                                        "delay": row.get("delay")}})
            elif kind == "aggregate":
                counts["grants"] += 1
                events.append({"name": f"aggregate {row['aggregate']} -> seq {row['seq']}", "ph": "X", "pid": pid,
                               "tid": lane(AGGREGATOR, row["aggregator"]), "ts": _us(row["slot_start"], origin),
                               "dur": max(row["slot_end"] - row["slot_start"], 0) / 1000.0,
                               "args": {"members": row.get("members"), "delay": row.get("delay")}})
            elif kind == "completion":
                counts["writes"] += 1
                measured = row.get("measured_ns", 0)
                events.append({"name": f"write seq {row['seq']}" if row.get("ok", True) else "write failed",
                               "ph": "X", "pid": pid, "tid": lane(SENDER, row["sender"]),
                               "ts": _us(at - measured, origin), "dur": measured / 1000.0,
                               "args": {"bytes": row.get("bytes"), "receiver": row.get("receiver"),
                                        "transfer": row.get("transfer")}})
            elif kind == "applied":
                counts["applied_through"] = max(counts["applied_through"], row["seq"])
                events.append({"name": "version", "ph": "C", "pid": pid, "tid": lane(RECEIVER, row["receiver"]),
                               "ts": _us(at, origin), "args": {f"endpoint {row['receiver']}": row["seq"]}})
                events.append({"name": f"applied through {row['seq']}", "ph": "i", "s": "t", "pid": pid,
                               "tid": lane(RECEIVER, row["receiver"]), "ts": _us(at, origin)})
            elif kind == "cancel":
                events.append({"name": f"cancelled seq {row['seq']}", "ph": "i", "s": "t", "pid": pid,
                               "tid": lane(RECEIVER, row["receiver"]), "ts": _us(at, origin)})
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"gradlaned {name}"}})
        for kind, endpoint in lanes:
            tid = endpoint * 4 + kind
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"name": LANE_NAMES[kind].format(endpoint)}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        summary[name] = counts
    return events, summary


def _percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def sender_breakdown(events):
    """Where each sender's time went, from trace_events' events: {(process, endpoint): {"pushes",
    "wait_s", "wait_median_ms", "wait_p90_ms", "write_s", "between_s", "span_s"}}. wait: from each
    request to its grant or drop; write: the transfers' measured times; between: from a write's end
    to the sender's next request (its compute, its pull of the model, its evaluation); span: from
    its first request to the end of its last wait or write."""
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    lanes = {}
    for e in events:
        if e["ph"] == "X" and e.get("tid", 0) % 4 == SENDER and (e["name"] == "wait" or e["name"].startswith("write")):
            lanes.setdefault((e["pid"], e["tid"] // 4), []).append(e)
    out = {}
    for (pid, endpoint), pushes in sorted(lanes.items()):
        pushes.sort(key=lambda e: e["ts"])
        waits = [e["dur"] for e in pushes if e["name"] == "wait"]
        writes = [e for e in pushes if e["name"] != "wait"]
        between = [nxt["ts"] - (e["ts"] + e["dur"]) for e, nxt in zip(pushes, pushes[1:])
                   if e["name"] != "wait" and nxt["name"] == "wait"]
        end = max(e["ts"] + e["dur"] for e in pushes)
        out[(names.get(pid, str(pid)), endpoint)] = {
            "pushes": len(writes), "wait_s": sum(waits) / 1e6,
            "wait_median_ms": _percentile(waits, 0.5) / 1e3, "wait_p90_ms": _percentile(waits, 0.9) / 1e3,
            "write_s": sum(e["dur"] for e in writes) / 1e6, "between_s": sum(max(b, 0.0) for b in between) / 1e6,
            "span_s": (end - pushes[0]["ts"]) / 1e6}
    return out


def draw_png(events, path, window=None):
    """The pushes' lanes of every process as horizontal bars (wait grey, write blue, drops red)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit(f"--png needs matplotlib (apt-get install python3-matplotlib): {e}") from e
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    # A process is named by its log's file name here (its whole path is in the trace).
    processes = {}
    for e in events:
        if e.get("name") == "process_name":
            role, log = e["args"]["name"].split(" ", 1)
            processes[e["pid"]] = f"{role} {os.path.basename(log)}"
    lo, hi = (window[0] * 1e6, window[1] * 1e6) if window else (float("-inf"), float("inf"))
    shown = [e for e in events if e["ph"] in ("X", "i") and lo <= e["ts"] <= hi
             and (e["tid"] % 4 in (SENDER, AGGREGATOR) or e["ph"] == "i")]
    keys = sorted({(e["pid"], e["tid"]) for e in shown})
    if not keys:
        raise SystemExit("nothing to draw in that window")
    rows = {key: i for i, key in enumerate(keys)}
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(keys) + 1.2))
    colours = {"wait": "#c8c8c8", "queued": "#d6bcfa"}
    for e in shown:
        y = rows[(e["pid"], e["tid"])]
        if e["ph"] == "X":
            colour = colours.get(e["name"], "#d9822b" if e["name"].startswith("aggregate")
                                 else "#38a169" if e["name"].startswith("apply") else "#2b6cb0")
            ax.barh(y, max(e["dur"], 1.0) / 1000.0, left=e["ts"] / 1000.0, height=0.6, color=colour)
        else:
            colour = "#c53030" if e["name"].startswith("dropped") else "#2f855a"
            ax.plot([e["ts"] / 1000.0], [y], marker="|" if colour == "#2f855a" else "x", color=colour, markersize=9)
    several = len(processes) > 1  # name the host only when there are several
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([(f"{processes.get(pid, pid)}: " if several else "") + names.get((pid, tid), str(tid))
                        for pid, tid in keys], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first line of the logs")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    handles = [Patch(color="#c8c8c8", label="wait for a grant"), Patch(color="#2b6cb0", label="write"),
               Patch(color="#d9822b", label="aggregate")]
    if any(e["name"] == "queued" for e in shown):
        handles += [Patch(color="#d6bcfa", label="at the server, queued"), Patch(color="#38a169", label="apply")]
    handles += [Line2D([], [], color="#2f855a", marker="|", linestyle="", label="applied"),
                Line2D([], [], color="#c53030", marker="x", linestyle="", label="dropped")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.3 / len(keys)),
              ncol=min(len(handles), 4), fontsize=8, frameon=False)
    ax.set_title("gradlane timeline", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m gradlane.timeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="*", help="gradlaned --schedule-log files, one per host")
    parser.add_argument("--applied", action="append", default=[], metavar="CSV",
                        help="a server's applied log with apply times (gradlane_train's SERVER.applied.csv)")
    parser.add_argument("-o", "--output", default="gradlane-trace.json", help="the Chrome-trace JSON to write")
    parser.add_argument("--png", help="also draw the pushes' lanes into this PNG (needs matplotlib)")
    parser.add_argument("--window", help="START:END seconds since the first line, for --png")
    parser.add_argument("--senders", action="store_true",
                        help="also print where each sender's time went: waiting for grants, writing, and between "
                             "a write and its next request")
    args = parser.parse_args(argv)
    window = None
    if args.window:
        try:
            window = tuple(float(x) for x in args.window.split(":"))
            if len(window) != 2 or window[0] >= window[1]:
                raise ValueError
        except ValueError:
            parser.error(f"--window {args.window}: give START:END in seconds, START < END (e.g. 2:3)")
    if not args.logs and not args.applied:
        parser.error("give gradlaned schedule logs, --applied server logs, or both")
    try:
        events, summary = trace_events([(path, read_log(path)) for path in args.logs],
                                       [(path, read_applied(path)) for path in args.applied])
    except (OSError, LogError) as e:
        raise SystemExit(f"gradlane.timeline: {e}") from e
    with open(args.output, "w", encoding="utf-8") as out:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, out)
    for name, c in summary.items():
        if "applies" in c:
            print(f"{name}: {c['applies']} applies, {c['skipped']} skipped")
        else:
            print(f"{name}: {c['requests']} requests, {c['grants']} grants, {c['writes']} writes, {c['drops']} drops, "
                  f"applied through {c['applied_through']}")
    if args.senders:
        for (name, endpoint), b in sender_breakdown(events).items():
            print(f"{name} endpoint {endpoint}: {b['pushes']} writes over {b['span_s']:.1f} s: waited "
                  f"{b['wait_s']:.2f} s for grants (median {b['wait_median_ms']:.1f} ms, p90 "
                  f"{b['wait_p90_ms']:.1f} ms), wrote {b['write_s']:.2f} s, {b['between_s']:.2f} s from a write's "
                  "end to its next request")
    print(f"wrote {args.output} ({len(events)} events): open it in ui.perfetto.dev or chrome://tracing")
    if args.png:
        draw_png(events, args.png, window)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
