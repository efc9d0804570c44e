"""One rank of a small PyTorch job through gradlane, as a launcher starts it (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, GRADLANE_DEVICE): ranks that serve run gradlane.server, the others
train a linear model on a fixed regression problem with gradlane.torch.DistributedOptimizer in
MODE (argv[2], default fifo) and write what they saw, their metrics scraped at the end included,
as JSON to OUT/rank<R>.json. Used by torch_softroce_test.py.
    torchrun ... torch_job.py OUT [MODE]"""
import json
import os
import sys
import time
import urllib.request

import torch

import gradlane.server
import gradlane.torch as gl

STEPS = 20
FEATURES = 16


def problem(seed):
    """A batch of y = x · w_true + 0.5, the same w_true on every worker."""
    w_true = torch.linspace(-1, 1, FEATURES)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, FEATURES, generator=g)
    return x, x @ w_true + 0.5


def main():
    out = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else "fifo"
    job = gl.init()
    if job.role != "worker":
        gradlane.server.main()
        return 0
    torch.manual_seed(job.worker_id)  # different starting values: the server's must win
    model = torch.nn.Linear(FEATURES, 1)
    own = [p.detach().clone().reshape(-1).tolist() for p in model.parameters()]
    opt = gl.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(), job,
                                  mode=mode)
    grad_buffer = opt.worker.gradient.__array_interface__["data"][0]
    grad_end = grad_buffer + opt.worker.gradient.nbytes
    started = [p.detach().clone().reshape(-1).tolist() for p in model.parameters()]  # the server's model
    losses, dropped, stepping = [], 0, 0.0
    for step in range(STEPS):
        x, y = problem(1000 * job.worker_id + step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        loss.backward()
        began = time.monotonic()
        dropped += opt.step().dropped
        stepping += time.monotonic() - began
        losses.append(loss.item())
    in_place = all(grad_buffer <= p.grad.data_ptr() < grad_end for p in model.parameters())
    last_version = opt.version
    metrics = ""
    if opt.exporter:  # GRADLANE_METRICS: what Prometheus would scrape from this rank
        with urllib.request.urlopen(f"http://127.0.0.1:{opt.exporter.port}/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
    opt.close()
    with open(os.path.join(out, f"rank{job.rank}.json"), "w") as f:
        json.dump({"losses": losses, "copies": opt.copies, "dropped": dropped, "version": last_version,
                   "own": own, "started": started, "seconds": opt.seconds, "stepping": stepping, "pull_rounds": opt.pull_rounds, "pulls_unchanged": opt.pulls_unchanged, "grads_in_buffer": in_place, "metrics": metrics, "worker": job.worker_id,
                   "params": [p.detach().reshape(-1).tolist() for p in model.parameters()]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
