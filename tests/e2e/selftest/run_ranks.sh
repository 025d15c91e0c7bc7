#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Runs one command as every rank of a pretend mesh on this host, the way vmesh runs it in
# every guest: VMESH_RANK/NODES/TOPOLOGY/LINKS set, VMESH_SHARED a fresh shared directory,
# LD_LIBRARY_PATH the plugin directory. Output lines are prefixed "[rank] "; exits 0 only
# when every rank exits 0.
#
# usage: run_ranks.sh NODES TOPOLOGY LINKS PLUGIN_DIR [NAME=VALUE ...] -- CMD [ARGS...]
set -u
[ $# -ge 6 ] || { echo "usage: $0 NODES TOPOLOGY LINKS PLUGIN_DIR [NAME=VALUE ...] -- CMD..." >&2; exit 2; }
nodes=$1 topology=$2 links=$3 plugin_dir=$4
shift 4
extra_env=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    extra_env+=("$1")
    shift
done
[ "${1:-}" = "--" ] || { echo "$0: missing -- before the command" >&2; exit 2; }
shift

shared=$(mktemp -d "${TMPDIR:-/tmp}/mesh-e2e-selftest.XXXXXX") || exit 2
trap 'rm -rf "$shared"' EXIT

pids=()
for ((rank = 0; rank < nodes; rank++)); do
    (
        env VMESH_RANK=$rank VMESH_NODES="$nodes" VMESH_TOPOLOGY="$topology" VMESH_LINKS="$links" \
            VMESH_SHARED="$shared" LD_LIBRARY_PATH="$plugin_dir" "${extra_env[@]}" "$@" 2>&1 |
            sed -u "s/^/[$rank] /"
        exit "${PIPESTATUS[0]}"
    ) &
    pids+=($!)
done
status=0
for ((rank = 0; rank < nodes; rank++)); do
    wait "${pids[$rank]}"
    rc=$?
    echo "run_ranks: rank $rank exited $rc"
    [ "$rc" = 0 ] || status=1
done
exit $status
