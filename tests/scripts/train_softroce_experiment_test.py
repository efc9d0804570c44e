#!/usr/bin/env python3
"""perf/train/train-softroce-experiment reads what a run wrote and reports it as the protocol
says: gradients to a target are the gradients summed into the model by the evaluation that
crossed it, the frozen targets sit below every mode's plateau, and the report's ratios come
from the sustained crossings of the seeds' curves, as do its link shares and what the straggler
costs.
  python3 tests/scripts/train_softroce_experiment_test.py"""
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # no __pycache__ next to the script
_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'perf', 'train',
                     'train-softroce-experiment')
_loader = importlib.machinery.SourceFileLoader('train_softroce_experiment', _PATH)
_spec = importlib.util.spec_from_loader('train_softroce_experiment', _loader)
tre = importlib.util.module_from_spec(_spec)
_loader.exec_module(tre)


def run(accuracies, every_s=0.25, per_version=1, bytes_per_update=1e6):
    curve = [{'t_ms': i * every_s * 1e3, 'version': i, 'accuracy': a, 'gradients': i * per_version}
             for i, a in enumerate(accuracies)]
    return {'curve': curve, 'summary': {'final_accuracy': accuracies[-1], 'best_accuracy': max(accuracies),
                                        'gradients_applied': len(accuracies) * per_version, 'dropped': 0,
                                        'seconds': len(accuracies) * every_s, 'applied': len(accuracies),
                                        'server_ingress_bytes': bytes_per_update * len(accuracies),
                                        'delay_median': 1.0, 'delay_max': 3}}


class ReadCurve(unittest.TestCase):
    def test_gradients_at_an_evaluation_are_those_of_the_last_sequence_it_holds(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, 'gradients.csv'), 'w') as f:
                # sequence 3 was a hole (skipped); sequence 4 summed 4 gradients in (an aggregate)
                f.write('sequence,gradients\n1,1\n2,2\n4,6\n5,7\n')
            with open(os.path.join(d, 'accuracy.csv'), 'w') as f:
                f.write('seconds,version,accuracy\n0,0,0.1\n0.25,2,0.4\n0.5,3,0.5\n0.75,5,0.6\n')
            curve = tre.read_curve(d)
        self.assertEqual([p['gradients'] for p in curve], [0, 2, 2, 7])
        self.assertEqual([p['t_ms'] for p in curve], [0, 250, 500, 750])
        self.assertEqual(curve[3]['accuracy'], 0.6)


class Targets(unittest.TestCase):
    def test_the_highest_target_is_below_the_lowest_plateau_by_the_margin(self):
        targets = tre.targets_from([0.80, 0.787, 0.81])
        self.assertEqual(targets, [0.67, 0.71, 0.75])  # 0.787 - 0.03 = 0.757, down to 0.75
        self.assertLess(max(targets), 0.787 - tre.TARGET_MARGIN + 1e-9)


class Report(unittest.TestCase):
    def test_ratios_come_from_the_sustained_crossings(self):
        frozen = {'case': 'straggler', 'modes': ['gradlane', 'fifo'], 'test_seeds': [1, 2, 3],
                  'tune_seeds': [101, 102, 103], 'tune_target': 0.72, 'targets': [0.5], 'commit': 'abc',
                  'dirty': False, 'command': 'x', 'lr': {'gradlane': 0.03, 'fifo': 0.01},
                  'tuning': {m: {'scores': {'0.03': {'median_ttt_ms': 1000.0, 'median_best': 0.8}},
                                 'widened': [], 'edge': None} for m in ('gradlane', 'fifo')}}
        # gradlane crosses 0.5 for good at 0.5 s on every seed; fifo blips at 0.25 s and
        # crosses for good at 1.0 s: the ratio fifo / gradlane is 2, not 1.
        gradlane = [run([0.1, 0.3, 0.5, 0.6, 0.7, 0.7]) for _ in range(3)]
        fifo = [run([0.1, 0.55, 0.3, 0.4, 0.5, 0.6, 0.6]) for _ in range(3)]
        text = tre.report(frozen, {'gradlane': gradlane, 'fifo': fifo}, 'cmd', tre.ROOT)
        self.assertIn('| gradlane | 0.5 [0.5–0.5] | 0.50 [0.50–0.50] | faster | — |', text)
        self.assertIn('| fifo | 1.0 [1.0–1.0] | reference | — | 2.00 [2.00–2.00] |', text)


class LinkUse(unittest.TestCase):
    def test_the_share_is_the_bytes_of_the_updates_by_the_crossing_over_the_time_times_the_rate(self):
        frozen = {'modes': ['fifo'], 'targets': [0.5]}
        # Crosses 0.5 for good at version 4, 1.0 s in (every 0.25 s): 4 updates of 62,500 bytes
        # in 1 s over 500,000 bytes/s is 50 %; two gradients per update: 31.25 kB each.
        fifo = [run([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.6], per_version=2, bytes_per_update=62_500)]
        lines = []
        tre.link_use(lines.append, frozen, {'fifo': fifo})
        self.assertIn('| fifo | 50 [50–50] % | 31.2 [31.2–31.2] |', lines)


class StragglerEffect(unittest.TestCase):
    def test_the_ratio_is_with_over_without_on_the_same_seeds(self):
        frozen = {'targets': [0.5]}
        slow = [run([0.1, 0.3, 0.4, 0.5, 0.6, 0.6]) for _ in range(3)]  # 0.75 s
        fast = [run([0.1, 0.5, 0.6, 0.6]) for _ in range(3)]  # 0.25 s
        lines = []
        tre.straggler_effect(lines.append, frozen, {'fifo': slow}, {'fifo': fast})
        self.assertIn('| fifo | 0.50 | 0.8 [0.8–0.8] | 0.2 [0.2–0.2] | 3.00 [3.00–3.00] |', lines)


if __name__ == '__main__':
    unittest.main()
