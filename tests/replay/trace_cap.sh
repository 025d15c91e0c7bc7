#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# NCCL_MESH_TRACE_MAX: a job that records more than the cap still runs as it would; each
# trace stops at the cap with "end cap" and still parses, and each process logs the cap once.
#   tests/replay/trace_cap.sh BUILD_DIR        (root) prints "trace_cap: OK" when all holds
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
tmp=$(mktemp -d /tmp/mesh-trace-cap.XXXXXX)
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "trace_cap: $*"; tail -20 "$tmp/log"; exit 1; }

"$root/scripts/fabric-net" run --nodes 2 --timeout 150 --env NCCL_MESH_TRACE_MAX=64K -- sh -c \
  "NCCL_MESH_TRACE=$tmp/r\$VMESH_RANK exec env LD_LIBRARY_PATH=$build \
   NCCL_MESH_IBVERBS_LIB=$build/tests/fabric/dropin/libibverbs.so.1 $build/tests/e2e/mesh_e2e relay --big 0 --messages 2000 \
   --deadline 120" >"$tmp/log" 2>&1 || fail "relay failed with a capped trace"
[ "$(grep -c 'PASS relay' "$tmp/log")" -eq 2 ] || fail "expected two PASS lines"
warns=$(grep -c 'reached NCCL_MESH_TRACE_MAX' "$tmp/log")
[ "$warns" -eq 2 ] || fail "expected one cap WARN per rank, got $warns"
for f in "$tmp"/r*.trace; do
  size=$(stat -c %s "$f")
  [ "$size" -le 65536 ] || fail "$f is $size bytes, over the 64K cap"
  [ "$(tail -1 "$f")" = "end cap" ] || fail "$f does not end with 'end cap'"
  echo "trace_cap: $(basename "$f"): $size bytes, ends with 'end cap'"
done
# Both still parse and place; mesh_replay says where they stop.
"$build/tests/replay/mesh_replay" check "$tmp" | grep -c "stopped early: cap" | grep -qx 2 ||
  fail "mesh_replay check does not read both capped traces"
echo "trace_cap: OK"
