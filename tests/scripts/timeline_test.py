#!/usr/bin/env python3
"""python3 -m gradlane.timeline (python/gradlane/timeline.py) turns a gradlaned schedule log into
Chrome-trace events: each push's wait from request to grant and its write, drops, applies, and
lane names; a line that is not the log's is refused naming its file and line.
  python3 tests/scripts/timeline_test.py"""
import importlib.util
import json
import os
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
SPEC = importlib.util.spec_from_file_location('timeline', os.path.join(ROOT, 'python', 'gradlane', 'timeline.py'))
timeline = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(timeline)

MS = 1_000_000  # ns
# Worker endpoint 101 pushes twice to receiver 0: the first is granted 2 ms after its request and
# written in 3 ms, the second dropped as stale; the server acknowledges sequence 1.
LOG = [
    {'at': 10 * MS, 'origin': 'here', 'kind': 'request', 'request': 1, 'job': 1, 'tensor': 0, 'sender': 101,
     'receiver': 0, 'bytes': 4096, 'computed_on': 0},
    {'at': 12 * MS, 'origin': 'here', 'kind': 'go', 'transfer': 7, 'request': 1, 'part': 0, 'parts': 1, 'job': 1,
     'tensor': 0, 'sender': 101, 'receiver': 0, 'bytes': 4096, 'seq': 1, 'delay': 0, 'slot_start': 12 * MS,
     'slot_end': 14 * MS},
    {'at': 15 * MS, 'origin': 'here', 'kind': 'completion', 'transfer': 7, 'ok': True, 'sender': 101, 'receiver': 0,
     'seq': 1, 'bytes': 4096, 'measured_ns': 3 * MS, 'slot_start': 12 * MS, 'slot_end': 14 * MS,
     'used_end': 15 * MS},
    {'at': 16 * MS, 'origin': 'here', 'kind': 'applied', 'receiver': 0, 'seq': 1},
    {'at': 20 * MS, 'origin': 'here', 'kind': 'request', 'request': 2, 'job': 1, 'tensor': 0, 'sender': 101,
     'receiver': 0, 'bytes': 4096, 'computed_on': 0},
    {'at': 21 * MS, 'origin': 'here', 'kind': 'drop', 'reason': 'stale', 'request': 2, 'part': 0, 'parts': 1,
     'job': 1, 'sender': 101, 'receiver': 0, 'offset': 0, 'bytes': 4096, 'delay': 9},
]


def write_log(rows, extra=''):
    f = tempfile.NamedTemporaryFile('w', suffix='.log', delete=False)
    f.write(''.join(json.dumps(r) + '\n' for r in rows) + extra)
    f.close()
    return f.name


class Timeline(unittest.TestCase):
    def setUp(self):
        self.events, self.summary = timeline.trace_events([('a', timeline.read_log(write_log(LOG)))])

    def named(self, name):
        return [e for e in self.events if e['name'] == name]

    def test_a_push_waits_from_its_request_to_its_grant_then_writes_for_its_measured_time(self):
        waits = self.named('wait')
        self.assertEqual([(w['ts'], w['dur']) for w in waits], [(0.0, 2000.0), (10000.0, 1000.0)])
        write, = self.named('write seq 1')
        self.assertEqual((write['ts'], write['dur']), (2000.0, 3000.0))  # 15 ms - 3 ms, from 10 ms
        self.assertEqual(write['tid'], waits[0]['tid'], 'the write is on the sender lane of its wait')

    def test_a_drop_and_an_apply_are_marked_where_they_happened(self):
        dropped, = self.named('dropped: stale')
        self.assertEqual(dropped['ts'], 11000.0)
        applied, = self.named('applied through 1')
        self.assertEqual(applied['ts'], 6000.0)
        self.assertEqual(self.summary['a'], {'requests': 2, 'grants': 1, 'writes': 1, 'drops': 1,
                                             'applied_through': 1})

    def test_a_senders_time_splits_into_waits_writes_and_the_gaps_between(self):
        b, = timeline.sender_breakdown(self.events).values()
        # Waits 2 ms + 1 ms (the drop), one 3 ms write ending at 15 ms, the next request at 20 ms;
        # from the first request at 10 ms to the drop at 21 ms.
        self.assertEqual(b, {'pushes': 1, 'wait_s': 0.003, 'wait_median_ms': 2.0, 'wait_p90_ms': 2.0,
                             'write_s': 0.003, 'between_s': 0.005, 'span_s': 0.011})
        self.assertEqual(list(timeline.sender_breakdown(self.events)), [('gradlaned a', 101)])

    def test_lanes_are_named_by_endpoint_and_role(self):
        names = sorted(e['args']['name'] for e in self.named('thread_name'))
        self.assertEqual(names, ['endpoint 0 applies', 'endpoint 101 planned slots', 'endpoint 101 pushes'])

    def test_the_command_writes_a_trace_chrome_reads(self):
        out = tempfile.NamedTemporaryFile(suffix='.json', delete=False).name
        self.assertEqual(timeline.main([write_log(LOG), '-o', out]), 0)
        with open(out, encoding='utf-8') as f:
            trace = json.load(f)
        self.assertEqual(len(trace['traceEvents']), len(self.events))
        for e in trace['traceEvents']:
            self.assertIn(e['ph'], ('X', 'i', 'C', 'M'))

    def test_a_line_that_is_not_the_logs_is_refused_naming_its_file_and_line(self):
        path = write_log(LOG[:2], extra='not json\n')
        with self.assertRaisesRegex(timeline.LogError, f'{path}:3: not a JSON line'):
            timeline.read_log(path)
        with self.assertRaisesRegex(timeline.LogError, 'hold no line'):
            timeline.trace_events([('empty', [])])


