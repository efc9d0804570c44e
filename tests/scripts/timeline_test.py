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


if __name__ == '__main__':
    unittest.main()
