#!/usr/bin/env python3
"""Prints the schedule a gradlaned made from its --schedule-log (JSON lines), as a table."""
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8") if line.strip()]
decisions = [r for r in rows if r.get("origin") == "here" and r["kind"] in ("go", "redirect", "aggregate", "drop", "cancel")]
if not decisions:
    sys.exit("no decisions in " + sys.argv[1])
t0 = min(r["at"] for r in decisions)
print(f"schedule made by the receiver's sidecar ({len(decisions)} decisions; times in ms from the first):")
print(f"{'seq':>4} {'kind':>8} {'job':>4} {'sender':>6} {'receiver':>8} {'KiB':>6} {'decided':>9} {'slot start':>10} {'slot ms':>8} {'delay':>5}")
for r in sorted(decisions, key=lambda r: (r.get("seq", 0), r["at"])):
    start = (r.get("slot_start", r["at"]) - t0) / 1e6
    length = (r.get("slot_end", r.get("slot_start", 0)) - r.get("slot_start", 0)) / 1e6
    sender = r.get("sender", r.get("aggregator", "-"))
    print(f"{r.get('seq', '-'):>4} {r['kind']:>8} {r.get('job', '-'):>4} {sender:>6} {r.get('receiver', '-'):>8} "
          f"{r.get('bytes', 0) // 1024:>6} {(r['at'] - t0) / 1e6:>9.2f} {start:>10.2f} {length:>8.2f} {r.get('delay', '-'):>5}")
