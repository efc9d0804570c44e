"""The Python package over rxe: a server, its replica and a worker on three emulated hosts
(threads of this interpreter: blocking calls release the GIL), and the errors a user meets first.
Run by run_tests.py inside ci/softroce.sh --hosts 3 (GRADLANE_HOSTS)."""
import base64
import concurrent.futures
import os
import re
import subprocess
import tempfile
import time
import unittest
import urllib.request

import numpy as np

import gradlane

from emulated_hosts import hosts

FLOATS = 4096
STEPS = 12
LR = 0.05


# The job's key, as a launcher gives every process of the job (run_tests.py runs each case on
# its own, without module fixtures: hence here).
if not (os.environ.get("GRADLANE_JOB_KEY") or os.environ.get("GRADLANE_JOB_KEY_FILE")):
    os.environ["GRADLANE_JOB_KEY"] = base64.b64encode(os.urandom(24)).decode()


def sample(text, name):
    """The value of the sample written exactly `name` (labels included) in Prometheus' text format."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line[len(name) + 1:])
    raise AssertionError(f"no {name} in the metrics:\n{text}")


def gradient_of(step):
    """A different gradient each step, so an update applied twice, out of order or not at all shows."""
    return (np.arange(FLOATS, dtype=np.float32) % 7 - 3 + step) / np.float32(8)


class ShardRun(unittest.TestCase):
    def test_a_gradient_written_through_the_numpy_view_is_what_server_and_replica_apply(self):
        (dev0, addr0), (dev1, addr1), (dev2, _) = hosts()[:3]
        initial = np.linspace(-1, 1, FLOATS, dtype=np.float32)
        server = gradlane.ShardServer(gradlane.Device.open(dev0), "server", 7910, FLOATS, learning_rate=LR,
                                      initial=initial)
        replica = gradlane.ShardServer(gradlane.Device.open(dev1), "replica", 7911, FLOATS, learning_rate=LR,
                                       initial=initial)
        exporter = gradlane.MetricsExporter("127.0.0.1:0")
        server_metrics, worker_metrics = gradlane.ServerMetrics("server", FLOATS * 4), gradlane.WorkerMetrics(1)
        exporter.add(server_metrics)
        exporter.add(worker_metrics)

        def run_replica():
            replica.accept_peers(1, timeout=60)
            return replica.run_until(STEPS, timeout=60)

        def run_server():
            server.connect_replica(f"{addr1}:7911", timeout=30)
            server.accept_peers(1, timeout=60)
            reached = server.run_until(STEPS, timeout=60)
            server_metrics.update(server)
            return reached

        def run_worker():
            worker = gradlane.Worker(gradlane.Device.open(dev2), server=f"{addr0}:7910", floats=FLOATS,
                                     replica=f"{addr1}:7911")
            buffer = worker.gradient.__array_interface__["data"][0]
            sequences = []
            for step in range(STEPS):
                pulled = worker.pull()
                worker.gradient[:] = gradient_of(step)  # into registered memory: nothing copies it
                started = time.monotonic()
                pushed = worker.push(computed_on=pulled.version, tag=step)
                worker_metrics.record(pushed, time.monotonic() - started)
                sequences.append(pushed.sequence)
            # A push returns once its write landed; the server applies it after. So the model
            # reaches version STEPS some time after the last push: pull until it does.
            deadline = time.monotonic() + 30
            last = worker.pull()
            while last.version < STEPS and time.monotonic() < deadline:
                time.sleep(0.01)
                last = worker.pull()
            return worker, buffer, sequences, last.version

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            replica_run, server_run = pool.submit(run_replica), pool.submit(run_server)
            worker, buffer, sequences, last_version = pool.submit(run_worker).result(timeout=120)
            self.assertTrue(server_run.result(timeout=120))
            self.assertTrue(replica_run.result(timeout=120))

        self.assertEqual(sequences, list(range(1, STEPS + 1)))
        self.assertEqual(worker.gradient.__array_interface__["data"][0], buffer, "the view moved: not the buffer")
        expected = initial.copy()
        for step in range(STEPS):
            expected -= np.float32(LR) * gradient_of(step)
        np.testing.assert_allclose(server.model, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(replica.model, server.model)
        self.assertEqual(last_version, STEPS)
        np.testing.assert_array_equal(worker.model, server.model)  # what the last pull read
        self.assertEqual(server.stats.applied, STEPS)
        self.assertEqual(server.version, STEPS)
        with self.assertRaises(ValueError):  # the model views are read-only
            server.model[0] = 1.0
        # The metrics over HTTP, as Prometheus scrapes them: the run's own counts.
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        self.assertEqual(sample(text, 'gradlane_server_updates_total{outcome="applied",role="server"}'),
                         server.stats.applied)
        self.assertEqual(sample(text, 'gradlane_server_applied_bytes_total{role="server"}'), STEPS * FLOATS * 4)
        self.assertEqual(sample(text, 'gradlane_server_worker_updates_total{role="server",worker="1"}'), STEPS)
        self.assertEqual(sample(text, 'gradlane_worker_pushes_total{outcome="acknowledged",worker="1"}'), STEPS)
        self.assertEqual(sample(text, 'gradlane_worker_push_seconds_count{worker="1"}'), STEPS)
        self.assertEqual(sample(text, 'gradlane_server_staleness_count{role="server"}'), STEPS)


class WithGradlaned(unittest.TestCase):
    """Sidecar mode: the host's gradlaned (one serves every emulated host: they share the VM's
    /dev/shm) owns the shard's sequence and grants each push."""

    def test_every_push_is_granted_by_gradlaned_and_applied_in_its_order(self):
        (dev0, addr0), _, (dev2, _) = hosts()[:3]
        shm = f"/gradlane-python-test-{os.getpid()}"
        log = tempfile.NamedTemporaryFile(prefix="gradlaned-", suffix=".err", delete=False)
        schedule = tempfile.NamedTemporaryFile(prefix="gradlaned-", suffix=".schedule", delete=False).name
        daemon = subprocess.Popen([os.environ["GRADLANE_GRADLANED"], "--foreground", "--shm-name", shm,
                                   "--schedule-log", schedule], stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + 60
            while "gradlaned: serving" not in open(log.name).read():
                self.assertIsNone(daemon.poll(), open(log.name).read())
                self.assertLess(time.monotonic(), deadline, "gradlaned did not start serving in 60 s")
                time.sleep(0.05)
            initial = np.zeros(FLOATS, dtype=np.float32)
            server = gradlane.ShardServer(gradlane.Device.open(dev0), "server", 7912, FLOATS, learning_rate=LR,
                                          initial=initial, sidecar=shm, endpoint=0)

            def run_server():
                server.accept_peers(1, timeout=60)
                return server.run_until(STEPS, timeout=60)

            def run_worker():
                worker = gradlane.Worker(gradlane.Device.open(dev2), server=f"{addr0}:7912", floats=FLOATS,
                                         sidecar=shm, endpoint=2, server_endpoint=0)
                results = []
                for step in range(STEPS):
                    pulled = worker.pull()
                    worker.gradient[:] = gradient_of(step)
                    results.append(worker.push(computed_on=pulled.version, tag=step))
                worker.settle(10)
                return results

            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                server_run = pool.submit(run_server)
                results = pool.submit(run_worker).result(timeout=120)
                self.assertTrue(server_run.result(timeout=120))
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
        said = open(log.name).read()
        os.unlink(log.name)
        self.assertEqual([r.sequence for r in results], list(range(1, STEPS + 1)))
        self.assertFalse(any(r.dropped or r.lost for r in results))
        expected = initial.copy()
        for step in range(STEPS):
            expected -= np.float32(LR) * gradient_of(step)
        np.testing.assert_allclose(server.model, expected, rtol=1e-5, atol=1e-6)
        # The daemon's closing line counts what it was asked: every push went through it.
        requests = re.search(r"(\d+) requests", said)
        self.assertIsNotNone(requests, said)
        self.assertGreaterEqual(int(requests.group(1)), STEPS, said)
        # Its schedule log, drawn as a timeline: each push's request, grant, write, and the applies.
        from gradlane import timeline
        events, summary = timeline.trace_events([("host", timeline.read_log(schedule))])
        os.unlink(schedule)
        self.assertEqual(summary["host"], {"requests": STEPS, "grants": STEPS, "writes": STEPS, "drops": 0,
                                           "applied_through": STEPS})
        waits = [e for e in events if e["name"] == "wait"]
        writes = [e for e in events if e["name"].startswith("write seq")]
        self.assertEqual(len(waits), STEPS)
        for wait, write in zip(waits, sorted(writes, key=lambda e: e["ts"])):
            self.assertLessEqual(wait["ts"] + wait["dur"], write["ts"] + 1, "a push writes after its grant")


class Errors(unittest.TestCase):
    def test_an_unknown_device_is_a_gradlane_error_naming_the_devices_there(self):
        first = hosts()[0][0]
        with self.assertRaises(gradlane.Error) as raised:
            gradlane.Device.open("no-such-rdma-device")
        self.assertEqual(raised.exception.code, "device_not_found")
        self.assertIn(first, str(raised.exception))

    def test_a_server_address_without_a_port_is_refused_before_connecting(self):
        with self.assertRaises(gradlane.Error) as raised:
            gradlane.Worker(gradlane.Device.open(hosts()[2][0]), server="198.18.0.10", floats=FLOATS)
        self.assertEqual(raised.exception.code, "invalid_argument")
        self.assertIn("ADDRESS:PORT", str(raised.exception))

    def test_an_initial_model_of_another_size_is_refused(self):
        with self.assertRaises(gradlane.Error) as raised:
            gradlane.ShardServer(gradlane.Device.open(hosts()[0][0]), "server", 0, FLOATS,
                                 initial=np.zeros(FLOATS - 1, dtype=np.float32))
        self.assertEqual(raised.exception.code, "invalid_argument")
        self.assertIn(str(FLOATS), str(raised.exception))

    def test_a_worker_of_another_tensor_is_refused_before_it_writes_and_one_of_the_same_pushes(self):
        (dev0, addr0), _, (dev2, _) = hosts()[:3]
        server = gradlane.ShardServer(gradlane.Device.open(dev0), "server", 7915, FLOATS, learning_rate=LR, tensor=3)
        device = gradlane.Device.open(dev2)

        def run_server():
            server.accept_peers(1, timeout=60)
            return server.run_until(1, timeout=60)

        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            served = pool.submit(run_server)
            with self.assertRaises(gradlane.Error) as raised:
                gradlane.Worker(device, server=f"{addr0}:7915", floats=FLOATS)  # tensor 0
            self.assertEqual(raised.exception.code, "invalid_argument")
            self.assertIn("holds tensor 3, this worker pushes tensor 0", str(raised.exception))
            worker = gradlane.Worker(device, server=f"{addr0}:7915", floats=FLOATS, tensor=3)
            pulled = worker.pull()
            worker.gradient[:] = 1.0
            self.assertFalse(worker.push(computed_on=pulled.version).dropped)
            served.result(timeout=90)
        self.assertEqual(server.version, 1)  # the refused worker wrote nothing
        self.assertTrue(np.all(server.model == np.float32(-LR)))

    def test_no_gradlaned_on_the_host_is_said_and_the_server_loses_nothing(self):
        # A worker in gradlane mode whose host runs no gradlaned: a clear error within the attach
        # timeout, naming what to start; the server it reached serves the next worker as if
        # nothing had happened.
        (dev0, addr0), _, (dev2, _) = hosts()[:3]
        server = gradlane.ShardServer(gradlane.Device.open(dev0), "server", 7916, FLOATS, learning_rate=LR)
        device = gradlane.Device.open(dev2)

        def run_server():
            server.accept_peers(2, timeout=60)  # the one that gave up joined before it attached
            return server.run_until(1, timeout=60)

        os.environ["GRADLANE_SIDECAR_TIMEOUT_MS"] = "1000"
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                served = pool.submit(run_server)
                started = time.monotonic()
                with self.assertRaises(gradlane.Error) as raised:
                    gradlane.Worker(device, server=f"{addr0}:7916", floats=FLOATS, sidecar="/gradlane-nobody-serves-this",
                                    endpoint=102)
                self.assertLess(time.monotonic() - started, 10)
                self.assertEqual(raised.exception.code, "sidecar_unavailable")
                self.assertIn("gradlaned", str(raised.exception))
                self.assertIn("/gradlane-nobody-serves-this", str(raised.exception))
                worker = gradlane.Worker(device, server=f"{addr0}:7916", floats=FLOATS, id=2)
                worker.gradient[:] = 1.0
                self.assertFalse(worker.push(computed_on=worker.pull().version).dropped)
                self.assertTrue(served.result(timeout=90))
        finally:
            del os.environ["GRADLANE_SIDECAR_TIMEOUT_MS"]
        self.assertEqual(server.version, 1)
        self.assertTrue(np.all(server.model == np.float32(-LR)))

    def test_nobody_listening_is_a_timeout_not_a_hang(self):
        _, addr0 = hosts()[0]
        device = gradlane.Device.open(hosts()[2][0])
        started = time.monotonic()
        with self.assertRaises(gradlane.Error) as raised:
            gradlane.Worker(device, server=f"{addr0}:7919", floats=FLOATS, timeout=2)
        self.assertLess(time.monotonic() - started, 10)
        self.assertIn(raised.exception.code, ("timeout", "connection_rejected", "unreachable"))


if __name__ == "__main__":
    unittest.main()
