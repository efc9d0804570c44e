"""gradlane.torch over rxe: a job started by torchrun on each of three hosts — rank 0
`gradlane.server` on host 0, two workers training a torch.nn.Linear with DistributedOptimizer in
sync mode on hosts 1 and 2, every rank serving its metrics — and what a user checks: the workers
start from the server's model, their gradients are pushed from registered memory without a copy,
every push is applied, the loss falls, each step ends with both gradients applied (the workers
end on the same model), and each worker's metrics count its pushes.
Run by run_tests.py inside ci/softroce.sh --hosts 3 (GRADLANE_HOSTS)."""
import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

from emulated_hosts import hosts

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 20  # torch_job.STEPS


class TorchJob(unittest.TestCase):
    def test_two_workers_launched_by_torchrun_train_in_sync_through_the_server_from_its_model_without_copies(self):
        (dev0, addr0), (dev1, _), (dev2, _) = hosts()[:3]
        key = base64.b64encode(os.urandom(24)).decode()
        with tempfile.TemporaryDirectory() as scratch:
            out = os.path.join(os.environ.get("GRADLANE_OUT_DIR", scratch), "torch-job")
            os.makedirs(out, exist_ok=True)
            ranks = []
            for rank, device in enumerate((dev0, dev1, dev2)):
                # torchrun on each host, as a user starts a job on three nodes: it sets RANK,
                # WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for its process.
                env = dict(os.environ, GRADLANE_DEVICE=device, GRADLANE_REPLICA="0", GRADLANE_JOB_KEY=key,
                           GRADLANE_METRICS="127.0.0.1:9480")
                log = open(os.path.join(out, f"rank{rank}.log"), "w")
                # --redirects/--tee: Debian 12's torchrun (torch 1.13 on Python 3.11) fails at
                # start with their default "0" (Std.from_str returns None there).
                torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=3", f"--node_rank={rank}",
                            "--nproc_per_node=1", f"--master_addr={addr0}", "--master_port=29510", "--redirects=1",
                            "--tee=1"]
                ranks.append((subprocess.Popen(torchrun + [os.path.join(HERE, "torch_job.py"), out, "sync"], env=env,
                                               stdout=log, stderr=subprocess.STDOUT), log))
            timed_out = []
            for rank, (process, log) in enumerate(ranks):
                try:
                    process.wait(timeout=300)
                except subprocess.TimeoutExpired:
                    timed_out.append(rank)
                finally:
                    process.kill()
                    log.close()
            said = {r: open(os.path.join(out, f"rank{r}.log")).read() for r in range(3)}
            self.assertEqual(timed_out, [], "\n".join(f"rank {r}:\n{said[r]}" for r in range(3)))
            for rank, (process, _) in enumerate(ranks):
                self.assertEqual(process.returncode, 0, f"rank {rank}:\n{said[rank]}")
            workers = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in (1, 2)]
        ended = re.search(r"ended at version (\d+): (\d+) updates applied", said[0])
        self.assertIsNotNone(ended, said[0])
        self.assertEqual(int(ended.group(2)), 2 * STEPS, said[0])  # every push applied
        self.assertEqual(workers[0]["started"], workers[0]["own"])  # the first worker's values seed the server
        self.assertNotEqual(workers[1]["own"], workers[0]["own"])
        self.assertEqual(workers[1]["started"], workers[0]["started"])  # everyone starts from the server's model
        for w in workers:
            self.assertEqual(w["copies"], 0)
            # step()'s push and pull each took time, and together no more than step() did.
            self.assertGreater(w["seconds"]["push"], 0)
            self.assertGreater(w["seconds"]["pull"], 0)
            self.assertLessEqual(w["seconds"]["push"] + w["seconds"]["pull"], w["stepping"])
            self.assertGreaterEqual(w["pull_rounds"], STEPS)  # at least one READ round a step's pull
            self.assertEqual(w["pulls_unchanged"], 0)  # sync: a step's pull waits for its gradients
            self.assertTrue(w["grads_in_buffer"])
            self.assertEqual(w["dropped"], 0)
            self.assertLess(w["losses"][-1], 0.5 * w["losses"][0], w["losses"])
            # Sync: a step ends when both workers' gradients of it are applied.
            self.assertEqual(w["version"], 2 * STEPS)
            self.assertIn(f'gradlane_worker_pushes_total{{outcome="acknowledged",worker="{w["worker"]}"}} {STEPS}',
                          w["metrics"])
        # Both pulled the model after the last step's two gradients: the same floats.
        self.assertEqual(workers[0]["params"], workers[1]["params"])


if __name__ == "__main__":
    unittest.main()
