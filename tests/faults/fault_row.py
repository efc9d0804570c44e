#!/usr/bin/env python3
"""Checks one fault run of trainer/train-job.sh (FAULT=...) and prints its row as JSON.

  python3 tests/faults/fault_row.py RUN_DIR            (RUN_DIR = .../train-MODE)

Every field is measured from the run's files:
  outcome   'continued' when every role the fault did not target exited 0 and the surviving
            server applied updates after the fault; else, per role that failed, 'clear error in
            X s' when it exited non-zero within 5 s of the fault (its .exit time) with an error
            line in its log, or 'FAILED ...'.
  lost      acknowledged updates (a push that returned neither lost nor dropped, in a worker's
            pushes.csv) whose sequence is not in the surviving server's applied log as that worker's (the promoted replica's
            when the server died); in aggregate mode through the aggregator's member log. A
            push an aggregator took (pending) counts once its worker's members.csv says it was
            delivered, with the server's sequence for the sum; not delivered, it is
            'undelivered' (never acknowledged).
  equal     server and replica model hashes (NAME.versions.csv) compared at every version both
            saw: equal at all of them, and at least one compared.
  hung      the roles the watchdog (inject-fault.sh) found still running HANG_S after the fault,
            or 'no fault.json' when the injector never finished.
"""
import csv
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'trainer'))
from train_summary import read_json  # noqa: E402  (tolerant: a killed role's file may be cut short)

CLEAR_S = 5.0
STEPPED_DOWN = 5  # gradlane_train server: stepped down, the replica carries the job on
# gradlane_train server: cut off (lost every worker, none finished, having a replica): the
# replica may carry the job on; the server's versions past its replica_acked are not the job's.
CUT_OFF = 6


