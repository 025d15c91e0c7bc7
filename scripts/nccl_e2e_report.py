#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks and tables for scripts/nccl-e2e.sh (standard library only).

  nccl_e2e_report.py check --scenario S --expect pass|record --rc N --seconds T --log F --json F --summary F
      Reads one scenario's log (fabric-net's "[rank] line" output: NCCL's INFO/WARN lines and
      the rank driver's rows) and its JSON rows; appends a verdict line to the summary.
      Exit 0 when the scenario behaved as expected, 1 otherwise.
  nccl_e2e_report.py tables --dir D
      The busbw of every scenario per collective and size, and the ratio tables
      plugin / NCCL IB for the scenario pairs that ran on the same links.

What "as expected" means for a `pass` scenario: every rank exited 0; every result exact
(no wrong element in any row); NCCL's channel lines name the expected network and no other
(NET/Mesh for plugin runs, NET/IB for stock NCCL); the plugin's own INFO lines are present
in plugin runs; NCCL_MIN_NCHANNELS=8 runs show 8 channels over the plugin; reload runs show
NCCL unloading the plugin and loading it again. A `record` scenario always passes: its
outcome (success, or the first errors NCCL and the plugin printed) is what is recorded.
"""

import argparse
import collections
import glob
import json
import os
import re
import sys

LINE = re.compile(r"^\[(\d+)\] (.*)$")
VIA = re.compile(r"Channel (\d+)/\d+ : .*? via NET/(\w+)")


def read_rows(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    rows.append(json.loads(line))
    return rows


def scan_log(path):
    per_rank = collections.defaultdict(list)
    other = []
    with open(path, errors="replace") as f:
        for raw in f:
            m = LINE.match(raw.rstrip("\n"))
            if m:
                per_rank[int(m.group(1))].append(m.group(2))
            else:
                other.append(raw.rstrip("\n"))
    return per_rank, other


def base_name(scenario):
    """A scenario run again is NAME.2, NAME.3 ...: its checks are NAME's."""
    return re.sub(r"\.\d+$", "", scenario)


def expected_net(scenario):
    return "IB" if base_name(scenario).endswith("-ib") else "Mesh"


def check(args):
    rows = read_rows(args.json)
    per_rank, other = scan_log(args.log)
    problems, facts = [], []
    scenario = base_name(args.scenario)
    want = expected_net(scenario)
    nets = collections.Counter()
    channels = collections.defaultdict(set)
    for r, lines in per_rank.items():
        for line in lines:
            for ch, net in VIA.findall(line):
                nets[net] += 1
                if net == "Mesh":
                    channels[r].add(int(ch))
    joined = "\n".join(l for lines in per_rank.values() for l in lines)
    unloads = joined.count("Unloading plugin")
    loads = len(re.findall(r"Successfully loaded external network plugin", joined))
    mesh_info = len(re.findall(r"NET/Mesh", joined))
    warns = [f"[{r}] {l}" for r, lines in sorted(per_rank.items()) for l in lines
             if " WARN " in l or "ERROR" in l or "Error" in l]
    wrong = sum(row["wrong"] for row in rows)
    facts.append(f"rc={args.rc}")
    facts.append(f"{len(rows)} rows")
    facts.append(f"channel lines: " + (", ".join(f"NET/{k} {v}" for k, v in sorted(nets.items())) or "none"))
    if channels:
        facts.append("Mesh channels per rank: " + ", ".join(f"r{r}:{len(c)}" for r, c in sorted(channels.items())))
    if loads or unloads:
        facts.append(f"plugin loaded {loads}x, unloaded {unloads}x")
    # NCCL_MESH_RELAY_TWIN=1 scenarios: the plugin's INFO line for each connection it made
    # over two relays ("... goes through A and B (two relays)").
    twins = joined.count("(two relays)")
    if "-twin" in scenario:
        facts.append(f"two-relay connections: {twins}")

    if args.rehearse:
        # gloo on the CPU: no NCCL log to read. What is left is the driver's own verdict.
        if args.expect == "pass" and (args.rc != 0 or not rows or wrong):
            problems.append(f"rc={args.rc}, {len(rows)} rows, {wrong} wrong element(s)")
    elif args.expect == "pass":
        if args.rc != 0:
            problems.append(f"fabric-net run exited {args.rc}")
        if not rows:
            problems.append("no result rows")
        if wrong:
            problems.append(f"{wrong} wrong element(s)")
        if nets[want] == 0:
            problems.append(f"no channel went via NET/{want}")
        stray = {k: v for k, v in nets.items() if k != want}
        if stray:
            problems.append("channels via other networks: " + ", ".join(f"NET/{k} {v}" for k, v in stray.items()))
        if want == "Mesh" and mesh_info == 0:
            problems.append("no NET/Mesh lines: the plugin never logged")
        if "-twin" in scenario and twins == 0:
            problems.append("no connection went over two relays (NCCL_MESH_RELAY_TWIN=1)")
        if "channels" in scenario and any(len(c) < 8 for c in channels.values()):
            problems.append("fewer than 8 channels over the plugin with NCCL_MIN_NCHANNELS=8")
        if scenario.endswith("-reload") and (unloads < 1 or loads < 2):
            problems.append(f"expected an unload and a second load (loaded {loads}x, unloaded {unloads}x)")
        if "second communicator" not in joined and scenario.endswith(("-reload", "-preload", "-refcount")):
            problems.append("the second communicator never reported")
    verdict = "OK" if not problems else "FAILED"
    if args.expect == "record":
        verdict = "RECORDED"
    line = f"{args.scenario:14s} {verdict:8s} {args.seconds:5d} s  " + "; ".join(facts + problems)
    with open(args.summary, "a") as f:
        f.write(line + "\n")
        if warns and (problems or args.expect == "record"):
            for w in warns[:6]:
                f.write(f"    {w[:300]}\n")
    print(line)
    for w in warns[:6] if (problems or args.expect == "record") else []:
        print(f"    {w[:300]}")
    return 0 if verdict in ("OK", "RECORDED") else 1


