#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Tracing on and off in one fabric e2e scenario: both runs must PASS with the same PASS lines
# (times aside), and the traces of the run with tracing on must replay clean (mesh_replay).
#   tests/replay/trace_on_off.sh BUILD_DIR NODES [FABRIC_NET_ARGS... --] SCENARIO [ARGS...]
# Prints "trace_on_off: OK" when all of that holds.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
nodes=$2
shift 2
net=()
if [[ " $* " == *" -- "* ]]; then
  while [ "$1" != "--" ]; do net+=("$1"); shift; done
  shift
fi
scenario=("$@")
dropin=$build/tests/fabric/dropin/libibverbs.so.1
tmp=$(mktemp -d /tmp/mesh-trace-on-off.XXXXXX)
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT

# run off|on: the scenario's PASS lines, times and rates removed, into $tmp/<mode>.pass.
run() {
  local mode=$1 trace=""
  [ "$mode" = on ] && trace="NCCL_MESH_TRACE=$tmp/r\$VMESH_RANK"
  "$root/scripts/fabric-net" run --nodes "$nodes" --timeout 150 "${net[@]}" -- sh -c \
    "$trace exec env LD_LIBRARY_PATH=$build NCCL_MESH_IBVERBS_LIB=$dropin $build/tests/e2e/mesh_e2e ${scenario[*]} --deadline 120" \
    > "$tmp/$mode.log" 2>&1
  local rc=$?
  grep -o 'PASS .*' "$tmp/$mode.log" | sed -E 's/ [a-z_]*_s=[0-9.]+//g; s/ in [0-9.]+ s//g' | sort > "$tmp/$mode.pass"
  if [ $rc -ne 0 ] || [ "$(wc -l < "$tmp/$mode.pass")" -ne "$nodes" ]; then
    echo "trace_on_off: the scenario failed with tracing $mode (exit $rc):"
    tail -30 "$tmp/$mode.log"
    exit 1
  fi
}

run off
run on
if ! diff "$tmp/off.pass" "$tmp/on.pass"; then
  echo "trace_on_off: the PASS lines differ with tracing on (above: < off, > on)"
  exit 1
fi
ntraces=$(ls "$tmp"/r*.trace 2>/dev/null | wc -l)
echo "trace_on_off: ${scenario[0]} passed with tracing off and on, same results; $ntraces trace(s), $(du -ch "$tmp"/r*.trace | tail -1 | cut -f1)"
[ "$ntraces" -ge "$nodes" ] || { echo "trace_on_off: expected a trace per node at least"; exit 1; }
if ! "$build/tests/replay/mesh_replay" run --fabric-net "$root/scripts/fabric-net" --dropin "$dropin" \
     --plugin-dir "$build" --deadline 120 --wait 30 "$tmp"; then
  # The traces are the evidence: keep them (and the two runs' logs) for mesh_replay show.
  kept=$(mktemp -d /tmp/mesh-trace-on-off-failed.XXXXXX)
  cp "$tmp"/r*.trace "$tmp"/*.log "$kept"/ 2>/dev/null
  echo "trace_on_off: the traces just recorded did not replay clean (traces kept in $kept)"
  exit 1
fi
echo "trace_on_off: OK"