def read_csv(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return list(csv.DictReader(f))


def versions(path):
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.strip().split(',')
                if len(parts) == 2 and parts[0].isdigit():
                    out[int(parts[0])] = parts[1]
    return out


def error_line(log):
    try:
        with open(log, errors='replace') as f:
            lines = [l.strip() for l in f if l.strip()]
    except OSError:
        return None
    for line in reversed(lines):
        if re.search(r'gradlane_train \w+: |error|failed|lost|timed out', line, re.I):
            return line[:160]
    return None


def restarted_from(run):
    """The step a restarted worker resumed at, from inject-fault.sh's note in fault.log."""
    try:
        with open(os.path.join(run, 'fault.log')) as f:
            for line in f:
                m = re.match(r'restarting \S+ from step (\d+)', line)
                if m:
                    return int(m.group(1))
    except OSError:
        pass
    return None


def harness_failure(run):
    """What the Soft-RoCE harness or the VM's kernel said went wrong (job.out), or None."""
    harness = ('softroce: timed out', 'softroce: VM did not start', 'softroce: CMD did not report')
    kernel = ('soft lockup', 'hung_task', 'BUG:', 'Oops', 'watchdog:', 'rcu: INFO', 'Kernel panic')
    said = {}  # the harness's first line and the kernel's, each cut to 200 characters
    try:
        with open(os.path.join(run, 'job.out'), errors='replace') as f:
            for line in f:
                for kind, marks in (('harness', harness), ('kernel', kernel)):
                    if kind not in said and any(m in line for m in marks):
                        said[kind] = line.strip()[:200]
    except OSError:
        pass
    return ' / the kernel: '.join(said[k] for k in ('harness', 'kernel') if k in said) or None


def check(run):
    fault = read_json(os.path.join(run, 'fault.json'))
    row = {'run': run}
    if fault is None:
        why = harness_failure(run)
        outcome = 'FAILED: no fault.json (the injector did not finish)' + (f': {why}' if why else '')
        row.update(fault='?', target='?', injected_at='?', outcome=outcome,
                   lost=None, equal='?', hung='no fault.json', survived=False, harness_failure=why)
        return row
    kind, target = fault['kind'], fault['target']
    injected = float(fault['injected'])
    row.update(fault=kind, target=target if kind in ('kill', 'stop', 'restart', 'replace') else f'host {target}',
               injected_at=f"{injected - float(fault['started']):.2f} s (v{fault['version_at_injection']})"
               + (f", v{fault['at_version']} not reached in time" if fault.get('trigger') == 'timeout' else ''),
               target_alive=fault['target_alive'])
    problems = []
    if not fault['target_alive']:
        problems.append('the target had already exited: nothing was injected')

    # Exits.
    exits = {}
    for f in glob.glob(os.path.join(run, '*.exit')):
        name = os.path.basename(f)[:-5]
        status, at = open(f).read().split()
        exits[name] = (int(status), float(at))
    roles = [os.path.basename(f)[:-4] for f in glob.glob(os.path.join(run, '*.pid'))]
    killed = target if kind in ('kill', 'replace') else None
    replica_stats = read_json(os.path.join(run, 'replica.stats.json')) or {}
    # The replica also "promotes" itself when a finished server disconnects: what counts is
    # whether the server itself ended cleanly with its applied log.
    promoted = replica_stats.get('promoted_at_ns', 0) > 0
    server_ended = exits.get('server', (None, None))[0] == 0 and os.path.exists(os.path.join(run, 'server.applied.csv'))
    # Exit 5: the server stepped down (a worker reached the replica while it lived) and handed
    # the job to the replica: one final model, the replica's.
    stepped_down = exits.get('server', (None, None))[0] == STEPPED_DOWN
    cut_off = exits.get('server', (None, None))[0] == CUT_OFF
    survivor = 'server' if server_ended or not promoted else 'replica'
    if (stepped_down or cut_off) and not promoted:
        problems.append(f"the server {'stepped down' if stepped_down else 'was cut off'} but the replica was not "
                        "promoted: nobody carried the job on")
    row['promoted'] = promoted
    # A server that ended while workers still pushed to its promoted replica: two final models
    # (seen when a link's loss made the server drop workers that then failed over).
    server_final = read_json(os.path.join(run, 'server.stats.json')) or {}
    if server_ended and promoted and replica_stats.get('version', 0) > server_final.get('version', 0):
        problems.append(f"split: the server ended at v{server_final.get('version')} while the replica, promoted when it "
                        f"left, went on to v{replica_stats.get('version')}: two final models")
        survivor = 'replica'
    row['survivor'] = survivor

    outcomes = []
    failed = False
    for name in sorted(roles):
        if name == 'server' and stepped_down:
            outcomes.append(f"server stepped down at v{(read_json(os.path.join(run, 'server.stats.json')) or {}).get('version')}"
                            f" (a worker failed over), the replica carried on")
            continue
        if name == 'server' and cut_off:
            outcomes.append(f"server cut off at v{server_final.get('version')} (lost every worker), "
                            f"the replica carried on")
            continue
        if name == killed:
            status = exits.get(name, (None, None))[0]
            if status != 137:
                problems.append(f'{name} was sent SIGKILL but exited {status}')
            continue
        if name not in exits:
            outcomes.append(f'{name}: no exit record')
            failed = True
            continue
        status, at = exits[name]
        if status == 0:
            continue
        after = at - injected
        err = error_line(os.path.join(run, f'{name}.log'))
        if 0 <= after <= CLEAR_S and err and status not in (137, 143):
            outcomes.append(f'{name}: clear error in {after:.1f} s ("{err}")')
        else:
            outcomes.append(f'{name}: FAILED (status {status}, {after:.1f} s after the fault, error line: {err})')
            failed = True
    surv_applied = read_csv(os.path.join(run, f'{survivor}.applied.csv'))
    surv_versions = versions(os.path.join(run, f'{survivor}.versions.csv'))
    after_fault = max(surv_versions) if surv_versions else 0
    continued = after_fault > int(fault['version_at_injection'])
    if not outcomes:
        outcome = 'continued' if continued else 'FAILED: every role exited 0 but no update was applied after the fault'
        failed = failed or not continued
    else:
        outcome = '; '.join(outcomes)
        if continued:
            outcome = 'continued; ' + outcome
    if kind in ('kill', 'replace') and target == 'server':
        if not promoted:
            problems.append('the server was killed and the replica was not promoted')
        if promoted and 'injected_uptime' in fault:
            outcome += f" (replica promoted {replica_stats['promoted_at_ns'] / 1e9 - float(fault['injected_uptime']):.2f} s after)"
        elif promoted:
            outcome += ' (replica promoted)'
    if kind == 'restart' and target.startswith('worker'):
        # The restarted worker must have rejoined: admitted by the server that finished the job,
        # and pushed (its exit 0 is checked above like any role's).
        joined = (read_json(os.path.join(run, f'{survivor}.stats.json')) or {}).get('peers_joined', 0)
        first = restarted_from(run)
        if joined < 1:
            problems.append(f'{target} was restarted but the {survivor} admitted no worker after the start')
        outcome += f' ({target} restarted from step {first if first is not None else "?"}, rejoined: ' \
                   f'{survivor} peers_joined {joined})'
    if kind == 'restart' and target == 'aggregator':
        # The restarted aggregator must have been found again: workers joined it and it forwarded.
        agg = read_json(os.path.join(run, 'aggregator.stats.json')) or {}
        if agg.get('peers_joined', 0) < 1 or agg.get('forwarded', 0) < 1:
            problems.append('the restarted aggregator was not found again by its workers (or forwarded nothing)')
        outcome += (f" (aggregator restarted: {agg.get('peers_joined', 0)} workers came back, it forwarded "
                    f"{agg.get('forwarded', 0)} sums)")
    # Workers that lost their server and replica (a link down) and rejoined the running job
    # without a restart (gradlane_train worker --rejoin-within).
    rejoined = []
    for name in sorted(roles):
        report = read_json(os.path.join(run, f'{name}.json')) if name.startswith('worker') else None
        if report and report.get('rejoins', 0) > 0:
            rejoined.append(f"{name} {report['rejoins']}x, {report.get('rejoining_s', 0):.1f} s")
    if rejoined:
        outcome += ' (rejoined the running job: ' + '; '.join(rejoined) + ')'
    row['rejoined'] = rejoined
    row['outcome'] = outcome
    row['final_version'] = after_fault

    # Acknowledged updates in the survivor's applied log.
    lost = None
    details = {}
    if surv_applied is None:
        problems.append(f'no {survivor}.applied.csv: cannot check acknowledged updates')
    else:
        applied = {}
        for u in surv_applied:
            if u['skipped'] == '0':
                key = (int(u['worker']), int(u['step']))
                applied[key] = applied.get(key, 0) + 1
        by_sequence = {int(u['sequence']): u for u in surv_applied if u['skipped'] == '0'}
        # A worker's (id, step) applied twice is a double apply. An aggregator's step is its
        # forward's number, which a restarted aggregator counts from 1 again: not checked here
        # (its members are, through their workers' outcomes, below).
        worker_ids = {int(m.group(1)) for f in glob.glob(os.path.join(run, '*worker*.pushes.csv'))
                      for m in [re.search(r'worker(\d+)\.pushes', f)] if m}
        twice = sum(1 for (w, _), n in applied.items() if n > 1 and w in worker_ids)
        if twice:
            problems.append(f'{twice} updates applied twice')
        members = read_csv(os.path.join(run, 'aggregator.members.csv'))
        member_of = {}
        agg_id = None
        if members is not None:
            for m in members:
                member_of[(int(m['worker']), int(m['step']))] = int(m['sequence'])
        agg_stats_path = os.path.join(run, 'aggregator.log')
        acked = missing = unverified = reported_lost = undelivered = unsettled = 0
        missing_list = []
        # A restarted worker's first incarnation left killed-workerI.pushes.csv: its acknowledged
        # pushes count as much as the restarted one's.
        push_logs = sorted(glob.glob(os.path.join(run, 'worker*.pushes.csv')) +
                           glob.glob(os.path.join(run, 'killed-worker*.pushes.csv')))
        for f in push_logs:
            worker = int(re.search(r'worker(\d+)\.pushes', f).group(1))
            # A push an aggregator took (pending) is acknowledged when the aggregator says its
            # sum reached the server: the members log names the server's sequence for the sum.
            outcomes = {int(m['step']): m for m in read_csv(f.replace('.pushes.csv', '.members.csv')) or []}
            for p in read_csv(f):
                if p['lost'] == '1':
                    reported_lost += 1
                    continue
                if p.get('pending') == '1':
                    outcome = outcomes.get(int(p['step']))
                    if outcome is None:
                        unsettled += 1
                    elif outcome['delivered'] != '1':
                        undelivered += 1
                    else:
                        acked += 1
                        if int(outcome['sequence']) not in by_sequence:
                            missing += 1
                            missing_list.append(f'w{worker}s{p["step"]}')
                    continue
                if p['dropped'] == '1' or p['sequence'] == '0':
                    continue
                acked += 1
                # The survivor applied this sequence as this worker's (the promoted replica names
                # the worker of an update it took from a mirror, not always its step).
                entry = by_sequence.get(int(p['sequence']))
                if entry is not None and int(entry['worker']) == worker:
                    continue
                if os.path.exists(agg_stats_path):  # aggregate mode: through the aggregator's group
                    if members is None:
                        unverified += 1
                        continue
                    seq = member_of.get((worker, int(p['step'])))
                    if seq and seq in by_sequence:
                        continue
                missing += 1
                missing_list.append(f'w{worker}s{p["step"]}')
        lost = missing
        details = {'acked': acked, 'reported_lost': reported_lost, 'undelivered': undelivered, 'unsettled': unsettled,
                   'unverified': unverified, 'missing': missing_list[:20]}
        if unverified:
            problems.append(f'{unverified} acknowledged pushes unverifiable (no aggregator member log)')
        killed_worker = killed if killed and killed.startswith('worker') else None
        if killed_worker and not os.path.exists(os.path.join(run, f'{killed_worker}.pushes.csv')):
            details['note'] = f'{killed_worker} left no pushes.csv (SIGKILL): its acknowledgements are not checked'
        if killed == 'aggregator' and undelivered:
            details['note'] = (f'{undelivered} members the killed aggregator held, not forwarded: reported not '
                               'delivered to their workers, never acknowledged')
    row['lost'] = lost
    row['lost_details'] = details

    # Server == replica at equal versions. A server cut off from its replica and every worker
    # may have applied, within its replication window, versions the replica never confirmed (and
    # skipped as holes when promoted): a dead branch, never acknowledged to anyone (the lost
    # check above covers that). Those are reported, not failed; everything confirmed must match.
    sv, rv = versions(os.path.join(run, 'server.versions.csv')), versions(os.path.join(run, 'replica.versions.csv'))
    common = sorted(set(sv) & set(rv) - {0})
    unconfirmed = []
    if cut_off:
        confirmed = int(server_final.get('replica_acked', 0))
        unconfirmed = [v for v in common if v > confirmed and sv[v] != rv[v]]
        common = [v for v in common if v <= confirmed]
    differ = [v for v in common if sv[v] != rv[v]]
    if not common:
        row['equal'] = 'NO COMMON VERSION'
        problems.append('server and replica share no version to compare')
    elif differ:
        row['equal'] = f'NO: {len(differ)} of {len(common)} versions differ, first v{differ[0]}'
        problems.append('server and replica diverged')
    else:
        row['equal'] = f'yes ({len(common)} versions, up to v{common[-1]})'
    if unconfirmed:
        row['equal'] += (f'; the cut-off server\'s {len(unconfirmed)} version(s) past v{server_final.get("replica_acked")}, '
                         f'never confirmed by the replica, differ (first v{unconfirmed[0]})')
    if kind == 'replace':
        # A new replica (replica2) joined the promoted one: it must have been adopted and be
        # equal to it at every version both saw after the join.
        joined = (read_json(os.path.join(run, 'replica2.stats.json')) or {}).get('joined_at')
        nv = versions(os.path.join(run, 'replica2.versions.csv'))
        common2 = sorted(set(rv) & set(nv) - {0})
        differ2 = [v for v in common2 if rv[v] != nv[v]]
        if joined is None or replica_stats.get('replicas_joined', 0) < 1:
            problems.append('no new replica joined the promoted one')
            row['equal'] += '; new replica: did not join'
        elif not common2 or differ2:
            problems.append('the new replica and the promoted one ' + ('diverged' if differ2 else 'share no version'))
            row['equal'] += f'; new replica: NO ({len(differ2)} of {len(common2)} versions differ)'
        else:
            row['equal'] += f'; new replica (joined at v{joined}): yes ({len(common2)} versions, up to v{common2[-1]})'

    row['hung'] = ', '.join(fault['hung']) if fault['hung'] else 'no'
    row['problems'] = problems
    row['survived'] = (not failed and not fault['hung'] and lost == 0 and not problems)
    return row


if __name__ == '__main__':
    if sys.argv[1] == '--recheck':  # OUT: every runs/*/row.json checked again from its files
        for row_path in sorted(glob.glob(os.path.join(sys.argv[2], 'runs', '*', 'row.json'))):
            with open(row_path) as f:
                old = json.load(f)
            new = check(os.path.dirname(row_path))
            new.update({k: old[k] for k in ('job_exit', 'spec', 'mode') if k in old})
            with open(row_path, 'w') as f:
                f.write(json.dumps(new) + '\n')
    else:
        print(json.dumps(check(sys.argv[1])))