def fmt_size(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n}"


def tables(args):
    data = {}
    for path in sorted(glob.glob(os.path.join(args.dir, "*.jsonl"))):
        name = os.path.basename(path)[:-len(".jsonl")]
        rows = read_rows(path)
        if rows:
            data[name] = rows
    for name, rows in data.items():
        by = collections.defaultdict(dict)
        for r in rows:
            by[r["coll"]][r["bytes"]] = r
        print(f"\n## {name}: busbw (GB/s) per size")
        sizes = sorted({r["bytes"] for r in rows})
        colls = list(by)
        print(f"{'size':>8} " + " ".join(f"{c:>14}" for c in colls))
        for s in sizes:
            cells = []
            for c in colls:
                r = by[c].get(s)
                cells.append(f"{r['busbw']:>14.3f}" if r else f"{'-':>14}")
            print(f"{fmt_size(s):>8} " + " ".join(cells))
    pairs = (("pair-plugin", "pair-ib"), ("pair-spark-plugin", "pair-spark-ib"),
             ("pair-spark-nosplit", "pair-spark-ib"), ("pair-spark-port", "pair-spark-ib"),
             ("pair-p2p", "pair-p2p-ib"), ("spark-p2p", "spark-p2p-ib"), ("spark-p2p-port", "spark-p2p-ib"), ("spark-p2p-speed", "spark-p2p-ib"), ("tri-plugin", "tri-ib"),
             ("ring4-ring", "ring4-ib"), ("switch4-plugin", "switch4-ib"))
    # A scenario run again (NAME.2 ...) is compared with the other side's run of the same number.
    suffixes = sorted({name[len(base_name(name)):] for name in data}, key=lambda x: (len(x), x))
    for (mesh, ib), suffix in ((p, x) for p in pairs for x in suffixes):
        mesh, ib = mesh + suffix, ib + suffix
        if mesh not in data or ib not in data:
            continue
        a = {(r["coll"], r["bytes"]): r for r in data[mesh]}
        b = {(r["coll"], r["bytes"]): r for r in data[ib]}
        keys = sorted(set(a) & set(b), key=lambda k: (k[0], k[1]))
        if not keys:
            continue
        print(f"\n## busbw ratio {mesh} / {ib} (same links, same run)")
        colls = sorted({k[0] for k in keys}, key=lambda c: [r["coll"] for r in data[mesh]].index(c))
        sizes = sorted({k[1] for k in keys})
        print(f"{'size':>8} " + " ".join(f"{c:>14}" for c in colls))
        for s in sizes:
            cells = []
            for c in colls:
                if (c, s) in a and (c, s) in b and b[(c, s)]["busbw"] > 0:
                    cells.append(f"{a[(c, s)]['busbw'] / b[(c, s)]['busbw']:>14.2f}")
                else:
                    cells.append(f"{'-':>14}")
            print(f"{fmt_size(s):>8} " + " ".join(cells))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--scenario", required=True)
    c.add_argument("--expect", choices=("pass", "record"), required=True)
    c.add_argument("--rc", type=int, required=True)
    c.add_argument("--seconds", type=int, default=0)
    c.add_argument("--log", required=True)
    c.add_argument("--json", required=True)
    c.add_argument("--summary", required=True)
    c.add_argument("--rehearse", action="store_true", help="gloo rehearsal: no NCCL log lines to check")
    t = sub.add_parser("tables")
    t.add_argument("--dir", required=True)
    args = ap.parse_args()
    return check(args) if args.cmd == "check" else tables(args)


if __name__ == "__main__":
    sys.exit(main())
