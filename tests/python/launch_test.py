"""gradlane.launch: the launchers' environments read into ranks and roles, and what is missing
said as a gradlane.Error. Pure Python; run with the package's other tests."""
import os
import socket
import subprocess
import sys
import tempfile
import unittest

import gradlane
from gradlane import launch


class FromEnv(unittest.TestCase):
    def test_torchrun_ranks_become_server_replica_and_workers(self):
        roles = []
        for rank in range(4):
            job = launch.from_env({"RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "10.0.0.1",
                                   "MASTER_PORT": "29500"})
            roles.append((job.role, job.worker_id))
        self.assertEqual(roles, [("server", 0), ("replica", 0), ("worker", 1), ("worker", 2)])
        self.assertEqual((job.launcher, job.workers, job.master_port), ("torchrun", 2, 29500))

    def test_without_a_replica_rank_1_is_the_first_worker(self):
        job = launch.from_env({"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "h0", "GRADLANE_REPLICA": "0"})
        self.assertEqual((job.role, job.worker_id, job.workers), ("worker", 1, 2))
        two = launch.from_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h0"})  # too few for a replica
        self.assertEqual((two.role, two.replica, two.master_port), ("worker", False, launch.DEFAULT_PORT))

    def test_open_mpi_and_slurm_are_read_too(self):
        mpi = launch.from_env({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3",
                               "OMPI_COMM_WORLD_LOCAL_RANK": "1", "MASTER_ADDR": "h0"})
        self.assertEqual((mpi.launcher, mpi.rank, mpi.local_rank, mpi.role), ("Open MPI", 2, 1, "worker"))
        slurm = launch.from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0",
                                 "GRADLANE_MASTER_ADDR": "node1"})
        self.assertEqual((slurm.launcher, slurm.role, slurm.master_addr), ("Slurm", "server", "node1"))

    def test_what_is_missing_is_said(self):
        cases = [({}, "no launcher environment"),
                 ({"RANK": "0", "WORLD_SIZE": "3"}, "MASTER_ADDR"),
                 ({"RANK": "3", "WORLD_SIZE": "3", "MASTER_ADDR": "h"}, "outside 0..2"),
                 ({"RANK": "0", "WORLD_SIZE": "x", "MASTER_ADDR": "h"}, "not an integer"),
                 ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h"}, "at least one worker")]
        for env, said in cases:
            with self.assertRaises(gradlane.Error) as raised:
                launch.from_env(env)
            self.assertIn(said, str(raised.exception))
            self.assertEqual(raised.exception.code, "invalid_argument")

    def test_a_rendezvous_directory_stands_for_master_addr(self):
        job = launch.from_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3",
                               "GRADLANE_RENDEZVOUS": "file:/shared/job-7"})
        self.assertEqual((job.launcher, job.role, job.master_addr), ("Open MPI", "replica", ""))


def a_dead_pid():
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


