"""One rank of a job without torch, as mpirun or srun starts it (OMPI_COMM_WORLD_* or SLURM_*,
GRADLANE_RENDEZVOUS=file:DIR, GRADLANE_DEVICE): ranks that serve run gradlane.server; the others
fit y = x · w + 0.5 by SGD in numpy through gradlane.Worker, pushing from and pulling into its
registered buffers, and write what they saw as JSON to OUT/rank<R>.json. Used by
launchers_softroce_test.py.
    mpirun -np 3 ... python3 numpy_job.py OUT"""
import json
import os
import sys

import numpy as np

import gradlane
import gradlane.server as gs
from gradlane import launch

STEPS = 20
FEATURES = 16
LR = 0.05


def batch(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((64, FEATURES)).astype(np.float32)
    return x, x @ np.linspace(-1, 1, FEATURES, dtype=np.float32) + 0.5


def main():
    out = sys.argv[1]
    job = launch.from_env()
    if job.role != "worker":
        gs.main()
        return 0
    store = launch.rendezvous(job)
    if job.worker_id == 1:
        gs.publish_model(store, np.zeros(FEATURES + 1, dtype=np.float32), LR)
    server_at, replica_at = gs.addresses(store, job)
    worker = gradlane.Worker(gs.device_from_env(), server=server_at, floats=FEATURES + 1, id=job.worker_id,
                             replica=replica_at)
    losses = []
    for step in range(STEPS):
        pulled = worker.pull()
        w, b = worker.model[:FEATURES], worker.model[FEATURES]
        x, y = batch(1000 * job.worker_id + step)
        error = x @ w + b - y
        losses.append(float(np.mean(error**2)))
        worker.gradient[:FEATURES] = 2 * x.T @ error / len(y)  # into registered memory
        worker.gradient[FEATURES] = 2 * np.mean(error)
        worker.push(computed_on=pulled.version)
    worker.settle(10)
    with open(os.path.join(out, f"rank{job.rank}.json"), "w") as f:
        json.dump({"launcher": job.launcher, "worker": job.worker_id, "losses": losses,
                   "imported_torch": "torch" in sys.modules}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
