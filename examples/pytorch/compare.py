"""gradlane vs DistributedDataParallel on the emulated hosts, side by side: the Fashion-MNIST
example (fashion_mnist.py) started by torchrun on each host, through gradlane (rank 0 the server
on host 0, workers on hosts 1 and 2; modes sync and fifo, and with --kinds ...,gradlane mode
gradlane, each push granted by a gradlaned; gradlane-packed the same with the server's ingress packed,
gradlaned --ingress-sharing packed at --server-rate) and with DDP over gloo (the same two workers). Protocol: each kind's learning rate tuned on the validation split (--tune-seeds, the
grid --lrs; the fastest median time to --tune-target, first sustained crossing), frozen to
--frozen before any test run, then the test seeds on the test split. Prints and writes (JSON
lines, --out) each run's time to the targets, final accuracy, and the bytes across the hosts'
links; --report-only summarises a runs file. Both files default to GRADLANE_OUT_DIR, the harness's
results directory (SOFTROCE_OUT on the host).
    SOFTROCE_OUT=out/pytorch-compare bash ci/softroce.sh --hosts 3 -- python3 examples/pytorch/compare.py --tune-only
    (commit frozen.json)
    SOFTROCE_OUT=out/pytorch-compare bash ci/softroce.sh --hosts 3 -- python3 examples/pytorch/compare.py
With --tcp-over-links (ci/softroce.sh) gloo's TCP crosses the hosts' links as gradlane's RDMA does
(each DDP rank runs as its host's uid, 10000 + I, which the harness routes out of host I's veth);
without it, it goes over loopback and the table says so. --shape I:RATE on the harness makes host I a straggler for every kind alike.
"""
import argparse
import base64
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "perf"))
from experiment import fmt_ratio, ratio_of_medians  # noqa: E402  (the protocol's bootstrap)

LADDER = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]  # the grid's half-decade steps
HOST_UID_BASE = 10000  # ci/softroce/net.sh's SOFTROCE_HOST_UID_BASE
MAX_WIDEN = 2  # steps past a winning edge; a winner still on the edge is flagged in frozen.json
SERVER_ENDPOINT = 0  # fashion_mnist.py's server, rank 0: the receiver whose ingress gradlaned shares
# kind -> (fashion_mnist.py's --mode, gradlaned's --ingress-sharing); mode None is DDP, sharing None no gradlaned
KINDS = {"gradlane-sync": ("sync", None), "gradlane-fifo": ("fifo", None), "gradlane": ("gradlane", "exclusive"),
         "gradlane-packed": ("gradlane", "packed"), "ddp": (None, None)}


def link_bytes(host):
    """Bytes received and sent on emulated host `host`'s interface (hI)."""
    base = f"/sys/class/net/h{host}/statistics"
    return tuple(int(open(f"{base}/{kind}_bytes").read()) for kind in ("rx", "tx"))


def time_to(curve, target):
    """Seconds to the first evaluation at or above `target` after which the next two stay there."""
    for i, point in enumerate(curve):
        if all(p["accuracy"] >= target for p in curve[i:i + 3]) and len(curve[i:i + 3]) == 3:
            return point["seconds"]
    return None


