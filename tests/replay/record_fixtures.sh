#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Records the replay fixtures: tests/e2e's scenarios on the userspace fabric with the plugin's
# recorder on (NCCL_MESH_TRACE), one trace per rank, copied to OUT/<scenario>/r<rank>.trace.
#   tests/replay/record_fixtures.sh [BUILD_DIR] [OUT_DIR]     (root; default build/, tests/replay/fixtures)
# Needs the plugin, mesh_e2e and the fabric's drop-in built in BUILD_DIR:
#   cmake --build BUILD_DIR --target nccl-net-mesh mesh_e2e meshfab
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=${2:-$root/tests/replay/fixtures}
dropin=$build/tests/fabric/dropin/libibverbs.so.1
e2e=$build/tests/e2e/mesh_e2e
for f in "$dropin" "$e2e" "$build/libnccl-net-mesh.so"; do
  [ -e "$f" ] || { echo "record_fixtures: $f is missing: build nccl-net-mesh, mesh_e2e and meshfab first" >&2; exit 2; }
done
tmp=$(mktemp -d /tmp/mesh-record.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# record NAME NODES [FABRIC_NET_ARGS...] -- SCENARIO ARGS...
record() {
  local name=$1 nodes=$2 net=()
  shift 2
  while [ "$1" != "--" ]; do net+=("$1"); shift; done
  shift
  mkdir -p "$tmp/$name"
  "$root/scripts/fabric-net" run --nodes "$nodes" --timeout 150 "${net[@]}" -- sh -c \
    "NCCL_MESH_TRACE=$tmp/$name/r\$VMESH_RANK exec env LD_LIBRARY_PATH=$build NCCL_MESH_IBVERBS_LIB=$dropin $e2e $* --deadline 120"
  rm -rf "${out:?}/$name"
  mkdir -p "$out/$name"
  for f in "$tmp/$name"/r*.trace; do
    local rank
    rank=$(basename "$f")
    cp "$f" "$out/$name/${rank%%.*}.trace"
  done
  echo "record_fixtures: $name: $(ls "$out/$name" | wc -l) trace(s), $(du -sh "$out/$name" | cut -f1)"
}

# A pair: every size, 32 outstanding, grouped receives of 8, short sends (tests/e2e README).
record pair 2 -- pair
# A triangle: a ring all-reduce over the three cables, 2 comm pairs per neighbour.
record triangle 3 -- allreduce --pairs 2 --count 65536 --iters 1
# A 4-ring with the relay: NCCL's ring first, then the tree, PAT and all-to-all patterns, whose
# diagonal pairs go through a neighbour's relay.
record ring4_relay_patterns 4 --topology ring --env NCCL_MESH_RELAY=auto \
  -- patterns --ring-first --count 4099 --alltoall-bytes 8195 --iters 1
# The pair again as NCCL's threads would make the calls: connection setup, registration and
# closes on one thread (NCCL's proxy service thread), isend/irecv/iflush/test on another (its
# progress thread): the replay must order the two through the objects they share.
rm -rf "$out/pair_two_threads"
mkdir -p "$out/pair_two_threads"
for f in "$out"/pair/r*.trace; do
  awk 'body && $4 ~ /^(isend|irecv|iflush|test)$/ { $3 = 2 } body && $4 !~ /^(isend|irecv|iflush|test)$/ { $3 = 1 }
       { print } $1 == "records" { body = 1 }' "$f" > "$out/pair_two_threads/$(basename "$f")"
done
echo "record_fixtures: pair_two_threads: the pair's traces on two threads"
du -sh "$out"
