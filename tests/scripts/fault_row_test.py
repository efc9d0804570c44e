#!/usr/bin/env python3
"""tests/faults/fault_row.py's checks can fail: a clean fabricated run passes, and each defect
(an acknowledged update missing, server and replica hashes differing, no common version, a
hung role, an error later than 5 s, a killed server without promotion) is reported.
  python3 tests/scripts/fault_row_test.py"""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'faults'))
import fault_row  # noqa: E402


def write(run, name, text):
    with open(os.path.join(run, name), 'w') as f:
        f.write(text)


def make_run(kind='kill', target='worker2', hung=(), server_versions=None, replica_versions=None,
             applied=None, pushes=None, exits=None, promoted=0, logs=None):
    run = tempfile.mkdtemp(prefix='train-faults-test.')
    fault = {'fault': f'{kind}:{target}:1000', 'kind': kind, 'target': target, 'delay_ms': 1000, 'started': 100.0,
             'injected': 102.0, 'injected_uptime': 50.0, 'ended': None, 'version_at_injection': 2,
             'target_alive': True, 'hang_s': 120, 'hung': list(hung)}
    write(run, 'fault.json', json.dumps(fault))
    for name, (status, at) in (exits or {'server': (0, 110.0), 'replica': (0, 110.0), 'worker1': (0, 109.0),
                                         'worker2': (137, 102.1)}).items():
        write(run, f'{name}.pid', '1\n')
        write(run, f'{name}.exit', f'{status} {at}\n')
        write(run, f'{name}.log', (logs or {}).get(name, ''))
    sv = server_versions or {0: 'a', 1: 'b', 2: 'c', 3: 'd'}
    rv = replica_versions or sv
    write(run, 'server.versions.csv', ''.join(f'{v},{h}\n' for v, h in sv.items()))
    write(run, 'replica.versions.csv', ''.join(f'{v},{h}\n' for v, h in rv.items()))
    rows = applied or [(1, 1, 0), (2, 2, 0), (3, 1, 1)]  # (sequence, worker, step)
    survivor = 'replica' if promoted else 'server'
    write(run, f'{survivor}.applied.csv', 'sequence,worker,step,computed_on,skipped\n' +
          ''.join(f'{s},{w},{t},0,0\n' for s, w, t in rows))
    write(run, 'replica.stats.json', json.dumps({'promoted_at_ns': promoted}))
    for worker, lines in (pushes or {1: [(0, 1, 0), (1, 3, 0)]}).items():  # (step, sequence, lost)
        write(run, f'worker{worker}.pushes.csv', 'step,computed_on,sequence,dropped,lost\n' +
              ''.join(f'{t},0,{s},0,{l}\n' for t, s, l in lines))
    return run


