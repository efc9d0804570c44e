#!/usr/bin/env python3
"""tests/faults/inject-fault.sh injects a fault at a version of the server, not at a time: a fake
job (a server whose versions.csv grows, a worker that is a sleep) is killed only once the
server wrote the version named, and a version never reached injects the fault anyway after
AT_WITHIN_S, saying so in fault.json.
  python3 tests/scripts/inject_fault_test.py"""
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
INJECT = os.path.join(ROOT, 'tests', 'faults', 'inject-fault.sh')


class FakeJob:
    """A training job as train-job.sh lays it out: snapshots.bin (training started), the
    server's versions.csv, and worker1 running (worker1.pid; worker1.exit once it ends)."""

    def __init__(self):
        self.out = tempfile.mkdtemp(prefix='train-fault-trigger.')
        with open(os.path.join(self.out, 'snapshots.bin'), 'wb') as f:
            f.write(b'\0' * 8)
        self.versions = os.path.join(self.out, 'server.versions.csv')
        self.add_versions(1, 5)
        self.worker = subprocess.Popen(
            ['sh', '-c', 'sleep 60 & echo $! > "$0/worker1.pid"; wait $!; echo "$? 0" > "$0/worker1.exit"', self.out])
        while not os.path.exists(os.path.join(self.out, 'worker1.pid')):
            time.sleep(0.01)

    def add_versions(self, first, last):
        with open(self.versions, 'a') as f:
            for v in range(first, last + 1):
                f.write(f'{v},{v:016x}\n')

    def inject(self, fault, **env):
        done = subprocess.run(['sh', INJECT, self.out, fault], capture_output=True, text=True, timeout=60,
                              env={**os.environ, 'HANG_S': '5', **env})
        with open(os.path.join(self.out, 'fault.json')) as f:
            return json.load(f), done.stdout + done.stderr

    def close(self):
        self.worker.kill()
        self.worker.wait()
        shutil.rmtree(self.out)


class TrainFaultTrigger(unittest.TestCase):
    def setUp(self):
        self.job = FakeJob()

    def tearDown(self):
        self.job.close()

    def test_the_fault_waits_for_the_version_named(self):
        reached = {}

        def grow():
            for v in range(6, 13):
                time.sleep(0.1)
                if v == 10:
                    reached['at'] = time.time()
                self.job.add_versions(v, v)

        grower = threading.Thread(target=grow)
        grower.start()
        fault, said = self.job.inject('kill:worker1:v10')
        grower.join()
        self.assertEqual(fault['at_version'], 10, said)
        self.assertEqual(fault['trigger'], 'reached', said)
        self.assertIsNone(fault['delay_ms'])
        self.assertGreaterEqual(fault['version_at_injection'], 10, said)
        self.assertGreaterEqual(fault['injected'], reached['at'], 'injected before the server reached v10')
        self.assertEqual(fault['hung'], [], said)

    def test_a_version_never_reached_injects_after_the_bound_and_says_so(self):
        started = time.time()
        fault, said = self.job.inject('kill:worker1:v99', AT_WITHIN_S='1')
        self.assertEqual(fault['trigger'], 'timeout', said)
        self.assertEqual(fault['version_at_injection'], 5, said)
        self.assertLess(fault['injected'] - started, 10, said)


if __name__ == '__main__':
    unittest.main()
