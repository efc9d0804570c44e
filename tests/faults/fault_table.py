#!/usr/bin/env python3
"""The fault table: every RUNS/*/row.json (fault_row.py's rows; RUNS defaults to OUT/runs) as
OUT/table.md and OUT/table.json, headed by the command and the commit, and the summary line.
Exits 1 if a fault was not survived.
  python3 tests/faults/fault_table.py OUT [RUNS] "COMMAND" < /dev/null"""
import glob
import json
import os
import subprocess
import sys

if len(sys.argv) > 3:
    out, runs_dir, command = sys.argv[1], sys.argv[2], sys.argv[3]
else:
    out, command = sys.argv[1], sys.argv[2]
    runs_dir = os.path.join(out, 'runs')
commit = subprocess.run(['git', '-C', os.path.dirname(os.path.abspath(__file__)), 'rev-parse', '--short', 'HEAD'],
                        capture_output=True, text=True).stdout.strip() or 'unknown'
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
shown = os.path.relpath(os.path.abspath(runs_dir), root)
shown = runs_dir if shown.startswith('..') else shown
rows = []
for path in sorted(glob.glob(os.path.join(runs_dir, '*', 'row.json'))):
    with open(path) as f:
        row = json.load(f)
    row['name'] = os.path.basename(os.path.dirname(path))
    rows.append(row)
survived = sum(1 for r in rows if r['survived'])
failed = len(rows) - survived
lines = [f'Command: `{command}`', '', f'Produced at commit {commit} (raw runs: {shown})', '',
         '| fault | target | mode | injected at | outcome | updates lost | server==replica | hung? | verdict |',
         '|---|---|---|---|---|---|---|---|---|']
for r in rows:
    lost = 'unknown' if r['lost'] is None else str(r['lost'])
    d = r.get('lost_details') or {}
    if d:
        lost += f" of {d.get('acked', '?')} acked ({d.get('reported_lost', 0)} reported lost to their worker"
        if d.get('undelivered'):
            lost += f", {d['undelivered']} reported not delivered by the aggregator"
        lost += ')'
    reasons = list(r.get('problems') or [])
    if r['lost']:
        reasons.append(f"{r['lost']} acknowledged updates lost ({', '.join(d.get('missing', [])[:5])})")
    if r['hung'] != 'no':
        reasons.append(f"hung: {r['hung']}")
    verdict = 'survived' if r['survived'] else 'FAILED: ' + '; '.join(reasons or ['see outcome'])
    outcome = r['outcome'].replace('|', '/')
    lines.append(f"| {r['fault']} | {r['target']} | {r.get('mode', '?')} | {r['injected_at']} | {outcome} | {lost} | "
                 f"{r['equal']} | {r['hung']} | {verdict} |")
summary = f'faults: {survived} survived, {failed} failed'
lines += ['', summary]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, 'table.md'), 'w') as f:
    f.write('\n'.join(lines) + '\n')
with open(os.path.join(out, 'table.json'), 'w') as f:
    json.dump({'command': command, 'commit': commit, 'rows': rows, 'survived': survived, 'failed': failed}, f, indent=1)
print('\n'.join(lines))
sys.exit(1 if failed else 0)
