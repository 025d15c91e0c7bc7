#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Instructions the ABI layer itself runs per isend / irecv / test (the table's entry point
# and the v8 shim: argument checks and, since the call recorder, its flag), outside guarded()
# and the core, measured with callgrind on rank 0 of the fabric's pair scenario. Counts do not
# depend on the machine's load, so two plugins can be compared on a busy machine.
#   tests/replay/abi_cost.sh BUILD_DIR [PLUGIN_DIR...]    (root; PLUGIN_DIR default: BUILD_DIR)
# e.g. a build of the previous commit's plugin in /tmp/base:  abi_cost.sh build /tmp/base build
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
shift
[ $# -gt 0 ] || set -- "$build"
command -v valgrind >/dev/null || { echo "abi_cost: needs valgrind (callgrind)" >&2; exit 2; }
tmp=$(mktemp -d /tmp/mesh-abi-cost.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for dir in "$@"; do
  dir=$(cd "$dir" && pwd)
  out=$tmp/$(echo "$dir" | tr / _).out
  env="LD_LIBRARY_PATH=$dir NCCL_MESH_IBVERBS_LIB=$build/tests/fabric/dropin/libibverbs.so.1"
  "$root/scripts/fabric-net" run --nodes 2 --timeout 280 -- sh -c "if [ \$VMESH_RANK = 0 ]; then
      exec env $env valgrind --tool=callgrind --callgrind-out-file=$out $build/tests/e2e/mesh_e2e pair --deadline 250;
    else exec env $env $build/tests/e2e/mesh_e2e pair --deadline 250; fi" >"$tmp/log" 2>&1 ||
    { tail -20 "$tmp/log"; exit 1; }
  python3 - "$out" "$dir" <<'PY'
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
    row.append(f"{k} {own / max(calls, 1):.1f} Ir/call ({calls} calls)")
print(f"abi_cost {sys.argv[2]}: " + "; ".join(row))
PY
done