class TrainFaultsCheck(unittest.TestCase):
    def test_a_clean_run_survives(self):
        row = fault_row.check(make_run())
        self.assertTrue(row['survived'], row)
        self.assertEqual(row['lost'], 0)
        self.assertEqual(row['outcome'], 'continued')

    def test_a_worker_that_rejoined_in_process_is_named_in_the_outcome(self):
        run = make_run(kind='link', target='2', exits={'server': (0, 110.0), 'replica': (0, 110.0),
                                                       'worker1': (0, 109.0)})
        self.assertEqual(fault_row.check(run)['rejoined'], [])
        write(run, 'worker1.json', json.dumps({'rejoins': 1, 'rejoining_s': 0.734}))
        row = fault_row.check(run)
        self.assertEqual(row['rejoined'], ['worker1 1x, 0.7 s'])
        self.assertIn('(rejoined the running job: worker1 1x, 0.7 s)', row['outcome'])
        self.assertTrue(row['survived'], row)

    def test_an_acknowledged_update_missing_is_lost(self):
        row = fault_row.check(make_run(pushes={1: [(0, 1, 0), (1, 3, 0), (2, 4, 0)]}))
        self.assertEqual(row['lost'], 1)
        self.assertFalse(row['survived'])

    def test_an_update_applied_as_another_workers_is_lost(self):
        row = fault_row.check(make_run(applied=[(1, 1, 0), (2, 2, 0), (3, 2, 1)]))
        self.assertEqual(row['lost'], 1)

    def test_a_push_reported_lost_is_not_counted(self):
        row = fault_row.check(make_run(pushes={1: [(0, 1, 0), (1, 3, 0), (2, 0, 1)]}))
        self.assertEqual(row['lost'], 0)

    def test_a_pending_push_counts_only_once_delivered(self):
        run = make_run()
        write(run, 'worker1.pushes.csv', 'step,computed_on,sequence,aggregate,dropped,lost,pending\n'
              '0,0,1,0,0,0,0\n1,0,7,0,0,0,1\n2,0,8,0,0,0,1\n3,0,9,0,0,0,1\n')
        # step 1 delivered as the server's 3 (applied), step 2 not delivered, step 3 no outcome
        write(run, 'worker1.members.csv', 'step,delivered,sequence\n1,1,3\n2,0,0\n')
        row = fault_row.check(run)
        self.assertEqual(row['lost'], 0, row)
        self.assertEqual(row['lost_details']['acked'], 2)
        self.assertEqual(row['lost_details']['undelivered'], 1)
        self.assertEqual(row['lost_details']['unsettled'], 1)
        # delivered as a sequence the server never applied: lost
        write(run, 'worker1.members.csv', 'step,delivered,sequence\n1,1,30\n2,0,0\n')
        self.assertEqual(fault_row.check(run)['lost'], 1)

    def test_a_replaced_replica_must_join_and_follow_bitwise(self):
        exits = {'server': (137, 102.1), 'replica': (0, 110.0), 'worker1': (0, 109.0), 'replica2': (0, 110.0)}
        run = make_run(kind='replace', target='server', exits=exits, promoted=int(50.5e9))
        self.assertFalse(fault_row.check(run)['survived'])  # no new replica joined
        write(run, 'replica.stats.json', json.dumps({'promoted_at_ns': int(50.5e9), 'replicas_joined': 1}))
        write(run, 'replica2.stats.json', json.dumps({'joined_at': 2}))
        write(run, 'replica2.versions.csv', '2,c\n3,d\n')
        row = fault_row.check(run)
        self.assertTrue(row['survived'], row)
        self.assertIn('new replica (joined at v2): yes (2 versions', row['equal'])
        write(run, 'replica2.versions.csv', '2,c\n3,X\n')
        self.assertFalse(fault_row.check(run)['survived'])

    def test_a_workers_step_applied_twice_fails_and_an_aggregators_forward_number_may_recur(self):
        row = fault_row.check(make_run(applied=[(1, 1, 0), (2, 2, 0), (3, 1, 1), (4, 1, 1)]))
        self.assertIn('1 updates applied twice', row['problems'])
        # worker 9 has no pushes.csv: an aggregator, whose forward numbers restart with it
        row = fault_row.check(make_run(applied=[(1, 1, 0), (2, 2, 0), (3, 1, 1), (4, 9, 1), (5, 9, 1)]))
        self.assertTrue(row['survived'], row)

    def test_diverged_models_are_reported(self):
        row = fault_row.check(make_run(replica_versions={0: 'a', 1: 'b', 2: 'X', 3: 'd'}))
        self.assertTrue(row['equal'].startswith('NO'), row['equal'])
        self.assertFalse(row['survived'])

    def test_no_common_version_fails(self):
        row = fault_row.check(make_run(server_versions={0: 'a', 1: 'b'}, replica_versions={0: 'a', 2: 'c'}))
        self.assertEqual(row['equal'], 'NO COMMON VERSION')
        self.assertFalse(row['survived'])

    def test_a_hung_role_fails(self):
        row = fault_row.check(make_run(hung=['worker1']))
        self.assertEqual(row['hung'], 'worker1')
        self.assertFalse(row['survived'])

    def test_a_run_without_its_injectors_record_fails_naming_what_the_harness_said(self):
        run = make_run()
        os.remove(os.path.join(run, 'fault.json'))
        write(run, 'job.out', 'softroce: VM up\n[  88.1] watchdog: BUG: soft lockup - CPU#1 stuck for 22s!\n')
        row = fault_row.check(run)
        self.assertFalse(row['survived'])
        self.assertIn('soft lockup', row['outcome'])

    def test_a_vm_that_died_is_named_by_the_harness_and_by_its_kernels_first_report(self):
        run = make_run()
        os.remove(os.path.join(run, 'fault.json'))
        write(run, 'job.out', 'softroce: CMD did not report an exit code: the VM died under it\n---- the VM\n'
              '[  40.1] rcu: INFO: rcu_preempt self-detected stall on CPU\n[  40.2] BUG: later\n')
        row = fault_row.check(run)
        self.assertEqual(row['harness_failure'], 'softroce: CMD did not report an exit code: the VM died under it'
                         ' / the kernel: [  40.1] rcu: INFO: rcu_preempt self-detected stall on CPU')

    def test_an_error_within_5_s_is_clear_and_later_is_not(self):
        exits = {'server': (0, 110.0), 'replica': (0, 110.0), 'worker1': (1, 104.0), 'worker2': (137, 102.1)}
        logs = {'worker1': 'gradlane_train worker: the server is gone\n'}
        row = fault_row.check(make_run(exits=exits, logs=logs))
        self.assertIn('worker1: clear error in 2.0 s', row['outcome'])
        self.assertTrue(row['survived'], row)
        exits['worker1'] = (1, 108.0)
        row = fault_row.check(make_run(exits=exits, logs=logs))
        self.assertIn('worker1: FAILED', row['outcome'])
        self.assertFalse(row['survived'])

    def test_a_killed_server_needs_a_promoted_replica(self):
        exits = {'server': (137, 102.1), 'replica': (0, 110.0), 'worker1': (0, 109.0)}
        row = fault_row.check(make_run(target='server', exits=exits))
        self.assertFalse(row['survived'])
        row = fault_row.check(make_run(target='server', exits=exits, promoted=int(50.5e9)))
        self.assertTrue(row['survived'], row)
        self.assertIn('replica promoted 0.50 s after', row['outcome'])

    def test_a_server_that_ended_while_its_promoted_replica_went_on_is_a_split(self):
        run = make_run(promoted=int(60e9))
        write(run, 'server.stats.json', json.dumps({'version': 3}))
        write(run, 'replica.stats.json', json.dumps({'promoted_at_ns': int(60e9), 'version': 9}))
        write(run, 'server.applied.csv', 'sequence,worker,step,computed_on,skipped\n1,1,0,0,0\n2,2,0,0,0\n')
        row = fault_row.check(run)
        self.assertEqual(row['survivor'], 'replica')
        self.assertFalse(row['survived'])
        self.assertTrue(any(p.startswith('split') for p in row['problems']), row['problems'])


    def test_a_cut_off_server_is_compared_only_where_its_replica_confirmed(self):
        # The server lost its replica and every worker (exit 6) at v4; the replica had confirmed
        # v3 and skipped v4 as a hole when promoted. v4 differs: reported, not failed. A
        # difference at a confirmed version still fails.
        exits = {'server': (6, 104.0), 'replica': (0, 110.0), 'worker1': (0, 109.0), 'worker2': (0, 109.0)}
        sv = {0: 'a', 1: 'b', 2: 'c', 3: 'd', 4: 'x'}
        rv = {0: 'a', 1: 'b', 2: 'c', 3: 'd', 4: 'y', 5: 'z'}
        run = make_run(kind='netem', target='0', exits=exits, promoted=int(60e9), server_versions=sv, replica_versions=rv)
        write(run, 'server.stats.json', json.dumps({'version': 4, 'replica_acked': 3}))
        write(run, 'replica.stats.json', json.dumps({'promoted_at_ns': int(60e9), 'version': 9}))
        row = fault_row.check(run)
        self.assertTrue(row['survived'], row)
        self.assertIn('server cut off at v4', row['outcome'])
        self.assertIn('never confirmed by the replica, differ (first v4)', row['equal'])
        write(run, 'server.stats.json', json.dumps({'version': 4, 'replica_acked': 4}))
        row = fault_row.check(run)
        self.assertFalse(row['survived'], row)
        self.assertIn('server and replica diverged', row['problems'])
        # Without a promoted replica, a cut-off server handed the job to nobody.
        run = make_run(kind='netem', target='0', exits=exits, server_versions=sv, replica_versions=sv)
        write(run, 'server.stats.json', json.dumps({'version': 4, 'replica_acked': 3}))
        self.assertFalse(fault_row.check(run)['survived'])

    def test_a_server_that_stepped_down_for_its_promoted_replica_is_one_final_model(self):
        # The same run, but the server exited 5: it stepped down when a worker reached the
        # replica, and handed the job on.
        exits = {'server': (5, 104.0), 'replica': (0, 110.0), 'worker1': (0, 109.0), 'worker2': (0, 109.0)}
        run = make_run(kind='link', target='2', exits=exits, promoted=int(60e9))
        write(run, 'server.stats.json', json.dumps({'version': 3}))
        write(run, 'replica.stats.json', json.dumps({'promoted_at_ns': int(60e9), 'version': 9}))
        row = fault_row.check(run)
        self.assertEqual(row['survivor'], 'replica')
        self.assertFalse(any(p.startswith('split') for p in row['problems']), row['problems'])
        self.assertIn('server stepped down at v3', row['outcome'])
        self.assertTrue(row['survived'], row)
        # Exit 5 without a promoted replica is no hand-over: a failure.
        run = make_run(kind='link', target='2', exits=exits)
        self.assertFalse(fault_row.check(run)['survived'])

    def test_a_restarted_worker_must_rejoin_and_both_its_lives_acknowledgements_count(self):
        # worker2 killed and started again: its first life's pushes in killed-worker2.pushes.csv,
        # the second's in worker2.pushes.csv; the server admitted it (peers_joined 1).
        exits = {'server': (0, 110.0), 'replica': (0, 110.0), 'worker1': (0, 109.0), 'worker2': (0, 109.5)}
        applied = [(1, 1, 0), (2, 2, 0), (3, 1, 1), (4, 2, 2)]
        pushes = {1: [(0, 1, 0), (1, 3, 0)], 2: [(2, 4, 0)]}
        run = make_run(kind='restart', target='worker2', exits=exits, applied=applied, pushes=pushes)
        write(run, 'killed-worker2.pushes.csv', 'step,computed_on,sequence,dropped,lost\n0,0,2,0,0\n')
        write(run, 'server.stats.json', json.dumps({'version': 4, 'peers_joined': 1}))
        write(run, 'fault.log', 'restarting worker2 from step 1\n')
        row = fault_row.check(run)
        self.assertTrue(row['survived'], row)
        self.assertIn('worker2 restarted from step 1', row['outcome'])
        self.assertEqual(row['lost_details']['acked'], 4)
        # The first life's acknowledged push missing from the server's log is lost.
        write(run, 'killed-worker2.pushes.csv', 'step,computed_on,sequence,dropped,lost\n0,0,2,0,0\n1,0,5,0,0\n')
        self.assertEqual(fault_row.check(run)['lost'], 1)
        # A restart the server never admitted is not membership.
        write(run, 'killed-worker2.pushes.csv', 'step,computed_on,sequence,dropped,lost\n0,0,2,0,0\n')
        write(run, 'server.stats.json', json.dumps({'version': 4, 'peers_joined': 0}))
        self.assertFalse(fault_row.check(run)['survived'])


if __name__ == '__main__':
    unittest.main()