@contextlib.contextmanager
def gradlaned(args, scratch, name, sharing, usage):
    """A gradlaned for a 'gradlane' run, once it serves: one for every emulated host, which share
    the VM's /dev/shm (on a cluster, one per host, linked as peers). Yields the ranks' environment
    for it (its shm name, the job's key file); stopped on the way out, whatever happened. Its log
    is kept in `scratch`, its schedule log beside --out (NAME.schedule.jsonl, for gradlane.timeline).
    `sharing` packed books each grant at its sender's share of the server's --server-rate. Its CPU
    time goes into `usage` (gradlaned_cpu_s): the cores it took from the ranks it shares them with."""
    key_file = os.path.join(scratch, f"{name}.key")
    with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(base64.b64encode(os.urandom(24)).decode())
    shm, log_path = f"/gradlane-compare-{os.getpid()}", os.path.join(scratch, f"{name}.gradlaned.log")
    with open(log_path, "w") as log:
        daemon = subprocess.Popen([os.path.join(args.build, "sidecar", "daemon", "gradlaned"), "--foreground",
                                   "--shm-name", shm, "--key-file", key_file, "--schedule-log",
                                   os.path.join(os.path.dirname(os.path.abspath(args.out)), f"{name}.schedule.jsonl"),
                                   "--ingress-sharing", sharing]
                                  + (["--link-rate", f"{SERVER_ENDPOINT}:in:{args.server_rate}"] if sharing == "packed" else []),
                                  stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while "gradlaned: serving" not in open(log_path).read():
            if daemon.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"gradlaned did not start serving within 60 s:\n{open(log_path).read()}")
            time.sleep(0.05)
        yield {"GRADLANE_JOB_KEY_FILE": key_file, "GRADLANE_SIDECAR": shm}
    finally:
        usage["gradlaned_cpu_s"] = cpu_seconds(daemon.pid)
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def cpu_seconds(pid):
    """User + system CPU time of a running process (/proc/PID/stat), or None once it is gone."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def run(kind, hosts, args, lr, seed, split, scratch):
    """One job of `kind` (KINDS); returns its record."""
    mode, sharing = KINDS[kind]
    nodes = hosts[1:3] if mode is None else hosts[:3]
    name = f"{kind}-lr{lr}-seed{seed}-{split}"
    out = os.path.join(scratch, f"{name}.json")
    usage = {}
    with (gradlaned(args, scratch, name, sharing, usage) if sharing
          else contextlib.nullcontext({"GRADLANE_JOB_KEY": base64.b64encode(os.urandom(24)).decode()})) as key:
        before = [link_bytes(h) for h in range(3)]
        ranks = start_ranks(mode, nodes, hosts, args, lr, seed, split, scratch, out, key)
        args.port += 2
        try:
            said = [r.communicate(timeout=args.timeout)[0] for r in ranks]
        finally:
            for r in ranks:
                if r.poll() is None:
                    r.kill()
                    r.wait()
    after = [link_bytes(h) for h in range(3)]
    if any(r.returncode != 0 for r in ranks) or not os.path.exists(out):
        sys.exit(f"{kind} lr {lr} seed {seed} failed:\n" + "\n".join(said))
    written = json.load(open(out))
    curve = written["curve"]
    # Each worker's last line says where its time went (compute, push, pull, evaluation).
    spent = [m.group(0) for text in said for m in re.finditer(r"worker \d+: \d+ steps in .*", text)]
    return {"kind": kind, "lr": lr, "seed": seed, "split": split, "curve": curve, "final": curve[-1]["accuracy"],
            "seconds": written.get("seconds"), "workers_spent": spent, **usage,
            "bytes_in": [a[0] - b[0] for a, b in zip(after, before)],
            "bytes_out": [a[1] - b[1] for a, b in zip(after, before)]}


def start_ranks(mode, nodes, hosts, args, lr, seed, split, scratch, out, key):
    """torchrun on each of `nodes` for one job (mode None: ddp), with `key` in its environment."""
    ddp = mode is None
    ranks = []
    for rank, (device, _) in enumerate(nodes):
        host = hosts.index(nodes[rank])
        env = dict(os.environ, GRADLANE_DEVICE=device, GRADLANE_REPLICA="0", **key,
                   PYTHONPATH=os.path.join(args.build, "python"), GLOO_SOCKET_IFNAME=f"h{host}", HOME=scratch)
        # gradlane's RDMA crosses the links as any user; gloo connects unbound (see the docstring).
        as_host = {"user": HOST_UID_BASE + host, "group": HOST_UID_BASE + host, "extra_groups": []} if ddp else {}
        command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(nodes)}", f"--node_rank={rank}",
                   "--nproc_per_node=1", f"--master_addr={nodes[0][1]}", f"--master_port={args.port}",
                   "--redirects=1", "--tee=1", os.path.join(HERE, "fashion_mnist.py"), "--lr", str(lr), "--seed",
                   str(seed), "--steps", str(args.steps), "--eval-every", str(args.eval_every), "--split", split,
                   "--evaluate", args.evaluate,
                   "--out", out]
        command += ["--ddp"] if ddp else ["--mode", mode]
        ranks.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      **as_host))
    return ranks


def record(args, rec, targets):
    for target in targets:
        rec[f"to_{target}"] = time_to(rec["curve"], target)
    print(json.dumps({k: v for k, v in rec.items() if k != "curve"}), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(rec) + "\n")


PARTS = ("compute", "push", "pull", "evaluate")  # fashion_mnist.py's breakdown of a worker's time


def time_breakdown(runs, frozen):
    """Where the evaluating worker's time went, per kind: the median over its test runs of each
    part and of the total, and the network's share (push + pull over the total), which bounds
    what any schedule of the pushes can save. Runs from before the breakdown was recorded are
    left out; no table when none has it."""
    lines = []
    for kind, lr in frozen["lrs"].items():
        recs = [r for r in runs if r["kind"] == kind and r["split"] == "test" and r["lr"] == lr
                and r.get("seconds") and all(p in r["seconds"] for p in PARTS)]
        if not recs:
            continue
        mine = [r["seconds"] for r in recs]
        cells = [statistics.median(m[p] for m in mine) for p in PARTS + ("total",)]
        share = statistics.median((m["push"] + m["pull"]) / m["total"] for m in mine)
        cpu = [r["gradlaned_cpu_s"] for r in recs if r.get("gradlaned_cpu_s") is not None]
        lines.append(f"| {kind} | {len(mine)} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {share:.0%} | "
                     + (f"{statistics.median(cpu):.1f}" if cpu else "—") + " |")
    if not lines:
        return ""
    return "\n".join(["\nWhere worker 1's time went (s, median over the test runs; it also evaluates), and the CPU "
                      "time of the job's gradlaned:",
                      "| kind | runs | " + " | ".join(PARTS) + " | total | push + pull share | gradlaned CPU |",
                      "|---" * (5 + len(PARTS)) + "|"] + lines)


def report(runs, frozen, targets):
    """The test runs' table: per kind the median and range of the time to each target, the final
    accuracy, and the bytes into host 0 and out of the workers' hosts."""
    lines = ["| kind | lr | " + " | ".join(f"time to {t} (s): median [range]" for t in targets)
             + " | final accuracy | MB into host 0 | MB out of hosts 1+2 |", "|---" * (5 + len(targets)) + "|"]
    for kind, lr in frozen["lrs"].items():
        mine = [r for r in runs if r["kind"] == kind and r["split"] == "test" and r["lr"] == lr]
        if not mine:
            continue
        cells = []
        for t in targets:
            times = [time_to(r["curve"], t) for r in mine]
            got = [x for x in times if x is not None]
            cells.append(f"{statistics.median(got):.1f} [{min(got):.1f}–{max(got):.1f}]"
                         + (f" ({len(times) - len(got)} never)" if len(got) < len(times) else "") if got else "never")
        final = statistics.median(r["final"] for r in mine)
        into = statistics.median(r["bytes_in"][0] for r in mine) / 1e6
        out = statistics.median(r["bytes_out"][1] + r["bytes_out"][2] for r in mine) / 1e6
        lines.append(f"| {kind} | {lr} | " + " | ".join(cells) + f" | {final:.3f} | {into:.1f} | {out:.1f} |")
    ddp = [r for r in runs if r["kind"] == "ddp" and r["split"] == "test" and r["lr"] == frozen["lrs"].get("ddp")]
    if ddp and statistics.median(r["bytes_out"][1] + r["bytes_out"][2] for r in ddp) < 1e6:
        lines.append("\nddp's traffic did not cross the hosts' links (loopback): run the harness with "
                     "--tcp-over-links for a comparison on the same links.")
    by_seed = {(r["kind"], r["seed"]): r for r in runs
               if r["split"] == "test" and r["lr"] == frozen["lrs"].get(r["kind"])}
    seeds = sorted({seed for _, seed in by_seed})
    for base in ("ddp", "gradlane-fifo"):
        for kind in frozen["lrs"]:
            if kind in (base, "ddp") or not all((kind, s) in by_seed and (base, s) in by_seed for s in seeds):
                continue
            cells = []
            for t in targets:
                point, lo, hi = ratio_of_medians([time_to(by_seed[(kind, s)]["curve"], t) for s in seeds],
                                                 [time_to(by_seed[(base, s)]["curve"], t) for s in seeds])
                cells.append(f"to {t}: {fmt_ratio(point, lo, hi)}")
            lines.append(f"\n{kind} / {base}, time ratio of medians [95 % bootstrap over {len(seeds)} seeds; > 1 "
                         "slower]: " + ", ".join(cells))
    if breakdown := time_breakdown(runs, frozen):
        lines.append(breakdown)
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--kinds", default="gradlane-sync,gradlane-fifo,ddp",
                        help="of " + ", ".join(KINDS))
    parser.add_argument("--server-rate", default="200mbit",
                        help="gradlane-packed: the server's ingress line rate for gradlaned (tc units); a frozen.json's "
                             "server_rate wins")
    parser.add_argument("--lrs", default="0.03,0.1,0.3", help="the tuning grid's start (half-decade steps)")
    parser.add_argument("--tune-seeds", default="101")
    parser.add_argument("--tune-target", type=float, default=0.70)
    parser.add_argument("--seeds", default="1,2,3", help="test seeds")
    parser.add_argument("--targets", default="0.65,0.70")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--evaluate", default="after", choices=["after", "inline"],
                        help="fashion_mnist.py's --evaluate: worker 1 evaluates copies of its model after training "
                             "(none of its training time), or inline between steps; a frozen.json's evaluate wins, "
                             "and one without it (older) means inline")
    parser.add_argument("--port", type=int, default=29600)
    parser.add_argument("--timeout", type=float, default=1800)
    # Inside the harness only GRADLANE_OUT_DIR reaches the host (the rest is a RAM overlay).
    here = os.environ.get("GRADLANE_OUT_DIR", ".")
    parser.add_argument("--frozen", default=os.path.join(here, "frozen.json"))
    parser.add_argument("--out", default=os.path.join(here, "runs.jsonl"))
    parser.add_argument("--tune-only", action="store_true", help="tune and write --frozen (commit it), then stop")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    targets = [float(t) for t in args.targets.split(",")]
    kinds = args.kinds.split(",")
    if unknown := [k for k in kinds if k not in KINDS]:
        sys.exit(f"unknown --kinds {','.join(unknown)}: pick from {', '.join(KINDS)}")
    if args.report_only:
        runs = [json.loads(line) for line in open(args.out)]
        print(report(runs, json.load(open(args.frozen)), targets))
        return
    hosts = [tuple(p.split(",")) for p in os.environ.get("GRADLANE_HOSTS", "").split()]
    if len(hosts) < 3:
        sys.exit("needs three emulated hosts: bash ci/softroce.sh --hosts 3 -- python3 examples/pytorch/compare.py")
    with tempfile.TemporaryDirectory() as scratch:
        os.chmod(scratch, 0o777)  # DDP ranks write here as their hosts' uids
        runs = []
        done = {}  # (kind, lr, seed, split) -> record, from earlier invocations: not run again
        if os.path.exists(args.out):
            for line in open(args.out):
                rec = json.loads(line)
                done[(rec["kind"], rec["lr"], rec["seed"], rec["split"])] = rec

        def get(kind, lr, seed, split):
            if (kind, lr, seed, split) not in done:
                rec = run(kind, hosts, args, lr, seed, split, scratch)
                record(args, rec, targets + [args.tune_target])
                done[(kind, lr, seed, split)] = rec
            return done[(kind, lr, seed, split)]

        if not os.path.exists(args.frozen):  # tune, then freeze before any test run
            lrs, flagged = {}, []
            for kind in kinds:
                grid = sorted(float(x) for x in args.lrs.split(","))
                score, final = {}, {}
                for widened in range(MAX_WIDEN + 1):
                    for lr in grid:
                        if lr not in score:
                            tuned = [get(kind, lr, seed, "validation") for seed in map(int, args.tune_seeds.split(","))]
                            times = [time_to(r["curve"], args.tune_target) for r in tuned]
                            score[lr] = statistics.median(t if t is not None else float("inf") for t in times)
                            final[lr] = statistics.median(r["final"] for r in tuned)
                    # The fastest to the target; where none reaches it, the best final accuracy.
                    best = min(grid, key=lambda lr: (score[lr], -final[lr]))
                    step = LADDER.index(best) if best in LADDER else None
                    if step is None or widened == MAX_WIDEN:
                        break
                    if best == grid[-1] and step + 1 < len(LADDER):
                        grid.append(LADDER[step + 1])  # widen past a winning edge
                    elif best == grid[0] and step > 0:
                        grid.insert(0, LADDER[step - 1])
                    else:
                        break
                if best in (grid[0], grid[-1]):
                    flagged.append(kind)
                lrs[kind] = best
            with open(args.frozen, "w") as f:
                json.dump({"lrs": lrs, "on_the_edge": flagged, "test_seeds": args.seeds, "targets": args.targets,
                           "steps": args.steps, "tune_seeds": args.tune_seeds, "tune_target": args.tune_target,
                           "grid_start": args.lrs, "evaluate": args.evaluate}, f)
        if args.tune_only:
            print(f"frozen: {open(args.frozen).read()}")
            return
        frozen = json.load(open(args.frozen))
        args.server_rate = frozen.get("server_rate", args.server_rate)
        args.evaluate = frozen.get("evaluate", "inline")
        for seed in (int(s) for s in frozen["test_seeds"].split(",")):
            for kind in kinds:
                runs.append(get(kind, frozen["lrs"][kind], seed, "test"))
    print(report(runs, frozen, targets))


if __name__ == "__main__":
    main()
