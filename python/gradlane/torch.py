"""gradlane for PyTorch: data-parallel training through gradlane's parameter server, with each
parameter's gradient and value living in gradlane's registered memory.

    import torch, gradlane.torch as gl
    job = gl.init()                                   # torchrun / srun / mpirun environment
    model = Net()
    opt = gl.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(), job)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()               # gradients land in registered memory
        opt.step()                                    # push them; pull the server's model
    opt.close()

Ranks 0 (and 1, the replica, unless GRADLANE_REPLICA=0) run `python3 -m gradlane.server`; the
others run the training script. The server applies the wrapped optimizer's rule (SGD with its lr
and momentum) in the order it grants the pushes (mode "fifo": every push at once, applied in
arrival order; "gradlane": granted by the host's gradlaned, GRADLANE_SIDECAR naming its shm;
"sync": a step ends when every worker's gradient of it is applied, each at lr / workers, so the
model moves by their average, as DistributedDataParallel's would).

Zero-copy: every parameter's .grad is a view of the worker's gradient buffer (backward
accumulates straight into what the NIC writes) and its .data a view of the model buffer a pull
READs into, so neither step copies a byte. `copies` counts the parameters whose gradient autograd
put elsewhere (copied back before the push); it stays 0 unless something replaced a .grad.
"""
import os
import time
import warnings

import torch

from . import Worker, WorkerMetrics, launch
from . import server as _server

MODES = ("fifo", "gradlane", "sync")


def init(replica=None):
    """The launch this process belongs to (launch.Launch: rank, role, worker id), from the
    launcher's environment; raises gradlane.Error naming what is missing."""
    return launch.from_env(replica=replica)


def _endpoint_of(worker_id):
    return 100 + worker_id  # as gradlaned's --endpoint flags name the workers' NICs


