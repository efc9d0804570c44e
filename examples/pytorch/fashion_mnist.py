"""Fashion-MNIST with PyTorch through gradlane: the example to copy.

Every rank runs this script from the same launcher command. With gradlane, rank 0 becomes the
parameter server (and rank 1 its replica, unless GRADLANE_REPLICA=0); the other ranks train a
small torch.nn model, each on its own shard of the training set, and gradlane.torch pushes their
gradients from registered memory and pulls the server's model into the parameters. With --ddp
the same training runs as users would run it without gradlane: DistributedDataParallel over
gloo, every rank a worker, gradients averaged by allreduce over TCP.

    # one process per node (Debian 12's torchrun needs --redirects=1 --tee=1):
    torchrun --nnodes=3 --node-rank=$NODE --nproc-per-node=1 --master-addr=$HEAD --master-port=29500 \
        --redirects=1 --tee=1 examples/pytorch/fashion_mnist.py --mode sync --lr 0.1
    # the same job without gradlane, on the nodes that would be its workers:
    torchrun --nnodes=2 ... examples/pytorch/fashion_mnist.py --ddp --lr 0.1

Environment for gradlane: GRADLANE_DEVICE (the RDMA device), GRADLANE_JOB_KEY_FILE (the job's key,
mode 0600), optionally GRADLANE_SIDECAR (--mode gradlane) and GRADLANE_METRICS. The worker that
evaluates (the first) writes the accuracy curve to --out as JSON: with --evaluate after it copies
its model every --eval-every steps and evaluates the copies once training ends, so evaluating
takes none of its training time; with inline it evaluates as it goes, between two steps.
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch

DEBIAN_DATA = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


def load(data, split):
    """(images as float32 [n, 784] in [0, 1], labels as int64 [n]) from the IDX files."""
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(os.path.join(data, f"{prefix}-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(os.path.join(data, f"{prefix}-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy(images.astype(np.float32) / 255.0), torch.from_numpy(labels.astype(np.int64))


PARTS = ("compute", "step", "evaluate", "push", "pull")  # where a worker's time went, in seconds


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def accuracy(model, images, labels):
    with torch.no_grad():
        return (model(images).argmax(1) == labels).float().mean().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="fifo", choices=["fifo", "sync", "gradlane"], help="gradlane's mode")
    parser.add_argument("--ddp", action="store_true", help="DistributedDataParallel over gloo instead of gradlane")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=300, help="minibatches per worker")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=20, help="steps between the first worker's evaluations")
    parser.add_argument("--eval-images", type=int, default=2000, help="test images each evaluation uses")
    parser.add_argument("--evaluate", default="after", choices=["after", "inline"],
                        help="after: evaluate copies of the model once training ends; inline: between steps")
    parser.add_argument("--split", default="test", choices=["test", "validation"],
                        help="evaluate on the test set, or on the last 10,000 training images (never trained on)")
    parser.add_argument("--data", default=DEBIAN_DATA)
    parser.add_argument("--out", default="", help="write the accuracy curve here as JSON")
    args = parser.parse_args()

    if args.ddp:
        import torch.distributed as dist

        dist.init_process_group("gloo")  # torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        worker, workers = dist.get_rank() + 1, dist.get_world_size()
    else:
        import gradlane.server
        import gradlane.torch as gl

        job = gl.init()
        if job.role != "worker":  # rank 0 (and 1): the server and its replica
            gradlane.server.main()
            return
        worker, workers = job.worker_id, job.workers

    torch.manual_seed(args.seed)  # the same initial model everywhere (gradlane takes the first worker's)
    model = make_model()
    images, labels = load(args.data, "train")
    train_rows = len(labels) - 10000  # the last 10,000 are the validation split
    shard = torch.arange(worker - 1, train_rows, workers)  # this worker's own part of the training set
    if args.split == "validation":
        test_images, test_labels = images[train_rows:], labels[train_rows:]
    else:
        test_images, test_labels = load(args.data, "test")
    test_images, test_labels = test_images[:args.eval_images], test_labels[:args.eval_images]
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr)
    if args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
        opt = sgd
    else:
        opt = gl.DistributedOptimizer(sgd, model.named_parameters(), job, mode=args.mode)
    order = torch.Generator().manual_seed(args.seed * 1000 + worker)
    curve, started = [], time.monotonic()
    spent = {"compute": 0.0, "step": 0.0, "evaluate": 0.0}  # where this worker's time went
    for step in range(args.steps):
        began = time.monotonic()
        rows = shard[torch.randint(len(shard), (args.batch,), generator=order)]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(images[rows]), labels[rows]).backward()
        computed = time.monotonic()
        opt.step()
        stepped = time.monotonic()
        spent["compute"] += computed - began
        spent["step"] += stepped - computed
        if worker == 1 and (step + 1) % args.eval_every == 0:
            point = {"seconds": stepped - started, "step": step + 1}
            if args.evaluate == "inline":
                point["accuracy"] = accuracy(model, test_images, test_labels)
                print(f"worker 1: step {step + 1}, {point['seconds']:.1f} s, {args.split} accuracy "
                      f"{point['accuracy']:.3f}", flush=True)
            else:
                point["model"] = [p.detach().clone() for p in model.parameters()]
            curve.append(point)
            spent["evaluate"] += time.monotonic() - stepped
    spent["total"] = time.monotonic() - started
    evaluated = make_model()
    for point in curve:
        if "model" in point:
            with torch.no_grad():
                for mine, copied in zip(evaluated.parameters(), point.pop("model")):
                    mine.copy_(copied)
            point["accuracy"] = accuracy(evaluated, test_images, test_labels)
            print(f"worker 1: step {point['step']}, {point['seconds']:.1f} s, {args.split} accuracy "
                  f"{point['accuracy']:.3f}", flush=True)
    if not args.ddp:
        spent.update(opt.seconds)  # the step's push and its pull
        spent["pull_rounds"] = opt.pull_rounds
        spent["pulls_unchanged"] = opt.pulls_unchanged
        opt.close()
    print(f"worker {worker}: {args.steps} steps in {spent['total']:.1f} s: "
          + ", ".join(f"{what} {seconds:.1f} s" for what, seconds in spent.items() if what in PARTS)
          + (f" ({spent['pull_rounds']} READ rounds in {args.steps} pulls, {spent['pulls_unchanged']} of them found "
             "the model the step computed on)" if "pull_rounds" in spent else ""), flush=True)
    if worker == 1 and args.out:
        with open(args.out, "w") as f:
            json.dump({"ddp": args.ddp, "mode": None if args.ddp else args.mode, "workers": workers, "lr": args.lr,
                       "seed": args.seed, "split": args.split, "evaluate": args.evaluate, "curve": curve,
                       "seconds": spent}, f)


if __name__ == "__main__":
    main()
