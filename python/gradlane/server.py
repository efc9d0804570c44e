"""The parameter server's ranks of a launched job: `python3 -m gradlane.server`, started by the same
launcher command as the workers (rank 0 the server, rank 1 its replica unless GRADLANE_REPLICA=0).
It waits for the first worker to publish the model's size, initial values and SGD settings
(gradlane.torch.DistributedOptimizer does), serves until every worker has finished, and prints
what it applied.

    GRADLANE_DEVICE=rxe0 torchrun --nnodes=3 --node-rank=0 ... -m gradlane.server   # or srun / mpirun

Environment: GRADLANE_DEVICE (default: the first RDMA device), GRADLANE_PS_PORT (7950; the replica
listens on the next port), GRADLANE_SIDECAR (the shm name of this host's gradlaned: sidecar mode,
the server as endpoint 0), GRADLANE_METRICS (ADDRESS:PORT: every rank serves Prometheus metrics on
PORT + its rank), GRADLANE_JOB_KEY_FILE / GRADLANE_JOB_KEY as for every gradlane program.
"""
import json
import os
import sys

import numpy as np

from . import Device, MetricsExporter, ServerMetrics, ShardServer, launch

# The keys the ranks meet at (launch.rendezvous).
FLOATS, INITIAL, SGD = "gradlane/floats", "gradlane/initial", "gradlane/sgd"
SERVER_AT, REPLICA_AT = "gradlane/server", "gradlane/replica"
PORT = 7950
# How long a server waits for its workers to come, and run_until() for the next update.
PATIENCE_S = 600.0


def device_from_env():
    name = os.environ.get("GRADLANE_DEVICE", "")
    return Device.open(name)


def port_from_env():
    return int(os.environ.get("GRADLANE_PS_PORT", str(PORT)))


def metrics_from_env(job):
    """The rank's MetricsExporter if GRADLANE_METRICS=ADDRESS:PORT is set (on PORT + the rank, so the
    ranks of one host never share a port), else None."""
    at = os.environ.get("GRADLANE_METRICS", "")
    if not at:
        return None
    address, _, port = at.rpartition(":")
    if not address or not port.isdigit():
        raise launch.error(f"GRADLANE_METRICS={at!r}: give ADDRESS:PORT, e.g. 0.0.0.0:9464", "invalid_argument")
    exporter = MetricsExporter(f"{address}:{int(port) + job.rank}")
    print(f"gradlane: rank {job.rank} serves metrics on port {exporter.port}", flush=True)
    return exporter


def publish_model(store, initial, lr, momentum=0.0, mode="fifo"):
    """What the first worker publishes for the server to start from: the model's floats (a float32
    numpy array), and the SGD rule it applies."""
    store.set(SGD, json.dumps({"lr": lr, "momentum": momentum, "mode": mode}))
    store.set(INITIAL, initial.astype(np.float32).tobytes())
    store.set(FLOATS, str(initial.size))


def check_model(store, floats):
    """Raises gradlane.Error if the job's model (as the first worker published it) is not `floats`
    floats: this worker's parameters differ from the first's (another model definition, a layer
    resized), and its pushes would be refused or, worse, mean something else."""
    published = int(store.get(FLOATS).decode())
    if published != floats:
        raise launch.error(f"this worker's parameters hold {floats} floats, the job's model {published} (as the "
                           "first worker published it): every worker must build the same model", "invalid_argument")


def addresses(store, job):
    """(the server's ADDRESS:PORT, the replica's or None), once they published them."""
    return store.get(SERVER_AT).decode(), store.get(REPLICA_AT).decode() if job.replica else None


def model_from(store, workers):
    """(floats, initial model, learning rate, momentum) as the first worker published them; in sync
    mode each gradient is applied at lr / workers, so a step moves the model by their average."""
    floats = int(store.get(FLOATS).decode())
    initial = np.frombuffer(store.get(INITIAL), dtype=np.float32)
    if initial.size != floats:
        raise launch.error(f"the first worker published {initial.size} initial floats for a model of {floats}",
                           "protocol")
    sgd = json.loads(store.get(SGD).decode())
    lr = float(sgd["lr"]) / (workers if sgd.get("mode") == "sync" else 1)
    return floats, initial, lr, float(sgd["momentum"])


def serve(job, store):
    """Runs this rank's shard (server or replica) to the end of the job; returns the shard."""
    device = device_from_env()
    port = port_from_env() + (1 if job.role == "replica" else 0)
    floats, initial, lr, momentum = model_from(store, job.workers)
    sidecar = os.environ.get("GRADLANE_SIDECAR") or None
    shard = ShardServer(device, job.role, port, floats, learning_rate=lr, momentum=momentum, initial=initial,
                        sidecar=sidecar if job.role == "server" else None, endpoint=0)
    at = f"{device.address}:{port}"
    if job.role == "replica":
        store.set(REPLICA_AT, at)
    else:
        if job.replica:
            shard.connect_replica(store.get(REPLICA_AT).decode(), timeout=60)
        store.set(SERVER_AT, at)
    shard.accept_peers(job.workers, timeout=PATIENCE_S)
    exporter = metrics_from_env(job)
    metrics = None
    if exporter:
        metrics = ServerMetrics(job.role, floats * 4)
        exporter.add(metrics)
    # Until every worker has finished: run_until() returns True then (the version is never
    # reached), False when nothing happened for PATIENCE_S. With metrics, a pass per update.
    while True:
        if not shard.run_until(shard.version + 1 if metrics else 2**63, timeout=PATIENCE_S):
            raise launch.error(f"the {job.role} saw its workers neither push nor finish for {PATIENCE_S:.0f} s",
                               "timeout")
        if metrics:
            metrics.update(shard)
        if not metrics or shard.finished:
            return shard


def main():
    job = launch.from_env()
    if job.role == "worker":
        raise SystemExit(f"gradlane.server: rank {job.rank} is a worker (ranks 0..{job.first_worker - 1} serve): "
                         "start the training script on it")
    store = launch.rendezvous(job, timeout_s=PATIENCE_S)
    shard = serve(job, store)
    stats = shard.stats
    print(f"gradlane.server: {job.role} (rank {job.rank}) ended at version {shard.version}: {stats.applied} updates "
          f"applied, {stats.skipped} skipped, {stats.peers_lost} workers lost", flush=True)


if __name__ == "__main__":
    sys.exit(main())