class DistributedOptimizer:
    """Wraps a torch.optim.SGD whose parameters are trained by every worker rank of `job`."""

    def __init__(self, optimizer, named_parameters, job, mode="fifo", timeout=60.0):
        if mode not in MODES:
            raise launch.error(f"mode {mode!r}: one of {', '.join(MODES)}")
        if job.role != "worker":
            raise launch.error(f"rank {job.rank} is the {job.role}: run `python3 -m gradlane.server` there")
        if len(optimizer.param_groups) != 1 or not isinstance(optimizer, torch.optim.SGD):
            raise launch.error("the server applies one SGD rule: wrap a torch.optim.SGD with one parameter group")
        group = optimizer.param_groups[0]
        if group.get("weight_decay", 0) or group.get("nesterov", False) or group.get("dampening", 0):
            raise launch.error("weight_decay, nesterov and dampening are not applied by the server: leave them off")
        if mode == "sync" and group.get("momentum", 0):
            raise launch.error("mode 'sync' applies a step's gradients one by one at lr / workers: momentum would "
                               "act on each of them, not on their average; use momentum=0, or mode 'fifo'")
        self.optimizer, self.job, self.mode, self.timeout = optimizer, job, mode, timeout
        self.params = [p for _, p in named_parameters if p.requires_grad]
        for p in self.params:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise launch.error(f"a parameter of {p.dtype} on {p.device}: gradlane moves float32 CPU tensors")
        floats = sum(p.numel() for p in self.params)
        self.store = launch.rendezvous(job, timeout_s=max(timeout, 120.0))
        if job.worker_id == 1:  # what the server starts from: this worker's initial values
            initial = torch.cat([p.detach().reshape(-1) for p in self.params]).numpy()
            _server.publish_model(self.store, initial, group["lr"], group.get("momentum", 0.0), mode)
        _server.check_model(self.store, floats)
        server_at, replica_at = _server.addresses(self.store, job)
        sidecar = os.environ.get("GRADLANE_SIDECAR") if mode == "gradlane" else None
        if mode == "gradlane" and not sidecar:
            raise launch.error("mode 'gradlane' asks the host's gradlaned for every push: set GRADLANE_SIDECAR to "
                               "the shm name it serves (gradlaned --shm-name)")
        self.worker = Worker(_server.device_from_env(), server=server_at, floats=floats, id=job.worker_id,
                             replica=replica_at, timeout=timeout, sidecar=sidecar,
                             endpoint=_endpoint_of(job.worker_id), server_endpoint=0)
        self._gradient = torch.from_numpy(self.worker.gradient)
        with warnings.catch_warnings():  # read-only to numpy; torch only reads it (the server updates it)
            warnings.simplefilter("ignore", UserWarning)
            model = torch.from_numpy(self.worker.model)
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = self._gradient[offset:offset + n].view_as(p)
            p.data = model[offset:offset + n].view_as(p)
            offset += n
        self.copies = 0
        # GRADLANE_METRICS=ADDRESS:PORT: this rank's pushes on PORT + its rank (gradlane.server).
        self.exporter = _server.metrics_from_env(job)
        self.metrics = WorkerMetrics(job.worker_id) if self.exporter else None
        if self.metrics:
            self.exporter.add(self.metrics)
        self.version = self.worker.pull().version  # the server's initial model, in every worker's params
        self.steps = 0
        self.seconds = {"push": 0.0, "pull": 0.0}  # where step() spent its time, summed over the steps
        self.pull_rounds = 0  # READ rounds of step()'s pulls: more than one a pull when it met an apply
        self.pulls_unchanged = 0  # step()'s pulls that found the model it computed on: its push not applied yet

    def zero_grad(self, set_to_none=False):
        del set_to_none  # the gradients are the registered buffer: zeroed in place, never dropped
        self._gradient.zero_()

    def _gradients_in_place(self):
        """Puts back into the buffer any gradient autograd left elsewhere (counted in `copies`)."""
        offset = 0
        for p in self.params:
            n = p.numel()
            view = self._gradient[offset:offset + n].view_as(p)
            if p.grad is None:
                view.zero_()
                p.grad = view
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
                p.grad = view
                self.copies += 1
            offset += n

    def step(self):
        """Pushes this worker's gradient (computed on `version`), then pulls the server's model into
        the parameters. Returns the worker's PushResult (dropped / lost say what became of it)."""
        self._gradients_in_place()
        started = time.monotonic()
        pushed = self.worker.push(computed_on=self.version)
        pushed_at = time.monotonic()
        if self.metrics:
            self.metrics.record(pushed, pushed_at - started)
        self.steps += 1
        computed_on = self.version
        self.version = self._pull_sync() if self.mode == "sync" else self._pull()
        self.pulls_unchanged += self.version == computed_on
        self.seconds["push"] += pushed_at - started
        self.seconds["pull"] += time.monotonic() - pushed_at
        return pushed

    def _pull(self):
        pulled = self.worker.pull()
        self.pull_rounds += pulled.attempts
        return pulled.version

    def _pull_sync(self):
        """Waits until the server applied every worker's gradient of this step (version steps x
        workers), reading only its version, then pulls; raises after `timeout` naming how many
        are missing."""
        target = self.steps * self.job.workers
        deadline = time.monotonic() + self.timeout
        while True:
            version = self.worker.server_version()
            if version >= target:
                return self._pull()
            if time.monotonic() > deadline:
                raise launch.error(f"sync step {self.steps}: waited {self.timeout:.0f} s for the server's version "
                                   f"{target}, it is at {version}: {target - version} of the step's "
                                   f"{self.job.workers} gradients have not come (a worker is slow, stopped or gone)",
                                   "timeout")
            time.sleep(0.001)

    def close(self):
        """Tells the server this worker finished. The parameters keep the last model pulled, now in
        memory of their own (one copy), and their gradients are dropped."""
        if self.worker is None:
            return
        self.worker.settle()
        for p in self.params:
            p.data = p.data.clone()
            p.grad = None
        self._gradient = None
        self.worker = None  # its last reference: the worker says goodbye to the server
