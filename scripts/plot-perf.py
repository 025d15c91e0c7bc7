#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""plot-perf.py: a PNG of nccl-mesh-perf's results, bandwidth (and latency) over size.

usage: plot-perf.py RESULTS.csv [MORE.csv ...] [-o OUT.png] [--title TEXT] [--print]

RESULTS.csv is what `nccl-mesh-perf --client HOST --csv RESULTS.csv` wrote. Several files
are drawn as several lines (e.g. one run per cable), labelled by file name. The PNG has
busbw (GB/s) over message size and, when the runs measured it, latency (us) over size.
--print lists the series instead of drawing them (no matplotlib needed).

Needs matplotlib (Debian/Ubuntu: apt-get install python3-matplotlib; or pip install
matplotlib). Exit status: 0 written; 1 bad input; 2 bad command line; 3 no matplotlib.
"""
import argparse
import csv
import os
import sys


def read_results(path):
    """{'bandwidth': [(size, busbw_GBps)], 'latency': [(size, time_us)]} from one CSV."""
    series = {"bandwidth": [], "latency": []}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        need = {"test", "size_bytes", "time_us", "busbw_GBps"}
        if reader.fieldnames is None or not need.issubset(reader.fieldnames):
            raise ValueError(f"{path}: not a nccl-mesh-perf CSV (columns: {reader.fieldnames})")
        for row in reader:
            size = int(row["size_bytes"])
            if row["test"] == "bandwidth":
                series["bandwidth"].append((size, float(row["busbw_GBps"])))
            elif row["test"] == "latency":
                series["latency"].append((size, float(row["time_us"])))
    for points in series.values():
        points.sort()
    return series


def size_label(size):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def draw(runs, out, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot-perf.py: matplotlib is not installed (Debian/Ubuntu: apt-get install "
              "python3-matplotlib; or: pip install matplotlib). The CSV has every figure; "
              "--print lists them.", file=sys.stderr)
        return 3
    with_lat = any(r["latency"] for _, r in runs)
    fig, axes = plt.subplots(1, 2 if with_lat else 1, figsize=(12 if with_lat else 7, 4.5), squeeze=False)
    panels = [("bandwidth", "busbw (GB/s)", axes[0][0])]
    if with_lat:
        panels.append(("latency", "latency, half round trip (us)", axes[0][1]))
    for key, ylabel, ax in panels:
        sizes = set()
        for label, r in runs:
            if r[key]:
                xs, ys = zip(*r[key])
                sizes.update(xs)
                ax.plot(xs, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        if key == "latency":
            ax.set_yscale("log")
        ticks = sorted(sizes)
        ax.set_xticks(ticks)
        ax.set_xticklabels([size_label(s) for s in ticks], rotation=45)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if len(runs) > 1:
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"plot-perf.py: wrote {out}")
    return 0


def main(argv):
    parser = argparse.ArgumentParser(description="Plot nccl-mesh-perf CSV results as a PNG.")
    parser.add_argument("csv", nargs="+", help="CSV written by nccl-mesh-perf --csv")
    parser.add_argument("-o", "--output", default="nccl-mesh-perf.png", help="PNG to write")
    parser.add_argument("--title", default="nccl-mesh-perf", help="figure title")
    parser.add_argument("--print", action="store_true", help="list the series, draw nothing")
    args = parser.parse_args(argv)
    runs = []
    try:
        for path in args.csv:
            runs.append((os.path.basename(path), read_results(path)))
    except (OSError, ValueError, KeyError) as e:
        print(f"plot-perf.py: {e}", file=sys.stderr)
        return 1
    if not any(r["bandwidth"] or r["latency"] for _, r in runs):
        print("plot-perf.py: no bandwidth or latency rows in the input", file=sys.stderr)
        return 1
    if args.print:
        for label, r in runs:
            for key in ("bandwidth", "latency"):
                for size, value in r[key]:
                    print(f"{label} {key} {size} {value:g}")
        return 0
    return draw(runs, args.output, args.title)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
