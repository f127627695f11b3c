"""Figures from a step log, for the recovery benchmarks (rg-bench-recovery.sh,
rg-bench-scale.sh, rg-bench-goodput.sh).

A step log is the file of rg-exact's --step-log: rank 0 appends "STEP MS" for every step it
completes (MS: CLOCK_REALTIME milliseconds), so a step redone after a restart appears again.
"""
import os
import statistics
import subprocess


def read(path):
    """The (step, ms) pairs of a step log, in the order they were completed."""
    with open(path) as f:
        return [tuple(map(int, line.split())) for line in f if line.strip()]


def pause_redone(steps, epoch_steps=0):
    """(pause_s, redone, step_s): the longest gap between two completed steps less the median
    gap, the steps completed more than once, and the median gap. With epoch_steps, the gaps
    from an epoch's last step to the next one's first are left out of the longest (a program
    that evaluates and reports at each epoch's end pauses there by design)."""
    times = [t for _, t in steps]
    gaps = [(b - a) / 1000.0 for a, b in zip(times, times[1:])]
    if not gaps:
        raise ValueError("a step log of fewer than two steps")
    normal = statistics.median(gaps)
    redone = len(steps) - len({s for s, _ in steps})
    faults = [gaps[i - 1] for i in fault_ends(steps, epoch_steps)]
    return max(faults or gaps) - normal, redone, normal


def fault_ends(steps, epoch_steps=0):
    """The indices i >= 1 of the steps whose gap from the one before may be a fault's: all,
    less (with epoch_steps) those that go on from an epoch's last step to the next one's."""
    return [i for i in range(1, len(steps)) if not (
        epoch_steps and steps[i - 1][0] % epoch_steps == 0 and
        steps[i][0] == steps[i - 1][0] + 1)]


def pauses(steps, factor=5):
    """The gaps (s) between two completed steps longer than factor x the median gap: where a
    fault stopped the job (its regroup, a replacement's join)."""
    times = [t for _, t in steps]
    gaps = [(b - a) / 1000.0 for a, b in zip(times, times[1:])]
    if not gaps:
        raise ValueError("a step log of fewer than two steps")
    normal = statistics.median(gaps)
    return [g for g in gaps if g > factor * normal]


def lost_after(steps, kills_ms, window_ms, before_ms=400):
    """Per kill (CLOCK_REALTIME ms), the time the steps lost to it (s): the gaps that end from
    the kill to window_ms after it (or the next kill, if sooner), each less the mean gap of
    the steps that ended in the before_ms before the kill. The baseline is the same run's,
    just before, not a fault-free run's, whose speed drifts from run to run on a shared
    machine by as much as a kill costs. A kill with fewer than 5 steps before it in that
    time (the job's start, or right after another kill's pauses) has no figure."""
    times = [t for _, t in steps]
    gaps = [(b, b - a) for a, b in zip(times, times[1:])]
    kills = sorted(kills_ms)
    out = []
    for i, k in enumerate(kills):
        before = [g for t, g in gaps if k - before_ms <= t < k]
        if len(before) < 5:
            continue
        base = sum(before) / len(before)
        end = min(k + window_ms, kills[i + 1]) if i + 1 < len(kills) else k + window_ms
        out.append(sum(g - base for t, g in gaps if k <= t < end) / 1000.0)
    return out


def span_s(steps):
    """From the first completed step to the last, in seconds."""
    return (steps[-1][1] - steps[0][1]) / 1000.0


def stats(xs):
    """Median, min and max, rounded to 4 places."""
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4),
            "max": round(max(xs), 4)}


def build_meta(repo, build):
    """{"commit": ..., "build": ...}: the tree's commit now (with -dirty when it has
    uncommitted changes) and the build directory's CMAKE_BUILD_TYPE."""
    commit = "unknown"
    try:
        commit = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        if dirty:
            commit += "-dirty"
    except (OSError, subprocess.CalledProcessError):
        pass
    btype = "unknown"
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    btype = line.split("=", 1)[1].strip() or "unknown"
    except OSError:
        pass
    return {"commit": commit, "build": btype}
