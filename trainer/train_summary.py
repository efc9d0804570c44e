#!/usr/bin/env python3
"""Summarises one gradlane_train run directory: the workers' counters, the server's applied
log (delays), the evaluation. Prints a table and writes summary.json next to the inputs."""
import csv
import glob
import json
import os
import statistics
import sys


def read_json(path):
    """The JSON at `path`, or None when it is missing or cut short (a run that was killed)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main(out):
    server = json.load(open(os.path.join(out, "server.stats.json")))
    accuracy = json.load(open(os.path.join(out, "accuracy.json")))
    workers = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(out, "worker*.json")))]
    # The version each pushed gradient was computed on, by the sequence it was applied as.
    # aggregate mode: the workers' sequences are the aggregator's; what the server applied is
    # in the aggregator's log (computed_on: the oldest member's) with its member count.
    # gradlane mode with an aggregator: a redirected push names its aggregate; the aggregator's
    # log says which sequence each aggregate became, computed on its oldest member's version.
    computed_on, gradients_in, members_on = {}, {}, {}
    direct_aggregation = server["mode"] == "aggregate"
    for path in glob.glob(os.path.join(out, "worker*.pushes.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row["dropped"] != "0" or row["lost"] != "0" or direct_aggregation:
                    continue
                if row.get("aggregate", "0") != "0":
                    members_on.setdefault(int(row["aggregate"]), []).append(int(row["computed_on"]))
                else:
                    computed_on[int(row["sequence"])] = int(row["computed_on"])
    aggregated = os.path.exists(os.path.join(out, "aggregator.updates.csv"))
    if aggregated:
        with open(os.path.join(out, "aggregator.updates.csv")) as f:
            for row in csv.DictReader(f):
                if row["lost"] == "0":
                    sequence = int(row["sequence"])
                    on = members_on.get(int(row["group"])) if not direct_aggregation else None
                    computed_on[sequence] = min(on) if on else int(row["computed_on"])
                    gradients_in[sequence] = int(row["members"])
    # Delay of an applied gradient = updates applied before it − the version it was computed on.
    # gradients.csv: the gradients summed into the model through each sequence (gradients to a
    # target accuracy, read at the version that reached it).
    delays, applied_before, gradients_applied, through = [], 0, 0, []
    with open(os.path.join(out, "server.applied.csv")) as f:
        for row in csv.DictReader(f):
            if row["skipped"] == "1":
                continue
            if int(row["sequence"]) in computed_on:
                delays.append(applied_before - computed_on[int(row["sequence"])])
            gradients_applied += gradients_in.get(int(row["sequence"]), 1)
            through.append(f"{row['sequence']},{gradients_applied}\n")
            applied_before += 1
    with open(os.path.join(out, "gradients.csv"), "w") as f:
        f.write("sequence,gradients\n" + "".join(through))
    # Bytes into the server's host (the bridge port's transmit counter), when the job recorded them.
    server_ingress = None
    link_path = os.path.join(out, "link-bytes.json")
    if os.path.exists(link_path):
        link = json.load(open(link_path))
        if "h0" in link["before"] and "h0" in link["after"]:
            server_ingress = link["after"]["h0"]["rx"] - link["before"]["h0"]["rx"]
    with open(os.path.join(out, "delays.csv"), "w") as f:
        f.write("delay\n" + "".join(f"{d}\n" for d in delays))
    computed = sum(w["steps"] - w.get("skipped_steps", 0) for w in workers)  # backup: steps it joined late
    dropped = sum(w["dropped"] for w in workers)
    summary = {
        "mode": server["mode"], "workers": len(workers), "gradients_computed": computed,
        "applied": server["applied"], "gradients_applied": gradients_applied,
        "server_ingress_bytes": server_ingress, "dropped": dropped, "lost": sum(w["lost"] for w in workers),
        "holes": server["skipped"], "seconds": server["seconds"],
        "ssp_waits": sum(w.get("ssp_waits", 0) for w in workers),
        "updates_per_s": server["applied"] / server["seconds"] if server["seconds"] > 0 else 0,
        "delay_median": statistics.median(delays) if delays else None,
        "delay_max": max(delays) if delays else None,
        "delay_p90": sorted(delays)[int(0.9 * (len(delays) - 1))] if delays else None,
        "final_accuracy": accuracy["final_accuracy"], "best_accuracy": accuracy["best_accuracy"],
        "target": accuracy["target"], "time_to_target_s": accuracy["time_to_target_s"],
        "worker_compute_s": sum(w["compute_s"] for w in workers) / max(len(workers), 1),
        "worker_push_s": sum(w["push_s"] for w in workers) / max(len(workers), 1),
        "worker_pull_s": sum(w["pull_s"] for w in workers) / max(len(workers), 1),
    }
    json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
    t = summary["time_to_target_s"]
    print(f"summary [{summary['mode']}]: {computed} gradients computed, {summary['applied']} updates applied"
          + (f" ({gradients_applied} gradients summed in)" if aggregated else "") + ", "
          f"{dropped} dropped, {summary['lost']} lost, {summary['holes']} holes in {summary['seconds']:.1f} s "
          f"({summary['updates_per_s']:.1f} updates/s)")
    print(f"  delay (versions) median {summary['delay_median']}, p90 {summary['delay_p90']}, max {summary['delay_max']}; "
          f"accuracy final {summary['final_accuracy']:.4f}, best {summary['best_accuracy']:.4f}; "
          f"time to {summary['target']:.2f}: " + ("not reached" if t is None else f"{t:.1f} s"))
    if server_ingress is not None:
        print(f"  server ingress {server_ingress / 1e6:.2f} MB "
              f"({server_ingress / max(gradients_applied, 1) / 1e3:.1f} kB per gradient applied)")
    print(f"  per worker: compute {summary['worker_compute_s']:.1f} s, push {summary['worker_push_s']:.1f} s, "
          f"pull/barrier {summary['worker_pull_s']:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1])
