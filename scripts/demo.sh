#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# demo.sh: the README's first command. Sets everything up (scripts/setup.sh: packages,
# build, lab kernel), then boots a 3-node virtual RDMA mesh (QEMU + Soft-RoCE, one cable
# per pair of nodes, each its own subnet) and runs a ring all-reduce through the plugin's
# ABI on it. Every rank prints which local port carries each neighbour's traffic and the
# measured all-reduce bandwidth.
#
#   scripts/demo.sh [--nodes N] [--topology full|ring] [--build DIR]
#     --build DIR  the CMake build tree to run (default build/, the one setup.sh builds;
#                  another must hold mesh_e2e and the plugin, built with -DMESH_BUILD_TESTS=ON)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
nodes=3
topology=full
build=$REPO/build
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=$2; shift ;;
    --topology) topology=$2; shift ;;
    --build) build=$(cd "$2" && pwd); shift ;;
    -h|--help) sed -n '2,/^set -euo pipefail/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "demo.sh: unknown option '$1'" >&2; exit 64 ;;
  esac
  shift
done

cd "$REPO"
scripts/setup.sh
echo "demo: booting a $nodes-node $topology mesh (QEMU, Soft-RoCE); this takes about a minute"
exec scripts/vmesh run --build "$build" --nodes "$nodes" --topology "$topology" -- \
  env LD_LIBRARY_PATH="$build" "$build/tests/e2e/mesh_e2e" demo
