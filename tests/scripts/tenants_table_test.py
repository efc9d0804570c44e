#!/usr/bin/env python3
"""perf/train/tenants_table.py's figures can fail: job completion times are taken on one
clock (from the first job's start), speed-ups are per seed against fifo of that seed, a job
whose server stopped on an error makes its run count for nothing, a third job gets its own
columns, and gradlane against each baseline is baseline / gradlane over the seeds both ran.
  python3 tests/scripts/tenants_table_test.py"""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'perf', 'train'))
import tenants_table  # noqa: E402


def make_run(results, name, short, long, error='', medium=None):
    """short/long/medium: (start_unix, seconds) of each job's server (no medium: two jobs)."""
    for job, (start, seconds) in ((2, short), (1, long)) + (((3, medium),) if medium else ()):
        d = os.path.join(results, 'runs', name, f'job{job}')
        os.makedirs(d)
        with open(os.path.join(d, 'server.stats.json'), 'w') as f:
            json.dump({'start_unix': start, 'seconds': seconds, 'applied': 10, 'error': error if job == 2 else ''}, f)
        with open(os.path.join(d, 'worker1.json'), 'w') as f:
            json.dump({'steps': 10, 'dropped': 1 if job == 1 else 0}, f)


class TenantsTable(unittest.TestCase):
    def run_table(self, runs):
        self.results = tempfile.mkdtemp(prefix='tenants-table-test.')
        for run in runs:
            make_run(self.results, *run)
        sys.argv = ['tenants_table.py', self.results]
        tenants_table.main()
        with open(os.path.join(self.results, 'results.json')) as f:
            return json.load(f)

    def test_completion_times_share_one_clock_and_speedups_are_per_seed(self):
        got = self.run_table([
            # fifo seed 1: both start at 100; short ends at 116, long at 138.
            ('fifo-seed1', (100.0, 16.0), (100.0, 38.0), ''),
            # gradlane seed 1: the long job started 2 s before the short one.
            ('gradlane-seed1', (102.0, 8.0), (100.0, 40.0), ''),
            ('fifo-seed2', (200.0, 20.0), (200.0, 40.0), ''),
            ('gradlane-seed2', (200.0, 10.0), (200.0, 40.0), ''),
        ])
        g = got['gradlane']
        self.assertEqual(sorted(g['short_jct_s']), [10.0, 10.0])  # 102 + 8 - 100: on the long job's clock
        self.assertEqual(sorted(round(x, 3) for x in g['short_speedup']), [1.6, 2.0])
        self.assertEqual(sorted(round(x, 3) for x in g['long_speedup']), [0.95, 1.0])
        self.assertEqual(g['runs']['1']['short']['start_offset_s'], 2.0)
        self.assertEqual(g['runs']['1']['long']['dropped'], 1)

    def test_a_run_whose_server_failed_is_left_out(self):
        got = self.run_table([
            ('fifo-seed1', (100.0, 16.0), (100.0, 38.0), ''),
            ('gradlane-seed1', (100.0, 8.0), (100.0, 40.0), 'no gradlaned answers'),
            ('gradlane-seed2', (100.0, 9.0), (100.0, 40.0), ''),
        ])
        self.assertEqual(got['gradlane']['seeds'], [2])
        self.assertEqual(got['gradlane']['short_speedup'], [])  # no fifo of seed 2 to compare with

    def test_a_third_job_has_its_own_columns(self):
        got = self.run_table([
            ('fifo-seed1', (100.0, 20.0), (100.0, 40.0), '', (100.0, 30.0)),
            ('priority-seed1', (100.0, 10.0), (100.0, 44.0), '', (100.0, 20.0)),
        ])
        p = got['priority']
        self.assertEqual(p['medium_jct_s'], [20.0])
        self.assertEqual(p['medium_speedup'], [1.5])
        self.assertAlmostEqual(p['mean_jct_s'][0], (10 + 44 + 20) / 3)
        with open(os.path.join(self.results, 'results.md')) as f:
            md = f.read()
        self.assertIn('# Three jobs sharing hosts', md)
        self.assertIn('medium job JCT (s)', md)

    def test_gradlane_against_a_baseline_is_baseline_over_gradlane_on_the_seeds_both_ran(self):
        runs = []
        for seed, (fair_short, gradlane_short) in enumerate([(20.0, 10.0), (24.0, 12.0), (30.0, 10.0)], 1):
            runs.append((f'fair-seed{seed}', (100.0, fair_short), (100.0, 40.0), ''))
            runs.append((f'gradlane-seed{seed}', (100.0, gradlane_short), (100.0, 40.0), ''))
        runs.append(('fair-seed4', (100.0, 99.0), (100.0, 40.0), ''))  # gradlane has no seed 4
        got = self.run_table(runs)['fair']['gradlane_ratio']
        short = got['short']
        self.assertEqual(short['seeds'], 3)
        self.assertAlmostEqual(short['ratio'], 24.0 / 10.0)  # medians of seeds 1-3: 24 and 10
        # Every resample's ratio lies between the seeds' extremes: 20/12 and 30/10.
        self.assertGreaterEqual(short['low'], 20.0 / 12.0 - 1e-9)
        self.assertLessEqual(short['high'], 30.0 / 10.0 + 1e-9)
        self.assertLess(short['low'], short['ratio'])
        self.assertEqual(got['long']['ratio'], 1.0)
        self.assertEqual((got['long']['low'], got['long']['high']), (1.0, 1.0))

    def test_a_net_run_whose_packets_were_not_marked_by_job_is_left_out(self):
        classes = {
            'net-fair-seed1': 'class drr 10:1 root leaf 8002: quantum 1514b\n Sent 90000 bytes 60 pkt (dropped 0)\n'
                              'class drr 10:2 root leaf 8003: quantum 1514b\n Sent 30000 bytes 20 pkt (dropped 0)\n'
                              'class drr 10:99 root leaf 8001: quantum 1514b\n Sent 2000 bytes 9 pkt (dropped 0)\n',
            # The marks were lost: everything went to the class of unmarked packets.
            'net-fair-seed2': 'class drr 10:1 root leaf 8002: quantum 1514b\n Sent 0 bytes 0 pkt (dropped 0)\n'
                              'class drr 10:2 root leaf 8003: quantum 1514b\n Sent 0 bytes 0 pkt (dropped 0)\n'
                              'class drr 10:99 root leaf 8001: quantum 1514b\n Sent 120000 bytes 80 pkt (dropped 0)\n',
        }
        self.results = tempfile.mkdtemp(prefix='tenants-table-test.')
        for name, text in classes.items():
            make_run(self.results, name, (100.0, 12.0), (100.0, 40.0))
            with open(os.path.join(self.results, 'runs', name, 'classes-h1.txt'), 'w') as f:
                f.write(text)
        sys.argv = ['tenants_table.py', self.results]
        tenants_table.main()
        with open(os.path.join(self.results, 'results.json')) as f:
            self.assertEqual(json.load(f)['net-fair']['seeds'], [1])


if __name__ == '__main__':
    unittest.main()
