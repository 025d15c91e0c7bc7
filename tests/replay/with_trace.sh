#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs a command with the plugin's recorder on (NCCL_MESH_TRACE into a fresh temporary
# directory, removed afterwards) and returns its exit status.
#   tests/replay/with_trace.sh COMMAND [ARGS...]
dir=$(mktemp -d /tmp/mesh-trace.XXXXXX) || exit 2
chmod 755 "$dir"
NCCL_MESH_TRACE=$dir/t "$@"
rc=$?
echo "with_trace: $(find "$dir" -name '*.trace' | wc -l) trace(s) written"
rm -rf "$dir"
exit $rc
