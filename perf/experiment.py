"""What the training experiments share: the statistics of the tune / freeze / test protocol
(a sustained crossing of a target, the ratio of medians with a paired bootstrap interval), the
learning-rate grid's widening step, and the report's number formats. Imported by
perf/sched/train-sim-experiment and perf/train/train-softroce-experiment; unit-tested through
tests/scripts/train_sim_experiment_test.py."""
import json
import os
import random
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUSTAIN = 2  # evaluations after the crossing that must also stay at or above the target
RESAMPLES = 10000
BOOT_SEED = 20240601


def sustained_crossing(curve, target, sustain=SUSTAIN):
    """Index into curve of the first evaluation at or above target whose next `sustain`
    evaluations also stay at or above it; None if there is none (a crossing too close to the
    end of the run to be confirmed is none)."""
    acc = [p["accuracy"] for p in curve]
    for i in range(len(acc) - sustain):
        if all(a >= target for a in acc[i:i + sustain + 1]):
            return i
    return None


def at_target(run, target, key="t_ms"):
    """The curve's `key` (t_ms, gradients, server_ingress_bytes, updates) at the sustained
    crossing of target; None if not reached."""
    i = sustained_crossing(run["curve"], target)
    return None if i is None else run["curve"][i][key]


def percentile(sorted_values, q):
    """Linear interpolation between closest ranks (numpy's default) of an ascending list."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    a, b = sorted_values[lo], sorted_values[hi]
    if a == b or pos == lo:  # also keeps an infinite value (never reached) from making nan
        return a
    return a + (b - a) * (pos - lo)


def _median_inf(values):
    """Median with None = never (infinite): finite while fewer than half are never."""
    return statistics.median([float("inf") if v is None else v for v in values])


def _ratio(a, b):
    if a == float("inf") and b == float("inf"):
        return float("nan")
    if b == 0:
        return float("nan")
    return a / b


def ratio_of_medians(mode_values, ref_values, resamples=RESAMPLES, seed=BOOT_SEED):
    """(point, low, high): median(mode) / median(ref) over paired per-seed values (index i is
    seed i in both; None = not reached, counted as infinite), and the 2.5 / 97.5 percentiles of
    the same ratio over `resamples` resamplings of the seeds with replacement (the same seeds
    drawn for both). low/high are None when some resample has no defined ratio (both medians
    infinite)."""
    n = len(mode_values)
    assert n == len(ref_values) and n > 0
    point = _ratio(_median_inf(mode_values), _median_inf(ref_values))
    rng = random.Random(seed)
    got = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        got.append(_ratio(_median_inf([mode_values[i] for i in idx]), _median_inf([ref_values[i] for i in idx])))
    if any(x != x for x in got):  # nan
        return point, None, None
    got.sort()
    return point, percentile(got, 0.025), percentile(got, 0.975)


# ---------------------------------------------------------------- grid

def lr_text(lr):
    return f"{lr:g}"


def widen(lr, other, up):
    """The next grid point beyond edge `lr` (`other`: its neighbour inside the grid): half-decades
    (1, 3, 10, 30 ...) when lr's mantissa is 1 or 3, else the ratio of the two edge points."""
    mantissa = float(f"{lr:e}".split("e")[0])
    if abs(mantissa - 1) < 1e-9:
        nxt = lr * 3 if up else lr * 0.3
    elif abs(mantissa - 3) < 1e-9:
        nxt = lr * 10 / 3 if up else lr / 3
    else:
        step = max(lr, other) / min(lr, other) if other else 10 ** 0.5
        nxt = lr * step if up else lr / step
    return float(f"{nxt:.3g}")


# ---------------------------------------------------------------- files and formats

def load(path):
    with open(path) as f:
        return json.load(f)


def fmt(v, digits=0, scale=1.0):
    return "—" if v is None else f"{v * scale:,.{digits}f}"


def fmt_range(values, digits=0, scale=1.0):
    """median [min–max] over the seeds that have a value, and how many do."""
    got = [v * scale for v in values if v is not None]
    if not got:
        return f"not reached (0/{len(values)})"
    text = f"{statistics.median(got):,.{digits}f} [{min(got):,.{digits}f}–{max(got):,.{digits}f}]"
    return text + (f" ({len(got)}/{len(values)} reached)" if len(got) < len(values) else "")


def fmt_ratio(point, lo, hi):
    def one(x):
        return "∞" if x == float("inf") else "n/a" if x != x else f"{x:.2f}"
    if point != point:
        return "n/a (neither reached)"
    return f"{one(point)} [{one(lo)}–{one(hi)}]" if lo is not None else f"{one(point)} [undefined]"


def verdict(point, lo, hi):
    if lo is None or point != point:
        return "undetermined"
    if hi < 1:
        return "faster"
    if lo > 1:
        return "slower"
    return "tie (interval includes 1)"


def git_state():
    def git(*a):
        return subprocess.run(["git", "-C", ROOT] + list(a), capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return commit, dirty
