#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs in every node of a fabric-net mesh: nccl-mesh-info --doctor, case by case, and checks
its verdicts, its exit status, and that it changed nothing (the node's MTUs and ARP/rp_filter
sysctls are the same before and after).

  doctor_fabric_check.py INFO --nodes N [--reach] [--case [VAR=VALUE,...] [--conf TEXT]
                                         [--expect CHECK=VERDICT]... [--expect-text CHECK=TEXT]...]...

--reach first pings every address this node's link table names (VMESH_LINK_TABLE), which
fills the kernel's ARP table as any traffic does: what tells the doctor a switch from a cable.

Each --case runs the doctor once with the variables given added to (VALUE empty: removed
from) the environment, and --conf TEXT written to a file named by NCCL_CONF_FILE. Checks not
named by --expect must be OK, except those that depend on the machine rather than the mesh
(which NCCL is installed, the shell's memlock limit, the kernel's CMA): those must be present.
--expect-text: the check's finding must contain TEXT.
Prints the doctor's text output prefixed by the case; exit 1 on any mismatch, with a line
"FAIL doctor rank=R: ..." per mismatch.
"""
import argparse
import fcntl
import glob
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

MACHINE_DEPENDENT = {"nccl-pytorch", "nccl-system", "memlock", "cma"}


def node_state():
    """What the doctor must not change: every interface's MTU and the ARP/rp_filter sysctls."""
    state = {}
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _, name in socket.if_nameindex():
        req = struct.pack("16si", name.encode()[:15], 0)
        state["mtu/" + name] = struct.unpack("16si", fcntl.ioctl(sock, 0x8921, req))[1]  # SIOCGIFMTU
    sock.close()
    for path in sorted(glob.glob("/proc/sys/net/ipv4/conf/*/*")):
        if os.path.basename(path) in ("arp_ignore", "arp_announce", "rp_filter"):
            with open(path) as f:
                state[path] = f.read().strip()
    return state


def reach_links(deadline_s=10.0):
    """Pings every peer address of this rank's links until each answers once; the failures."""
    rank = os.environ.get("VMESH_RANK")
    peers = []
    with open(os.environ["VMESH_LINK_TABLE"]) as table:
        for line in table:
            f = line.split()
            if len(f) == 7 and rank in (f[1], f[2]):
                peers.append(f[6] if f[1] == rank else f[5])
    failures = []
    for addr in peers:
        end = time.monotonic() + deadline_s
        while subprocess.run(["ping", "-c", "1", "-W", "1", addr], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL).returncode != 0:
            if time.monotonic() > end:
                failures.append("--reach: no answer from %s in %g s" % (addr, deadline_s))
                break
    return failures


def parse_cases(argv):
    cases, current = [], None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--case":
            current = {"env": {}, "conf": None, "expect": {}, "text": {}}
            cases.append(current)
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                for item in filter(None, argv[i + 1].split(",")):
                    name, _, value = item.partition("=")
                    current["env"][name] = value
                i += 1
        elif arg in ("--conf", "--expect", "--expect-text") and current is not None and i + 1 < len(argv):
            if arg == "--conf":
                current["conf"] = argv[i + 1].replace("\\n", "\n")
            elif arg == "--expect-text":
                name, _, text = argv[i + 1].partition("=")
                current["text"][name] = text
            else:
                name, _, verdict = argv[i + 1].partition("=")
                current["expect"][name] = verdict
            i += 1
        else:
            sys.exit("doctor_fabric_check: unexpected argument %r" % arg)
        i += 1
    return cases or [{"env": {}, "conf": None, "expect": {}, "text": {}}]


def run_case(info, nodes, case, rank, label):
    env = dict(os.environ)
    for name, value in case["env"].items():
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    conf = None
    if case["conf"] is not None:
        conf = tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False)
        conf.write(case["conf"])
        conf.close()
        env["NCCL_CONF_FILE"] = conf.name
    cmd = [info, "--doctor", "--nodes", str(nodes)]
    try:
        text = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        js = subprocess.run(cmd + ["--json"], env=env, capture_output=True, text=True, timeout=60)
    finally:
        if conf is not None:
            os.unlink(conf.name)
    for line in text.stdout.splitlines():
        print("%s %s" % (label, line))
    failures = []
    try:
        report = json.loads(js.stdout)
    except ValueError as e:
        return ["%s: --json is not JSON (%s): %r" % (label, e, js.stdout[:200])]
    verdicts = {c["name"]: c["verdict"] for c in report["checks"]}
    if len(verdicts) < 15:
        failures.append("%s: %d checks, expected at least 15" % (label, len(verdicts)))
    for name, verdict in case["expect"].items():
        if verdicts.get(name) != verdict:
            failures.append("%s: %s is %s, expected %s" % (label, name, verdicts.get(name), verdict))
    found = {c["name"]: c.get("found", "") for c in report["checks"]}
    for name, part in case["text"].items():
        if part not in found.get(name, ""):
            failures.append("%s: %s says %r, expected it to contain %r" % (label, name, found.get(name), part))
    for name, verdict in verdicts.items():
        if name not in case["expect"] and name not in MACHINE_DEPENDENT and verdict != "OK":
            failures.append("%s: %s is %s, expected OK" % (label, name, verdict))
    worst = {"OK": 0, "WARN": 1, "FAIL": 2}[report["verdict"]]
    for run in (text, js):
        if run.returncode != worst:
            failures.append("%s: exit status %d, the worst verdict %s says %d" % (label, run.returncode, report["verdict"], worst))
    return failures


def main():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("info")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--reach", action="store_true")
    args, rest = parser.parse_known_args()
    rank = os.environ.get("VMESH_RANK", "?")
    failures = reach_links() if args.reach else []
    before = node_state()
    for n, case in enumerate(parse_cases(rest)):
        failures += run_case(args.info, args.nodes, case, rank, "case %d:" % (n + 1))
    after = node_state()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed:
        failures.append("the doctor changed the node: " + ", ".join(changed))
    for f in failures:
        print("FAIL doctor rank=%s: %s" % (rank, f))
    print("doctor rank=%s: %s" % (rank, "FAILED" if failures else "as expected"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
