#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# demo.sh: the README's first command. Sets everything up (scripts/setup.sh: packages,
# build, lab kernel), then boots a 3-node virtual RDMA mesh (QEMU + Soft-RoCE, one cable
# per pair of nodes, each its own subnet) and runs a ring all-reduce through the plugin's
# ABI on it. Every rank prints which local port carries each neighbour's traffic and the
# measured all-reduce bandwidth.
#
#   scripts/demo.sh [--nodes N] [--topology full|ring]
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
nodes=3
topology=full
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=$2; shift ;;
    --topology) topology=$2; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown option '$1'" >&2; exit 64 ;;
  esac
  shift
done

cd "$REPO"
scripts/setup.sh
echo "demo: booting a $nodes-node $topology mesh (QEMU, Soft-RoCE); this takes about a minute"
exec scripts/vmesh run --build-dir build --nodes "$nodes" --topology "$topology" -- \
  env LD_LIBRARY_PATH="$REPO/build" "$REPO/build/tests/e2e/mesh_e2e" demo
