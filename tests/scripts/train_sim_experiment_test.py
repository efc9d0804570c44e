#!/usr/bin/env python3
"""perf/sched/train-sim-experiment's statistics can fail: time to a target is the first
evaluation that the next two also stay at or above (a blip, or a crossing too near the end of a
run to be confirmed, is no crossing), and the ratio of medians comes with a paired bootstrap
95 % interval over the seeds (the same seeds drawn for both modes, reproducible, with the
2.5 / 97.5 percentiles of the resampled ratios).
  python3 tests/scripts/train_sim_experiment_test.py"""
import importlib.machinery
import importlib.util
import os
import sys
import unittest

sys.dont_write_bytecode = True  # no __pycache__ next to the script
_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'perf', 'sched', 'train-sim-experiment')
_loader = importlib.machinery.SourceFileLoader('train_sim_experiment', _PATH)
_spec = importlib.util.spec_from_loader('train_sim_experiment', _loader)
tse = importlib.util.module_from_spec(_spec)
_loader.exec_module(tse)


def curve(accuracies, every=100):
    return [{'t_ms': i * every, 'accuracy': a, 'gradients': 1000 * i, 'server_ingress_bytes': 10 * i}
            for i, a in enumerate(accuracies)]


class SustainedCrossing(unittest.TestCase):
    def test_a_blip_above_the_target_is_not_a_crossing(self):
        run = {'curve': curve([0.5, 0.8, 0.7, 0.79, 0.8, 0.81, 0.82, 0.6])}
        self.assertEqual(tse.sustained_crossing(run['curve'], 0.8), 4)
        self.assertEqual(tse.at_target(run, 0.8), 400)
        self.assertEqual(tse.at_target(run, 0.8, 'gradients'), 4000)

    def test_at_the_target_counts_as_reaching_it(self):
        self.assertEqual(tse.sustained_crossing(curve([0.1, 0.75, 0.75, 0.75]), 0.75), 1)

    def test_a_crossing_that_the_run_ends_before_confirming_is_not_reached(self):
        self.assertIsNone(tse.sustained_crossing(curve([0.1, 0.2, 0.9, 0.9]), 0.8))
        self.assertEqual(tse.sustained_crossing(curve([0.1, 0.9, 0.9, 0.9]), 0.8), 1)
        self.assertIsNone(tse.at_target({'curve': curve([0.1, 0.2, 0.3])}, 0.8))

    def test_a_dip_after_two_evaluations_does_not_undo_it(self):
        self.assertEqual(tse.sustained_crossing(curve([0.1, 0.8, 0.8, 0.8, 0.5]), 0.8), 1)


class RatioOfMedians(unittest.TestCase):
    def test_the_interval_is_the_percentiles_of_the_resampled_ratios(self):
        # Two seeds, reference 1 on both: a resample is {1,1} (ratio 1, p=1/4), {3,3} (3, 1/4) or
        # {1,3} (median 2, 1/2); the 2.5th percentile is 1 and the 97.5th is 3.
        point, lo, hi = tse.ratio_of_medians([1.0, 3.0], [1.0, 1.0])
        self.assertEqual(point, 2.0)
        self.assertEqual((lo, hi), (1.0, 3.0))

    def test_the_interval_is_95_percent(self):
        # Nine seeds 1..9 against 1: the resampled median is <= 1 with probability 0.0014, <= 2
        # with 0.030, <= 3 with 0.145, <= 7 with 0.970, <= 8 with 0.9986 (binomial): the 2.5 / 97.5
        # percentiles are 2 and 8 (a 90 % interval would be 3 and 7).
        self.assertEqual(tse.ratio_of_medians([float(x) for x in range(1, 10)], [1.0] * 9), (5.0, 2.0, 8.0))

    def test_seeds_are_paired(self):
        # Each seed of the mode is exactly twice that seed of the reference: any paired resample
        # has ratio 2; resampling the two independently would not.
        ref = [100.0, 300.0, 500.0, 900.0, 2000.0]
        point, lo, hi = tse.ratio_of_medians([2 * x for x in ref], ref)
        self.assertEqual((point, lo, hi), (2.0, 2.0, 2.0))

    def test_reproducible_and_uses_the_resample_count(self):
        a, b = [110.0, 90.0, 130.0, 100.0, 95.0], [100.0, 120.0, 80.0, 105.0, 140.0]
        first = tse.ratio_of_medians(a, b)
        self.assertEqual(first, tse.ratio_of_medians(a, b))
        point, lo, hi = first
        self.assertAlmostEqual(point, 100.0 / 105.0)
        self.assertLess(lo, point)
        self.assertGreater(hi, point)
        # a different number of resamples (or RNG seed) gives a (slightly) different interval
        self.assertNotEqual(first, tse.ratio_of_medians(a, b, resamples=37))

    def test_a_seed_that_does_not_reach_the_target_counts_as_never(self):
        point, lo, hi = tse.ratio_of_medians([100.0, None, None], [100.0, 100.0, 100.0])
        self.assertEqual(point, float('inf'))
        point, lo, hi = tse.ratio_of_medians([100.0, 100.0, None], [100.0, 100.0, 100.0])
        self.assertEqual(point, 1.0)
        self.assertEqual(hi, float('inf'))

    def test_percentile_interpolates_between_ranks(self):
        self.assertEqual(tse.percentile([0.0, 10.0], 0.25), 2.5)
        self.assertEqual(tse.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5), 3.0)


class Widening(unittest.TestCase):
    def test_the_next_half_decade_beyond_an_edge(self):
        self.assertEqual(tse.widen(1e-5, 3e-5, up=False), 3e-6)
        self.assertEqual(tse.widen(3e-5, 1e-4, up=False), 1e-5)
        self.assertEqual(tse.widen(1.0, 0.3, up=True), 3.0)
        self.assertEqual(tse.widen(0.3, 0.1, up=True), 1.0)


if __name__ == '__main__':
    unittest.main()
