#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Instructions the ABI layer itself runs per isend / irecv / test (the table's entry point
# and the v8 shim: argument checks and, since the call recorder, its flag), outside guarded()
# and the core, measured with callgrind on rank 0 of the fabric's pair scenario; and what the
# whole call costs, core included ("with the core": it includes polling, so it varies from run
# to run); and the data path's own instructions per posted batch and per completed request
# (where the live counters count). The ABI and data-path counts do not depend on the
# machine's load, so two plugins can be compared on a busy machine.
#   tests/replay/abi_cost.sh BUILD_DIR [PLUGIN_DIR[:VAR=VALUE...]...]   (root; default: BUILD_DIR)
# e.g. a build of the previous commit's plugin in /tmp/base:  abi_cost.sh build /tmp/base build
# the live counters on and off (issue 34):  abi_cost.sh build build build:NCCL_MESH_STATS=0
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
shift
[ $# -gt 0 ] || set -- "$build"
command -v valgrind >/dev/null || { echo "abi_cost: needs valgrind (callgrind)" >&2; exit 2; }
tmp=$(mktemp -d /tmp/mesh-abi-cost.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
n=0
for spec in "$@"; do
  dir=$(cd "${spec%%:*}" && pwd)
  extra=""
  [[ "$spec" == *:* ]] && extra=$(echo "${spec#*:}" | tr ':' ' ')
  n=$((n + 1))
  out=$tmp/run$n.out
  env="LD_LIBRARY_PATH=$dir NCCL_MESH_IBVERBS_LIB=$build/tests/fabric/dropin/libibverbs.so.1 NCCL_MESH_STATS_DIR=$tmp/stats$n $extra"
  "$root/scripts/fabric-net" run --nodes 2 --timeout 280 -- sh -c "if [ \$VMESH_RANK = 0 ]; then
      exec env $env valgrind --tool=callgrind --callgrind-out-file=$out $build/tests/e2e/mesh_e2e pair --deadline 250;
    else exec env $env $build/tests/e2e/mesh_e2e pair --deadline 250; fi" >"$tmp/log" 2>&1 ||
    { tail -20 "$tmp/log"; exit 1; }
  python3 - "$out" "$spec" <<'PY'
import re, subprocess, sys
ENTRY = {"isend": r"v8Isend\(|traced::isendInt<8", "irecv": r"v8Irecv\(|traced::irecvInt<8",
         "test": r"^mesh::abi::test\(void|traced::test<8"}
GUARD = {"isend": r"guarded<mesh::abi::isend\(", "irecv": r"guarded<mesh::abi::postRecv\(",
         "test": r"guarded<mesh::abi::test\("}
def run(args):
    return subprocess.run(["callgrind_annotate", "--threshold=100"] + args + [sys.argv[1]],
                          capture_output=True, text=True).stdout.splitlines()
flat, tree = run(["--inclusive=no"]), run(["--tree=calling", "--inclusive=yes"])
row = []
for k in ENTRY:
    own = sum(int(m.group(1).replace(",", "")) for m in (re.match(r"\s*([\d,]+) \([^)]*\)\s+\S+?:(.*)$", l) for l in flat)
              if m and re.search(ENTRY[k], m.group(2)) and "abi::guarded" not in m.group(2).split("(")[0])
    calls = sum(int(m.group(2)) for m in (re.match(r"\s*[\d,]+ \([^)]*\)\s+>\s+\S+?:(.*) \((\d+)x\)", l) for l in tree)
                if m and re.search(GUARD[k], m.group(1)))
    core = sum(int(m.group(1).replace(",", "")) for m in (re.match(r"\s*([\d,]+) \([^)]*\)\s+>\s+\S+?:(.*) \((\d+)x\)", l) for l in tree)
               if m and re.search(GUARD[k], m.group(2)))
    row.append(f"{k} {own / max(calls, 1):.1f} Ir/call, {core / max(calls, 1):.0f} with the core ({calls} calls)")
# The data path's own instructions (outside the verbs calls) where the live counters count
# (issue 34): per posted batch (Comm::postBatch) and per completed request (Comm::countDone,
# 0 before the counters existed).
def self_cost(sym):
    return sum(int(m.group(1).replace(",", "")) for m in (re.match(r"\s*([\d,]+) \([^)]*\)\s+\S+?:(.*)$", l) for l in flat)
               if m and re.search(sym, m.group(2)))
def calls_of(sym):
    return sum(int(m.group(2)) for m in (re.match(r"\s*[\d,]+ \([^)]*\)\s+>\s+\S+?:(.*) \((\d+)x\)", l) for l in tree)
               if m and re.search(sym, m.group(1)))
batches, done = calls_of(r"mesh::Comm::postBatch\("), calls_of(r"mesh::Comm::countDone\(")
row.append(f"postBatch {self_cost(r'mesh::Comm::postBatch[(]') / max(batches, 1):.1f} Ir/batch ({batches} batches)")
row.append(f"countDone {self_cost(r'mesh::Comm::countDone[(]') / max(done, 1):.1f} Ir/request ({done} requests)")
print(f"abi_cost {sys.argv[2]}: " + "; ".join(row))
PY
done
