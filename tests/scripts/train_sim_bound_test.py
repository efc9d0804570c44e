#!/usr/bin/env python3
"""perf/sched/train-sim-bound prices a run's statistics on a free network: an asynchronous run's
gradients at the workers' compute rate, a barrier run's steps at the slowest compute it waits
for (backup: the (workers - b)-th; local modes: H draws per step).
  python3 tests/scripts/train_sim_bound_test.py"""
import importlib.machinery
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'perf', 'sched', 'train-sim-bound')
_loader = importlib.machinery.SourceFileLoader('train_sim_bound', _PATH)
tsb = importlib.util.module_from_spec(importlib.util.spec_from_loader('train_sim_bound', _loader))
_loader.exec_module(tsb)


def config(mode, **kw):
    c = {'mode': mode, 'workers': 10, 'compute_ms': 10.0, 'jitter': 0.0, 'local_steps': 4, 'backup_workers': 1}
    c.update(kw)
    return c


class ComputeOnlyBound(unittest.TestCase):
    def test_an_asynchronous_run_costs_its_gradients_at_the_workers_rate(self):
        # 10 workers x 1 gradient per 10 ms = 1 per ms: 5,000 gradients take 5,000 ms.
        self.assertEqual(tsb.bound_ms(config('gradlane'), {'gradients': 5000, 'updates': 4000}, random.Random(1), {}),
                         5000)

    def test_a_barrier_run_costs_its_steps_at_the_step_compute(self):
        reached = {'gradients': 0, 'updates': 7}
        self.assertAlmostEqual(tsb.bound_ms(config('sync'), reached, random.Random(1), {}), 70)
        self.assertAlmostEqual(tsb.bound_ms(config('local'), reached, random.Random(1), {}), 280)
        for mode in ('local-ring', 'local-ring-skip', 'local-tree', 'gradlane-local', 'gradlane-tree'):
            self.assertAlmostEqual(tsb.bound_ms(config(mode), reached, random.Random(1), {}), 280, msg=mode)

    def test_jitter_makes_a_step_wait_for_the_slowest_and_backup_for_fewer(self):
        reached = {'gradients': 0, 'updates': 1}
        sync = tsb.bound_ms(config('sync', jitter=0.2), reached, random.Random(1), {})
        backup = tsb.bound_ms(config('backup', jitter=0.2, backup_workers=5), reached, random.Random(1), {})
        self.assertGreater(sync, 10.5)  # the slowest of 10 draws in [8, 12]
        self.assertLessEqual(sync, 12)
        self.assertLess(backup, sync)

    def test_a_regime_name_may_hold_hyphens(self):
        self.assertEqual(tsb.regime_of('test-large-updates-gradlane-tree-lr0.3-s1-x.json'), 'large-updates')
        self.assertEqual(tsb.regime_of('test-overloaded-fifo-lr1-s1-x.json'), 'overloaded')

    def test_the_table_reads_the_runs_crossing(self):
        with tempfile.TemporaryDirectory() as d:
            curve = [{'t_ms': 100 * i, 'accuracy': a, 'gradients': 1000 * i, 'updates': i}
                     for i, a in enumerate([0.1, 0.75, 0.8, 0.8, 0.8, 0.8])]
            with open(os.path.join(d, 'test-overloaded-fifo-lr1-s1-x.json'), 'w') as f:
                json.dump({'config': config('fifo'), 'curve': curve}, f)
            out = subprocess.run([sys.executable, _PATH, '--runs', d], check=True, capture_output=True, text=True).stdout
            # 0.74 is crossed (sustained) at 100 ms with 1,000 gradients: a bound of 1,000 ms.
            self.assertIn('## overloaded, target 0.74', out)
            self.assertIn('| fifo | 1 | 100 | 1,000 | 0.10 |', out)
            self.assertIn('| fifo | 1 | 200 | 2,000 | 0.10 |', [l for l in out.split('## ') if l.startswith('overloaded, target 0.79')][0])


if __name__ == '__main__':
    unittest.main()