# The server's applied log of the same run: worker 1's sequence 1 rang at 14.5 ms, waited 0.2 ms
# and was applied from 14.7 to 15.2 ms; sequence 2 was skipped at 16.5 ms; worker 2's sequence 3
# rang at 16 ms and waited 1 ms, behind the skip.
APPLIED = ('sequence,worker,step,computed_on,skipped,doorbell_ns,apply_start_ns,apply_end_ns\n'
           f'1,1,0,0,0,{14_500_000},{14_700_000},{15_200_000}\n'
           f'2,0,0,0,1,0,0,{16_500_000}\n'
           f'3,2,4,0,0,{16 * MS},{17 * MS},{17_400_000}\n')


def write_applied(text):
    f = tempfile.NamedTemporaryFile('w', suffix='.csv', delete=False)
    f.write(text)
    f.close()
    return f.name


class AppliedLog(unittest.TestCase):
    def setUp(self):
        self.events, self.summary = timeline.trace_events(
            [('a', timeline.read_log(write_log(LOG)))], [('s', timeline.read_applied(write_applied(APPLIED)))])

    def test_each_update_waits_at_the_server_from_its_doorbell_then_is_applied_on_its_workers_lane(self):
        queued = [e for e in self.events if e['name'] == 'queued']
        applies = [e for e in self.events if e['name'].startswith('apply seq')]
        # Times from the first line of all logs (the request at 10 ms).
        self.assertEqual([(e['ts'], e['dur'], e['args']['seq']) for e in queued],
                         [(4500.0, 200.0, 1), (6000.0, 1000.0, 3)])
        self.assertEqual([(e['name'], e['ts'], e['dur']) for e in applies],
                         [('apply seq 1', 4700.0, 500.0), ('apply seq 3', 7000.0, 400.0)])
        self.assertEqual([e['tid'] for e in queued], [e['tid'] for e in applies])
        self.assertNotEqual(applies[0]['tid'], applies[1]['tid'], 'workers 1 and 2 each have their lane')
        lanes = {e['tid']: e['args']['name'] for e in self.events if e['name'] == 'thread_name' and e['pid'] == 2}
        self.assertEqual(lanes[applies[0]['tid']], 'worker 1 at the server')
        self.assertEqual(self.summary['s'], {'applies': 2, 'skipped': 1})
        skipped, = [e for e in self.events if e['name'] == 'skipped seq 2']
        self.assertEqual((skipped['pid'], skipped['ts']), (2, 6500.0))
        self.assertEqual(lanes[skipped['tid']], 'skipped sequences')

    def test_a_log_without_apply_times_or_with_a_bad_row_is_refused_naming_it(self):
        old = write_applied('sequence,worker,step,computed_on,skipped\n1,1,0,0,0\n')
        with self.assertRaisesRegex(timeline.LogError, f'{old}: no column doorbell_ns'):
            timeline.read_applied(old)
        bad = write_applied(APPLIED + '4,1,x,0,0,1,2,3\n')
        with self.assertRaisesRegex(timeline.LogError, f'{bad}:5: a row whose'):
            timeline.read_applied(bad)

    def test_the_command_takes_an_applied_log_alone(self):
        out = tempfile.NamedTemporaryFile(suffix='.json', delete=False).name
        self.assertEqual(timeline.main(['--applied', write_applied(APPLIED), '-o', out]), 0)
        with open(out, encoding='utf-8') as f:
            names = [e['name'] for e in json.load(f)['traceEvents']]
        self.assertIn('apply seq 3', names)


if __name__ == '__main__':
    unittest.main()
