#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# lease-prep.sh: everything a lent GPU machine's session needs, made here before it is lent
# (issue 33; docs/gpu-machine.md). A session that draws a machine then spends its 15 minutes
# of device time on NCCL, not on building or on composing a command line.
#
#   scripts/lease-prep.sh [--build DIR] [--lease DIR] [--no-rehearse]
#
# 1. builds the plugin, the fabric drop-in, mesh_e2e and mesh_replay in --build (default
#    build/; configured by scripts/setup.sh);
# 2. copies them into --lease (default build-lease/, ignored by git, so the device tool must
#    carry it: carry ["build-lease"]) in the build tree's layout, debug info stripped
#    (objcopy --strip-debug: symbols stay, for a backtrace), and checks that the folder is
#    under the device tool's 64 MiB carry limit;
# 3. writes LEASE/plan.sh, the plan of the next lease in priority order, in two calls:
#      OUT=$OUT bash build-lease/plan.sh 1          # about 430 s: issue 33's ratios first
#      OUT=$OUT bash build-lease/plan.sh 2 [SECS]   # SECS (default 240), if device time is left
#    (the device tool's `run` with timeout_s 560 for call 1; call 2 only when `status` shows
#    enough budget_left_s: a machine start costs minutes too);
# 4. rehearses both calls' scenarios with PyTorch's gloo on this machine's CPU (nccl-e2e.sh
#    --rehearse --quick, PYTHON=/usr/bin/python3; skipped with --no-rehearse or without
#    PyTorch, which it says), so a mistake in the plan shows here.
#
# Exit status: 0 ready; 1 a build, copy, size or rehearsal failed (it says which).
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$REPO/build
LEASE=$REPO/build-lease
REHEARSE=1
CARRY_LIMIT=$((64 * 1024 * 1024))

die() { echo "lease-prep: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift ;;
    --lease) LEASE=$2; shift ;;
    --no-rehearse) REHEARSE=0 ;;
    -h|--help) sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done

[ -f "$BUILD/CMakeCache.txt" ] || die "no configured build tree in $BUILD (scripts/setup.sh)"
cmake --build "$BUILD" -j "$(nproc)" --target nccl-net-mesh meshfab mesh_e2e mesh_replay >"$BUILD/lease-prep.log" 2>&1 ||
  die "the build failed (see $BUILD/lease-prep.log)"

# The files nccl-e2e.sh, bench-fabric.sh --vs-nccl-ib and the trace check take from a build tree.
FILES=(libnccl-net-mesh.so tests/e2e/mesh_e2e tests/replay/mesh_replay
       tests/fabric/dropin/libibverbs.so.1)
rm -rf "$LEASE"
for f in "${FILES[@]}"; do
  mkdir -p "$LEASE/$(dirname "$f")"
  objcopy --strip-debug "$(readlink -f "$BUILD/$f")" "$LEASE/$f" || die "cannot copy $BUILD/$f"
done
ln -s libibverbs.so.1 "$LEASE/tests/fabric/dropin/libibverbs.so"
bytes=$(du -sb "$LEASE" | cut -f1)
[ "$bytes" -lt "$CARRY_LIMIT" ] || die "$LEASE holds $bytes bytes, over the device tool's carry limit ($CARRY_LIMIT)"

# The plan. Untraced where a figure is taken (the recorder costs the plugin a few us per call,
# which NCCL IB does not pay); alternating plugin / NCCL IB runs give the spread. Call 1 is
# issue 33's open figure (NCCL's send/receive, one cable and a Spark cable, since the test()
# fix), then the plugin beside NCCL IB without a GPU on 16 cores (bench-fabric, run directly:
# --cap would cut it); call 2 the Spark p2p with the one device at both functions' speed (NCCL
# then builds channels as for NCCL IB's two devices), the collectives and the relayed Spark
# 4-ring with today's defaults; last, if its deadline leaves room, 4 nodes on a switch, the
# one 4-node layout where the plugin and NCCL IB both run.
CALL1_ONLY="pair-p2p,pair-p2p-ib,spark-p2p,spark-p2p-ib,pair-p2p,pair-p2p-ib,spark-p2p,spark-p2p-ib,\
pair-p2p,pair-p2p-ib,spark-p2p-port,spark-p2p-ib"
CALL2_ONLY="spark-p2p-speed,spark-p2p-ib,pair-plugin,pair-ib,ring4-spark-tree,ring4-spark-tree-twin,ring4-spark-a2a,ring4-spark-a2a-twin,\
pair-spark-plugin,pair-spark-ib,relay-bench-twin,switch4-plugin,switch4-ib"
cat >"$LEASE/plan.sh" <<EOF
#!/usr/bin/env bash
# Written by scripts/lease-prep.sh at $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?') on $(date -u +%Y-%m-%d): the next
# lease's plan (docs/gpu-machine.md). Run from the repository root on the lent machine:
#   OUT=\$OUT bash build-lease/plan.sh 1           # about 430 s
#   OUT=\$OUT bash build-lease/plan.sh 2 [SECS]    # SECS: its deadline (default 240)
set -uo pipefail
: "\${OUT:?OUT must name the folder whose files come back}"
cd "\$(dirname "\$0")/.."
case "\${1:-}" in
  1) scripts/gpu-lease.sh --mps --build build-lease --deadline 310 --cap 30 --max-bytes 256M --no-trace \\
       --only $CALL1_ONLY
     rc=\$?
     lib=\$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
     timeout 120 scripts/bench-fabric.sh --vs-nccl-ib --rounds 3 --build build-lease \\
       --figures sendrecv,sendrecv_oldest,ring,spark_sendrecv \\
       \${lib:+--nccl "\$lib"} --out "\$OUT/vs" >"\$OUT/vs-nccl-ib.txt" 2>&1
     echo "bench-fabric --vs-nccl-ib: exit \$?" >>"\$OUT/vs-nccl-ib.txt"
     exit "\$rc" ;;
  2) exec scripts/gpu-lease.sh --mps --build build-lease --deadline "\${2:-240}" --cap 40 --max-bytes 256M --no-trace \\
       --only $CALL2_ONLY ;;
  *) echo "usage: OUT=DIR bash build-lease/plan.sh 1|2 [SECS]" >&2; exit 2 ;;
esac
EOF
chmod +x "$LEASE/plan.sh"
echo "lease-prep: $LEASE ready ($((bytes / 1024)) KiB; carry [\"$(basename "$LEASE")\"]), plan: $LEASE/plan.sh 1|2"

[ "$REHEARSE" -eq 1 ] || exit 0
if ! /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
  echo "lease-prep: no PyTorch for /usr/bin/python3 (apt-get install python3-torch): the plan is not rehearsed"
  exit 0
fi
for call in 1 2; do
  only=$CALL1_ONLY
  [ "$call" = 2 ] && only=$CALL2_ONLY
  out=$(mktemp -d)
  if ! PYTHON=/usr/bin/python3 "$REPO/scripts/nccl-e2e.sh" --rehearse --quick --build "$LEASE" --out "$out" \
      --only "$only" >"$out.log" 2>&1; then
    tail -20 "$out.log" >&2
    rm -rf "$out" "$out.log"
    die "the rehearsal of call $call failed (above)"
  fi
  echo "lease-prep: call $call rehearsed: $(grep -c ' OK ' "$out/summary.txt" 2>/dev/null || echo 0) scenario runs OK"
  rm -rf "$out" "$out.log"
done
