#!/usr/bin/env python3
"""Log-log plot of rg-bench-rdzv's per-round counts against the job's size.

  bench/plot_rdzv.py --label=before A.json [B.json ...] --label=after C.json ... --out=F.png

Each file holds the bench's JSON lines; the jobs ("bench": "rdzv") of one label are pooled
and each point is the median over them at that N. Needs python3-matplotlib
(scripts/setup.sh --bench).
"""
import json
import statistics
import sys

QUANTITIES = [
    ("events to each agent while a round forms", lambda d: d["form"]["agent_events"]["median"]),
    ("etcd: events sent in the loss' round", lambda d: d["loss"]["etcd_events"]),
    ("etcd: MB sent in the loss' round", lambda d: d["loss"]["etcd_sent_bytes"] / 1e6),
]


def parse(argv):
    series, out, label = {}, None, None
    for a in argv:
        if a.startswith("--label="):
            label = a.split("=", 1)[1]
            series.setdefault(label, [])
        elif a.startswith("--out="):
            out = a.split("=", 1)[1]
        elif label is None:
            sys.exit("plot_rdzv: a file before any --label=")
        else:
            series[label].append(a)
    if out is None or not series:
        sys.exit(__doc__)
    return series, out


def jobs(paths):
    by_n = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                d = json.loads(line)
                if d.get("bench") == "rdzv":
                    by_n.setdefault(d["nodes"], []).append(d)
    return by_n


def main():
    series, out = parse(sys.argv[1:])
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(QUANTITIES), figsize=(5 * len(QUANTITIES), 4))
    for ax, (title, get) in zip(axes, QUANTITIES):
        for label, paths in series.items():
            by_n = jobs(paths)
            ns = sorted(by_n)
            ys = [statistics.median(get(d) for d in by_n[n]) for n in ns]
            ax.plot(ns, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("nodes (agents)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main()
