#!/usr/bin/env python3
"""examples/pytorch/compare.py's report of where worker 1's time went: per kind the median of
each part over the test runs of its frozen learning rate, and the network's share of the total;
runs of another learning rate, of the validation split, or from before the breakdown was
recorded are left out.
  python3 tests/scripts/pytorch_compare_test.py"""
import importlib.util
import os
import sys
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
sys.path.insert(0, os.path.join(ROOT, 'perf'))
SPEC = importlib.util.spec_from_file_location('compare', os.path.join(ROOT, 'examples', 'pytorch', 'compare.py'))
compare = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(compare)


def run(kind, seconds, lr=0.1, split='test', cpu=None):
    record = {'kind': kind, 'lr': lr, 'split': split, 'seed': 1, 'curve': [], 'seconds': seconds}
    if cpu is not None:
        record['gradlaned_cpu_s'] = cpu
    return record


def spent(compute, push, pull, evaluate):
    return {'compute': compute, 'push': push, 'pull': pull, 'evaluate': evaluate,
            'total': compute + push + pull + evaluate}


class TimeBreakdown(unittest.TestCase):
    FROZEN = {'lrs': {'gradlane-fifo': 0.1, 'gradlane-packed': 0.1}}

    def rows(self, runs):
        text = compare.time_breakdown(runs, self.FROZEN)
        return {line.split(' | ')[0].strip('| '): line.split(' | ')[1:] for line in text.splitlines()
                if line.startswith('| gradlane')}

    def test_each_part_is_the_median_over_the_kinds_test_runs(self):
        runs = [run('gradlane-fifo', spent(10, 1, 2, 7)), run('gradlane-fifo', spent(40, 6, 4, 3)),
                run('gradlane-fifo', spent(20, 2, 3, 5))]
        row = self.rows(runs)['gradlane-fifo']
        self.assertEqual(row[:6], ['3', '20.0', '2.0', '3.0', '5.0', '30.0'])
        # push + pull over the total per run: 15 %, 18.9 %, 16.7 %; the median is 16.7 %.
        self.assertEqual(row[6], '17%')
        self.assertEqual(row[7], '— |')  # no gradlaned in these runs

    def test_the_gradlaneds_cpu_time_is_the_median_of_the_runs_that_measured_it(self):
        runs = [run('gradlane-packed', spent(10, 1, 2, 7), cpu=1.0), run('gradlane-packed', spent(10, 1, 2, 7), cpu=9.0),
                run('gradlane-packed', spent(10, 1, 2, 7), cpu=2.0), run('gradlane-packed', spent(10, 1, 2, 7))]
        self.assertEqual(self.rows(runs)['gradlane-packed'][7], '2.0 |')

    def test_runs_of_another_lr_split_or_without_a_breakdown_are_left_out(self):
        runs = [run('gradlane-packed', spent(10, 5, 5, 0)),
                run('gradlane-packed', spent(99, 99, 99, 99), lr=0.3),
                run('gradlane-packed', spent(99, 99, 99, 99), split='validation'),
                run('gradlane-packed', None), run('gradlane-packed', {'compute': 99, 'total': 99})]
        row = self.rows(runs)['gradlane-packed']
        self.assertEqual(row[:6], ['1', '10.0', '5.0', '5.0', '0.0', '20.0'])
        self.assertEqual(row[6], '50%')
        self.assertNotIn('gradlane-fifo', self.rows(runs))

    def test_no_table_without_a_breakdown(self):
        self.assertEqual(compare.time_breakdown([run('gradlane-fifo', None)], self.FROZEN), '')


if __name__ == '__main__':
    unittest.main()
