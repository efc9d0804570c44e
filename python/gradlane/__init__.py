"""gradlane: gradient updates over RDMA, zero-copy, from Python.

The parameter server's roles over gradlane's C++ API. A Worker's `gradient` and `model` are
numpy arrays over its registered memory (torch.from_numpy shares them too): what is computed
into `gradient` is what the NIC writes, with no copy between. Blocking calls release the GIL.

    import gradlane
    device = gradlane.Device.open("rxe0")
    worker = gradlane.Worker(device, server="198.18.0.10:7900", floats=65536)
    pulled = worker.pull()
    worker.gradient[:] = 0.5                      # compute in registered memory
    worker.push(computed_on=pulled.version)

Prometheus metrics: MetricsExporter("0.0.0.0:9464") serves the sources added to it, a shard's
ServerMetrics (update(shard) from the thread that runs it) and a worker's WorkerMetrics
(record(push_result, seconds) after each push).

Every failure raises gradlane.Error: str() says what failed and what to do, .code names its
category ("device_not_found", "timeout", ...). The job's key comes from GRADLANE_JOB_KEY_FILE
or GRADLANE_JOB_KEY, as for gradlane's programs.
"""
from ._gradlane import (Device, Error, MetricsExporter, PullResult, PushResult, ServerMetrics, ServerStats, ShardServer,
                        Worker, WorkerMetrics)

__all__ = ["Device", "Error", "MetricsExporter", "PullResult", "PushResult", "ServerMetrics", "ServerStats",
           "ShardServer", "Worker", "WorkerMetrics"]
