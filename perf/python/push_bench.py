"""Python's push vs C++'s, side by side on the same rxe devices: each round runs
gradlane_ps_push_bw's server on host 0 with, as its one worker, either gradlane_ps_push_bw's
C++ worker (ps::Worker::push) or gradlane.Worker.push from this interpreter — the call
gradlane.torch's DistributedOptimizer.step() makes — pushing -n updates of -s bytes one after
another from host 2. Rounds alternate which goes first. Reports each side's MB/s per round
(bytes × n / first push start → last push end) and the ratio of medians, Python / C++, with the
range of the per-round ratios. The Python worker's gradient is its registered buffer's numpy view:
nothing is copied on the way.
    bash ci/softroce.sh --hosts 3 -- /usr/bin/python3 perf/python/push_bench.py --build build
"""
import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def cpp_worker(args, tool, device, server, out):
    done = subprocess.run([tool, "--role", "worker", "-d", device, "--server", server, "-n", str(args.iters), "-s",
                           str(args.size), "--id", "1", "--out_json", out], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"the C++ worker failed:\n{done.stdout}{done.stderr}")
    rows = json.load(open(out))["results"]
    row = rows[0] if isinstance(rows, list) else rows
    return row["bw_avg"]


def python_worker(args, device, server):
    import gradlane

    worker = gradlane.Worker(gradlane.Device.open(device), server=server, floats=args.size // 4, id=1)
    worker.gradient[:] = 1e-6  # computed once, in registered memory
    started = time.monotonic()
    for step in range(args.iters):
        worker.push(computed_on=0, tag=step)
    seconds = time.monotonic() - started
    worker.settle(30)
    return args.size * args.iters / seconds / 1e6  # MB/s, as perftest's MB/sec (10^6)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", "--iters", type=int, default=64)
    parser.add_argument("-s", "--size", type=int, default=4 << 20)
    parser.add_argument("--port", type=int, default=7960)
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "python"))
    hosts = [tuple(p.split(",")) for p in os.environ.get("GRADLANE_HOSTS", "").split()]
    if len(hosts) < 3:
        sys.exit("needs three emulated hosts: bash ci/softroce.sh --hosts 3 -- python3 perf/python/push_bench.py")
    tool = os.path.join(args.build, "perf", "ps", "gradlane_ps_push_bw")
    if not (os.environ.get("GRADLANE_JOB_KEY") or os.environ.get("GRADLANE_JOB_KEY_FILE")):
        os.environ["GRADLANE_JOB_KEY"] = base64.b64encode(os.urandom(24)).decode()  # one job: every role
    (dev0, addr0), _, (dev2, _) = hosts[:3]
    results = {"cpp": [], "python": []}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            order = ("cpp", "python") if round_ % 2 == 0 else ("python", "cpp")
            for kind in order:
                port = args.port + 2 * round_ + (kind == "python")
                server = subprocess.Popen([tool, "--role", "server", "-d", dev0, "--port", str(port), "--workers", "1",
                                           "-n", str(args.iters), "-s", str(args.size)],
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                time.sleep(1.0)  # listening
                at = f"{addr0}:{port}"
                if kind == "cpp":
                    mbps = cpp_worker(args, tool, dev2, at, os.path.join(scratch, f"w{round_}.json"))
                else:
                    mbps = python_worker(args, dev2, at)
                said = server.communicate(timeout=600)[0]
                if server.returncode != 0:
                    sys.exit(f"the server failed:\n{said}")
                results[kind].append(mbps)
                print(f"round {round_ + 1} {kind:>6}: {mbps:8.1f} MB/s", flush=True)
    ratios = [p / c for p, c in zip(results["python"], results["cpp"])]
    print(f"python / C++ push throughput, {args.size} B x {args.iters}, {args.rounds} rounds: ratio of medians "
          f"{statistics.median(results['python']) / statistics.median(results['cpp']):.3f} "
          f"(per round {min(ratios):.3f}-{max(ratios):.3f}); medians python {statistics.median(results['python']):.1f}, "
          f"C++ {statistics.median(results['cpp']):.1f} MB/s")


if __name__ == "__main__":
    main()