class ClaimRank(unittest.TestCase):
    """A rank launched twice: the second process is refused before it connects anywhere."""

    def check(self, store):
        job = launch.from_env({"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "h0"})
        here, ns = socket.gethostname(), os.stat("/proc/self/ns/pid").st_ino
        me = f"{here} pid {os.getpid()} ns {ns}"
        # Held by a live process of this host (our parent): refused, naming it.
        store.set("gradlane/rank/2", f"{here} pid {os.getppid()} ns {ns}")
        with self.assertRaises(gradlane.Error) as raised:
            launch.claim_rank(store, job)
        self.assertIn(f"rank 2 (worker) was launched twice: {here} pid {os.getppid()} ns {ns} holds it",
                      str(raised.exception))
        self.assertEqual(raised.exception.code, "invalid_argument")
        # Held by a process of another host, or of another pid namespace: its liveness is
        # unknown here, so refused too.
        for other in (f"{here}-other pid {a_dead_pid()} ns {ns}", f"{here} pid {a_dead_pid()} ns {ns + 1}"):
            store.set("gradlane/rank/2", other)
            with self.assertRaises(gradlane.Error):
                launch.claim_rank(store, job)
        # Held by a process of this host that is gone (the rank crashed, started again): taken over.
        store.set("gradlane/rank/2", f"{here} pid {a_dead_pid()} ns {ns}")
        launch.claim_rank(store, job)
        self.assertEqual(bytes(store.get("gradlane/rank/2")).decode(), me)
        launch.claim_rank(store, job)  # ours already: claimed again, nothing said
        # Nobody's: taken.
        server = launch.from_env({"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "h0"})
        launch.claim_rank(store, server)
        self.assertEqual(bytes(store.get("gradlane/rank/0")).decode(), me)

    def test_in_a_rendezvous_directory(self):
        with tempfile.TemporaryDirectory() as where:
            self.check(launch.DirectoryStore(where, 5))

    def test_in_torchs_tcp_store(self):
        import datetime

        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=10))
        self.check(store)

    def race(self, where):
        """Eight processes claiming rank 2 at once in the directory `where`: what each said. They
        start claiming together (each ready, then released at once), and each lives until all have
        said it (a winner that exited would be a dead holder, for the next to take over)."""
        script = ("import os, sys; from gradlane import launch; job = launch.from_env({'RANK': '2', 'WORLD_SIZE': "
                  "'4', 'MASTER_ADDR': 'h'}); store = launch.DirectoryStore(sys.argv[1], 5); print('ready', "
                  "flush=True)\nwhile not os.path.exists(sys.argv[2]): pass\ntry:\n launch.claim_rank(store, job); "
                  "print('won', flush=True)\nexcept Exception as e:\n print('refused' if 'launched twice' in str(e) "
                  "else e, flush=True)\nsys.stdin.read()")
        go = os.path.join(where, "go")
        racers = [subprocess.Popen([sys.executable, "-c", script, where, go], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True) for _ in range(8)]
        for racer in racers:
            self.assertEqual(racer.stdout.readline().strip(), "ready")
        open(go, "w").close()
        said = sorted(racer.stdout.readline().strip() for racer in racers)
        for racer in racers:
            racer.communicate(timeout=60)
        return said

    def test_processes_racing_for_a_free_rank_leave_one_holder(self):
        with tempfile.TemporaryDirectory() as where:
            self.assertEqual(self.race(where), ["refused"] * 7 + ["won"])

    def test_processes_racing_to_take_over_a_dead_holder_leave_one_holder(self):
        with tempfile.TemporaryDirectory() as where:
            ns = os.stat("/proc/self/ns/pid").st_ino
            launch.DirectoryStore(where, 5).set("gradlane/rank/2", f"{socket.gethostname()} pid {a_dead_pid()} ns {ns}")
            self.assertEqual(self.race(where), ["refused"] * 7 + ["won"])

    def test_the_rendezvous_claims_the_rank_before_it_is_returned(self):
        with tempfile.TemporaryDirectory() as where:
            job = launch.from_env({"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "h0"})
            held = f"{socket.gethostname()} pid {os.getppid()} ns {os.stat('/proc/self/ns/pid').st_ino}"
            launch.DirectoryStore(where, 5).set("gradlane/rank/2", held)
            before = os.environ.get("GRADLANE_RENDEZVOUS")
            os.environ["GRADLANE_RENDEZVOUS"] = f"file:{where}"
            try:
                with self.assertRaises(gradlane.Error) as raised:
                    launch.rendezvous(job, timeout_s=5)
                self.assertIn("launched twice", str(raised.exception))
                os.unlink(os.path.join(where, "gradlane%2Frank%2F2"))
                launch.rendezvous(job, timeout_s=5)
                holder = bytes(launch.DirectoryStore(where, 5).get("gradlane/rank/2")).decode()
                self.assertIn(f"pid {os.getpid()} ", holder)
            finally:
                if before is None:
                    del os.environ["GRADLANE_RENDEZVOUS"]
                else:
                    os.environ["GRADLANE_RENDEZVOUS"] = before


class DirectoryStore(unittest.TestCase):
    def test_a_replace_that_read_the_old_value_before_another_replaced_it_takes_the_others_value(self):
        with tempfile.TemporaryDirectory() as where:
            first, late = launch.DirectoryStore(where, 5), launch.DirectoryStore(where, 1)
            first.set("gradlane/rank/2", "dead")
            self.assertEqual(first.compare_set("gradlane/rank/2", "dead", "first"), b"first")
            reads = iter([b"dead"])  # the late one read the old value before the first replaced it
            late._read = lambda path: next(reads, None) or launch.DirectoryStore._read(path)
            self.assertEqual(late.compare_set("gradlane/rank/2", "dead", "late"), b"first")
            self.assertEqual(first.get("gradlane/rank/2"), b"first")

    def test_a_key_set_by_one_rank_is_what_another_gets(self):
        with tempfile.TemporaryDirectory() as where:
            server, worker = launch.DirectoryStore(where, 5), launch.DirectoryStore(where, 5)
            server.set("gradlane/server", "198.18.0.10:7950")
            worker.set("gradlane/initial", b"\x00\x01")
            self.assertEqual(worker.get("gradlane/server"), b"198.18.0.10:7950")
            self.assertEqual(server.get("gradlane/initial"), b"\x00\x01")
            self.assertEqual(sorted(os.listdir(where)), ["gradlane%2Finitial", "gradlane%2Fserver"])

    def test_a_worker_whose_model_differs_from_the_published_one_is_told_before_it_connects(self):
        import numpy as np

        import gradlane.server as gs

        with tempfile.TemporaryDirectory() as where:
            store = launch.DirectoryStore(where, 5)
            gs.publish_model(store, np.zeros(10, dtype=np.float32), lr=0.1)
            gs.check_model(store, 10)
            with self.assertRaises(gradlane.Error) as raised:
                gs.check_model(store, 12)
            self.assertIn("12 floats, the job's model 10", str(raised.exception))

    def test_a_key_nobody_set_is_a_timeout_naming_it(self):
        with tempfile.TemporaryDirectory() as where:
            with self.assertRaises(gradlane.Error) as raised:
                launch.DirectoryStore(where, 0.05).get("gradlane/server")
            self.assertEqual(raised.exception.code, "timeout")
            self.assertIn("gradlane/server", str(raised.exception))


if __name__ == "__main__":
    unittest.main()
