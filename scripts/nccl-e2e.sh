#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# nccl-e2e.sh: real NCCL (through PyTorch) drives the plugin on a GPU machine, side by side
# with NCCL's own IB transport on the same links.
#
# Every rank is its own NCCL node (NCCL_HOSTID) in its own network namespace, cabled by
# scripts/fabric-net exactly like the QEMU lab (p<j> = the port cabled to node j), with the
# userspace RoCE fabric (tests/fabric) as the RDMA devices: the GPU machine's kernel has no
# RDMA. All ranks share the machine's one GPU. GPUDirect is off (NCCL_NET_GDR_LEVEL=LOC):
# the fabric serves host memory only, so NCCL stages through host buffers, as it does on a
# DGX Spark.
#
# Scenarios (each: one fabric-net run; logs and JSON rows under --out):
#   tri-plugin      3-node triangle, NCCL_NET_PLUGIN=mesh NCCL_NET=Mesh: all_reduce,
#                   all_gather, reduce_scatter, broadcast, alltoall, batch_isend_irecv,
#                   8 B .. 256 MiB, every result checked
#   tri-ib          the same triangle with NCCL's IB transport (drop-in libibverbs,
#                   NCCL_IB_HCA per rank): what stock NCCL does on a switchless triangle
#   pair-plugin     2 nodes, one cable: the plugin ...
#   pair-ib         ... and NCCL IB on the same link: the busbw ratio table
#   tri-preload     LD_PRELOAD=<plugin> (no LD_LIBRARY_PATH), then a second communicator
#                   (NCCL_NET_PLUGIN_REF_COUNT=1, see tri-reload)
#   tri-reload      NCCL_NET_PLUGIN=mesh, NCCL_NET_PLUGIN_REF_COUNT unset: the first
#                   communicator's end unloads the plugin, a second one loads it again.
#                   Recorded: NCCL 2.27-2.29 forget the plugin's name at the unload, so the
#                   second communicator fails there (2.28.9: "Failed to initialize any NET
#                   plugin"); 2.30 reloads it
#   tri-refcount    the same with NCCL_NET_PLUGIN_REF_COUNT=1: the plugin stays loaded and the
#                   second communicator runs on it
#   tri-channels    NCCL_MIN_NCHANNELS=8 with p2p (shared comms): alltoall and sendrecv
#   ring4-ring      4-node ring (no diagonals), NCCL_ALGO=Ring, ranks in cable order
#   ring4-default   the same ring without NCCL_ALGO (what breaks, and how)
#   ring4-ib        stock NCCL IB on the ring with NCCL_ALGO=Ring
#   ring4-relay     the 4-node ring with the relay (NCCL_MESH_RELAY=auto), one relay per connection (TWIN=0), NCCL's own choice
#                   of algorithms (ring, tree, PAT), runtime connect off (every pair at init,
#                   NCCL's ring first): every collective, every result checked
#   line4-relay     a 4-node line with the relay (NCCL's ring wrap 3 -> 0: two relays)
#   ring4-spark-relay
#                   ring4-relay on DGX Spark cables (two functions per end, fabric-net
#                   --functions 2): what a 4-node Spark ring runs
#   ring4-relay-twin, ring4-spark-twin
#                   ring4-relay and ring4-spark-relay with NCCL_MESH_RELAY_TWIN=1: each
#                   opposite pair's connections go over both relays at once
#   ring4-spark-tree, ring4-spark-tree-twin, ring4-spark-a2a, ring4-spark-a2a-twin
#                   the relayed Spark 4-ring's figures (issue 31): all_reduce with
#                   NCCL_ALGO=Tree, and alltoall, 16 MiB and up, one relay vs two relays
#   pair-spark-plugin, pair-spark-ib
#                   2 nodes, one DGX Spark cable (two functions per end, fabric-net
#                   --functions 2): the plugin, then NCCL IB with NCCL_IB_HCA naming both
#   pair-spark-nosplit
#                   pair-spark-plugin with NCCL_MESH_SPLIT_MIN=1G: every message whole on one
#                   function, as NCCL IB sends on two unfused devices (the p2p gap, docs)
#   pair-spark-port pair-spark-plugin with NCCL_MESH_DEVICES=port: each function its own
#                   NCCL device, as NCCL IB sees them (NCCL's channels and p2p comms per device)
#   relay-bench     no NCCL, one relay: tests/e2e's relay-bench on the 4-ring (rank 0 -> 1 direct, 0 -> 2
#                   relayed, 0 -> 1 with 1 -> 2 at once), 1 GiB per stream, best of 3; on a
#                   16-core machine the emulated NICs do not share two cores (issue 15's ratio)
#   pair-p2p, pair-p2p-ib, spark-p2p, spark-p2p-port, spark-p2p-speed, spark-p2p-ib
#                   the p2p gap (docs/gpu-machine.md): sendrecv and alltoall only, 32 .. 256 MiB,
#                   on one cable and on a Spark cable, in the default mode (one NCCL device of
#                   two functions: the Spark sendrecv's 0.70), with NCCL_MESH_DEVICES=port
#                   (each function its own NCCL device, as NCCL IB has them) and with
#                   NCCL_MESH_SPEED=400000 (the default mode's one device at both functions'
#                   speed, as NCCL IB adds up its two: does NCCL's channel count explain the
#                   gap?); -ib: NCCL IB
#   relay-bench-twin
#                   relay-bench with NCCL_MESH_RELAY_TWIN=1 (the relayed stream over both relays)
#   vs-nccl-ib      no GPU: the plugin beside NCCL's own IB transport out of PyTorch's (or this
#                   machine's) libnccl.so.2 in the same processes, iterations alternating
#                   (scripts/bench-fabric.sh --vs-nccl-ib, 3 runs): sendrecv and ring all-reduce
#                   ratios on 16 cores (NCCL_E2E_LIBNCCL names the library)
#   pair-p2p-trace  2 nodes, one cable: sendrecv and alltoall at 32 and 128 MiB, traced with a
#                   48 MiB cap: the timing of real NCCL's p2p calls (the p2p gap, docs)
#   fix-pair, fix-tri, fix-ring4-relay, fix-ring4-twin
#                   the pair, the triangle, the relayed 4-ring (and over two relays) once
#                   more, every collective at 8 B .. 1 MiB, one iteration each: small traces
#                   of real NCCL's calls to commit as replay fixtures (tests/replay/fixtures)
#   switch4-plugin, switch4-ib
#                   4 nodes on a switch (fabric-net --topology switch --functions 2: NVIDIA's
#                   switched DGX Spark layout), the six collectives: the plugin (relay on, so
#                   every pair must go direct) and NCCL IB, whose NICs all reach every node
#                   there; the one 4-node layout where the two compare (the ratio table)
#
#   scripts/nccl-e2e.sh [--build DIR] [--out DIR] [--only S1,S2] [--quick] [--max-bytes SIZE]
#                       [--plugin PATH] [--dropin DIR] [--rehearse] [--no-trace] [--untraced S1,S2]
#                       [--deadline SECS] [--cap SECS] [--iter-bytes SIZE] [--fail-grace SECS]
#
# --only runs the named scenarios in the order given (a GPU lease runs the most wanted first).
# A scenario named again runs again as NAME.2, NAME.3 ... (its own log, JSON rows and ratio
# table: pair-plugin.2 / pair-ib.2), so alternating runs show the run-to-run spread.
# --deadline SECS: the whole run's budget. A scenario gets at most what is left of it (less a
# reserve for the tables), and one that cannot get --cap's minimum of 30 s is not run: it is
# listed as NOT RUN and the exit status is 4 (when nothing failed). --cap SECS: no scenario
# runs longer than SECS (--quick: 150). --iter-bytes: the bytes each timed size moves (1G;
# sets the iteration count). --fail-grace: seconds the other ranks get after one fails (30).
#
# --build DIR: the CMake build tree (default build/). Its plugin (DIR/libnccl-net-mesh.so;
# mesh_e2e and mesh_replay are taken from the plugin's tree) and its fabric drop-in
# (DIR/tests/fabric/dropin) are used unless --plugin or --dropin name others, and the
# results go to DIR/nccl-e2e/ unless --out (or $OUT) names another directory.
#
# The plugin records every ncclNet call real NCCL makes (NCCL_MESH_TRACE) into
# DIR/traces/<scenario>/, one file per rank: tests/replay/README.md says how to commit them as
# fixtures that replay in CI. --no-trace turns that off (NCCL_MESH_TRACE_MAX, 64M by default,
# caps each file); --untraced S1,S2 turns it off for the scenarios named: the recorder costs
# the plugin a few microseconds per call until its cap, which NCCL IB does not pay, so the
# ratio scenarios (pair-plugin, pair-spark-plugin) are measured without it.
#
# --rehearse: no GPU and no NCCL. The same scenarios, namespaces, collectives and checks
# with PyTorch's gloo backend on the CPU (any PyTorch, e.g. Debian's python3-torch; set
# PYTHON to its interpreter), so the script and its driver are tested where no GPU is.
# It measures nothing of interest and cannot check NCCL's log lines.
#
# Never part of CI (it needs a GPU, PyTorch and root). It checks its prerequisites first
# and says what is missing. Exit status: 0 every scenario behaved as expected, 1 one did
# not, 3 a prerequisite is missing, 4 every scenario that ran behaved but --deadline left
# some not run.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$REPO/build
OUT_DIR=${OUT:-}
PLUGIN=""
DROPIN=""
ONLY=""
QUICK=0
REHEARSE=0
TRACE=1
UNTRACED=""
PYTHON=${PYTHON:-python3}
MAX_BYTES=256M
DEADLINE=0
CAP=0
ITER_BYTES=1G
FAIL_GRACE=30
RELAY_BENCH_BYTES=${RELAY_BENCH_BYTES:-1G}
ALL_SCENARIOS=(pair-plugin pair-ib tri-plugin tri-ib tri-preload tri-reload tri-refcount tri-channels ring4-ring ring4-default ring4-ib
               ring4-relay ring4-spark-relay ring4-relay-twin ring4-spark-twin ring4-spark-tree ring4-spark-tree-twin
               ring4-spark-a2a ring4-spark-a2a-twin line4-relay pair-spark-plugin pair-spark-ib pair-spark-nosplit
               pair-spark-port pair-p2p pair-p2p-ib spark-p2p spark-p2p-port spark-p2p-speed spark-p2p-ib
               relay-bench relay-bench-twin vs-nccl-ib pair-p2p-trace fix-pair fix-tri fix-ring4-relay fix-ring4-twin
               switch4-plugin switch4-ib)

usage() { sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift ;;
    --out) OUT_DIR=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --quick) QUICK=1 ;;
    --rehearse) REHEARSE=1 ;;
    --no-trace) TRACE=0 ;;
    --untraced) UNTRACED=$2; shift ;;
    --max-bytes) MAX_BYTES=$2; shift ;;
    --plugin) PLUGIN=$2; shift ;;
    --dropin) DROPIN=$2; shift ;;
    --deadline) DEADLINE=$2; shift ;;
    --cap) CAP=$2; shift ;;
    --iter-bytes) ITER_BYTES=$2; shift ;;
    --fail-grace) FAIL_GRACE=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "nccl-e2e: unknown option '$1'" >&2; usage >&2; exit 64 ;;
  esac
  shift
done

# What --build names, unless --out, --plugin or --dropin named it elsewhere.
OUT_DIR=${OUT_DIR:-$BUILD/nccl-e2e}
PLUGIN=${PLUGIN:-$BUILD/libnccl-net-mesh.so}
DROPIN=${DROPIN:-$BUILD/tests/fabric/dropin}

say() { echo "nccl-e2e: $*"; }

# --- prerequisites ------------------------------------------------------------------------
check_prereqs() {
  local missing=()
  [ "$(id -u)" -eq 0 ] || missing+=("root (network namespaces)")
  if [ "$REHEARSE" -eq 1 ]; then
    "$PYTHON" -c 'import torch.distributed as d, sys; sys.exit(0 if d.is_gloo_available() else 1)' 2>/dev/null ||
      missing+=("PyTorch with gloo for $PYTHON (Debian: apt-get install python3-torch; PYTHON=/usr/bin/python3)")
  else
    command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || missing+=("an NVIDIA GPU (nvidia-smi -L)")
    if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
      missing+=("PyTorch with CUDA ($PYTHON -c 'import torch; torch.cuda.is_available()')")
    fi
  fi
  command -v nsenter >/dev/null || missing+=("nsenter (util-linux)")
  [ -f "$PLUGIN" ] || missing+=("the plugin $PLUGIN (cmake --build $BUILD --target nccl-net-mesh)")
  [ -f "$DROPIN/libibverbs.so.1" ] || missing+=("the fabric drop-in $DROPIN/libibverbs.so.1 (cmake --build $BUILD --target meshfab)")
  [ -x "$REPO/scripts/fabric-net" ] || missing+=("scripts/fabric-net")
  if [ ${#missing[@]} -gt 0 ]; then
    say "missing prerequisites:"
    printf '  - %s\n' "${missing[@]}"
    exit 3
  fi
  if [ "$REHEARSE" -eq 1 ]; then
    say "rehearsal: gloo on the CPU, PyTorch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
  else
    say "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
    say "PyTorch $("$PYTHON" -c 'import torch; print(torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))')"
  fi
  say "plugin: $PLUGIN; fabric drop-in: $DROPIN"
}

# --- one scenario -------------------------------------------------------------------------
# run_scenario NAME NODES TOPOLOGY TIMEOUT EXPECT [--env K=V ...] -- RANK-DRIVER-ARGS
#   EXPECT: pass (every rank exits 0, results exact) | record (the outcome is recorded,
#   whatever it is: stock NCCL on a mesh NCCL cannot route)
run_scenario() {
  local name=$1${RUN_SUFFIX:-} nodes=$2 topo=$3 timeout=$4 expect=$5
  shift 5
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  scenario_budget "$name" "$timeout" || return 0
  timeout=$BUDGET
  # TOPOLOGY may say "full+fn2": a DGX Spark cable, two functions per end.
  local fabric=(--topology "${topo%%+*}")
  [ "${topo#*+fn}" != "$topo" ] && fabric+=(--functions "${topo#*+fn}")
  # CUDA's MPS daemon (scripts/gpu-lease.sh --mps): its pipe directory reaches every rank.
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && envs+=(--env "CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY")
  local log=$OUT_DIR/$name.log json=$OUT_DIR/$name.jsonl
  rm -f "$log" "$json"
  # The plugin's call recorder: one trace per rank (scenarios without the plugin leave none).
  if [ "$TRACE" -eq 1 ] && ! case ",$UNTRACED," in *",${name%.[0-9]*},"*) true ;; *) false ;; esac; then
    rm -rf "$OUT_DIR/traces/$name"
    mkdir -p "$OUT_DIR/traces/$name"
    envs+=(--env "NCCL_MESH_TRACE=$OUT_DIR/traces/$name/$name")
  fi
  say "== $name: $nodes nodes ($topo), expect $expect, at most $timeout s"
  local start=$SECONDS rc
  # fabric-net passes NCCL_*, PATH and LD_LIBRARY_PATH through; the rest goes with --env.
  "$REPO/scripts/fabric-net" run --nodes "$nodes" "${fabric[@]}" --timeout "$timeout" --fail-grace "$FAIL_GRACE" \
    --env PYTHONUNBUFFERED=1 --env CUDA_VISIBLE_DEVICES=0 \
    --env NCCL_DEBUG=INFO --env NCCL_DEBUG_SUBSYS=INIT,NET,TUNING --env NCCL_SOCKET_IFNAME=mgmt --env GLOO_SOCKET_IFNAME=mgmt \
    --env NCCL_NET_GDR_LEVEL=LOC "${envs[@]}" -- \
    "$PYTHON" "$REPO/scripts/nccl_e2e_rank.py" --label "$name" --json "$json" --iter-bytes "$ITER_BYTES" \
    "${DRIVER_EXTRA[@]}" "$@" >"$log" 2>&1
  rc=$?
  local secs=$((SECONDS - start))
  python3 "$REPO/scripts/nccl_e2e_report.py" check --scenario "$name" --expect "$expect" --rc "$rc" \
    --seconds "$secs" --log "$log" --json "$json" --summary "$OUT_DIR/summary.txt" "${REPORT_EXTRA[@]}"
  local verdict=$?
  [ "$verdict" -eq 0 ] || FAILED+=("$name")
  return 0
}

# scenario_budget NAME TIMEOUT: sets BUDGET to the seconds NAME may run, after --quick, --cap
# and --deadline; fails (and records NAME as not run) when --deadline leaves less than 30 s.
RESERVE=15  # for the tables, the trace check and the summary at the end
scenario_budget() {
  local name=$1 t=$2 left
  # --quick moves at most 1 MiB per call: nothing legitimate takes minutes.
  [ "$QUICK" -eq 1 ] && [ "$t" -gt 150 ] && t=150
  [ "$CAP" -gt 0 ] && [ "$t" -gt "$CAP" ] && t=$CAP
  if [ "$DEADLINE" -gt 0 ]; then
    left=$((DEADLINE - SECONDS - RESERVE))
    if [ "$left" -lt 30 ]; then
      say "== $name: NOT RUN (--deadline $DEADLINE: $((DEADLINE - SECONDS)) s left)"
      echo "$(printf '%-14s' "$name") NOT RUN  (--deadline $DEADLINE s)" >>"$OUT_DIR/summary.txt"
      NOT_RUN+=("$name")
      return 1
    fi
    [ "$t" -gt "$left" ] && t=$left
  fi
  BUDGET=$t
}

# relay-bench: mesh_e2e on the fabric, no NCCL and no GPU; its figures go to the summary.
# run_relay_bench NAME [ENV=V ...]: the extra variables go to every rank (relay-bench-twin).
run_relay_bench() {
  local name=$1${RUN_SUFFIX:-}
  shift
  local e2e log=$OUT_DIR/$name.log start=$SECONDS timeout envs=() kv
  for kv in "$@"; do envs+=(--env "$kv"); done
  scenario_budget "$name" 400 || return 0
  timeout=$BUDGET
  e2e=$(cd "$(dirname "$PLUGIN")" && pwd)/tests/e2e/mesh_e2e
  say "== $name: 4 nodes (ring), figures only, at most $timeout s"
  if [ ! -x "$e2e" ]; then
    say "$name: $e2e is missing (cmake --build $BUILD --target mesh_e2e)"
    FAILED+=("$name")
    return 0
  fi
  "$REPO/scripts/fabric-net" run --nodes 4 --topology ring --timeout "$timeout" --env NCCL_MESH_RELAY=auto "${envs[@]}" -- \
    env "LD_LIBRARY_PATH=$(dirname "$e2e")/../.." "NCCL_MESH_IBVERBS_LIB=$DROPIN/libibverbs.so.1" \
    "$e2e" relay-bench --bw-bytes "$RELAY_BENCH_BYTES" --rounds 3 --deadline $((timeout - 10)) >"$log" 2>&1
  report_figures "$name" $? "$(grep -o 'PASS relay-bench rank=0 .*' "$log" | head -1)" "$log" "$start"
}

# report_figures NAME RC LINE LOG START: a figures-only scenario's verdict and summary line.
report_figures() {
  local name=$1 rc=$2 line=$3 log=$4 start=$5
  if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
    say "$name: FAILED (exit $rc, $((SECONDS - start)) s; log: $log)"
    FAILED+=("$name")
  else
    say "$name: $line"
    echo "$name ($((SECONDS - start)) s): $line" >>"$OUT_DIR/summary.txt"
  fi
}

# vs-nccl-ib: scripts/bench-fabric.sh --vs-nccl-ib with the NCCL that PyTorch loads (its wheel's
# libnccl.so.2; NCCL_E2E_LIBNCCL overrides, and without PyTorch's NCCL the machine's own).
run_vs_nccl_ib() {
  local name=vs-nccl-ib${RUN_SUFFIX:-} start=$SECONDS lib
  local log=$OUT_DIR/$name.log
  scenario_budget "$name" 300 || return 0
  lib=${NCCL_E2E_LIBNCCL:-$("$PYTHON" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)}
  [ -f "$lib" ] || lib=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / { print $NF; exit }')
  say "== $name: the plugin beside NCCL IB ($lib), no GPU, at most $BUDGET s"
  timeout "$BUDGET" "$REPO/scripts/bench-fabric.sh" --vs-nccl-ib --rounds 3 --build "$(dirname "$PLUGIN")" \
    ${lib:+--nccl "$lib"} --out "$OUT_DIR/$name" >"$log" 2>&1
  report_figures "$name" $? "$(grep -o '^VSNCCLIB .*' "$log" | head -1)" "$log" "$start"
}

# The traces real NCCL left, checked by mesh_replay when it is built (it parses and places
# them; replaying needs no GPU: tests/replay/README.md).
summarize_traces() {
  [ "$TRACE" -eq 1 ] && [ -d "$OUT_DIR/traces" ] || return 0
  local replay dir n
  replay=$(cd "$(dirname "$PLUGIN")" && pwd)/tests/replay/mesh_replay
  for dir in "$OUT_DIR"/traces/*/; do
    n=$(find "$dir" -name '*.trace' | wc -l)
    [ "$n" -gt 0 ] || continue
    echo "traces $(basename "$dir"): $n file(s), $(du -sh "$dir" | cut -f1)" >>"$OUT_DIR/summary.txt"
    if [ -x "$replay" ]; then
      "$replay" check "$dir" 2>&1 | head -3 | sed 's/^/  /' >>"$OUT_DIR/summary.txt"
    fi
  done
}

# run_named NAME: one scenario by name (the order is --only's, or ALL_SCENARIOS').
run_named() {
  case "$1" in
    pair-plugin) run_scenario pair-plugin 2 full 900 pass "${mesh[@]}" -- --colls "$colls_all" "${sizes[@]}" ;;
    pair-ib) run_scenario pair-ib 2 full 900 pass "${ib[@]}" -- --colls "$colls_all" "${sizes[@]}" ;;
    tri-plugin) run_scenario tri-plugin 3 full 1200 pass "${mesh[@]}" -- --colls "$colls_all" "${sizes[@]}" ;;
    tri-ib) run_scenario tri-ib 3 full 240 record "${ib[@]}" -- \
      --colls all_reduce --min-bytes 8 --max-bytes 64M --factor 64 --timeout 90 ;;
    tri-preload) run_scenario tri-preload 3 full 300 pass \
      --env "LD_PRELOAD=$plugin_dir/$(basename "$PLUGIN")" --env NCCL_NET_PLUGIN=mesh --env NCCL_NET=Mesh \
      --env NCCL_NET_PLUGIN_REF_COUNT=1 \
      --env "NCCL_MESH_IBVERBS_LIB=$DROPIN/libibverbs.so.1" -- \
      --colls all_reduce,sendrecv --min-bytes 8 --max-bytes 4M --factor 16 --second-comm ;;
    tri-reload) run_scenario tri-reload 3 full 300 record "${mesh[@]}" -- \
      --colls all_reduce --min-bytes 8 --max-bytes 4M --factor 16 --second-comm ;;
    tri-refcount) run_scenario tri-refcount 3 full 300 pass "${mesh[@]}" --env NCCL_NET_PLUGIN_REF_COUNT=1 -- \
      --colls all_reduce --min-bytes 8 --max-bytes 4M --factor 16 --second-comm ;;
    tri-channels) run_scenario tri-channels 3 full 600 pass "${mesh[@]}" --env NCCL_MIN_NCHANNELS=8 --env NCCL_MAX_NCHANNELS=8 -- \
      --colls alltoall,sendrecv,all_reduce --min-bytes 8 --max-bytes 64M --factor 16 ;;
    ring4-ring) run_scenario ring4-ring 4 ring 1200 pass "${mesh[@]}" --env NCCL_ALGO=Ring -- \
      --colls all_reduce,all_gather,reduce_scatter,broadcast,sendrecv --peers ring "${sizes[@]}" ;;
    ring4-default) run_scenario ring4-default 4 ring 300 record "${mesh[@]}" -- \
      --colls all_reduce,all_gather,alltoall --min-bytes 8 --max-bytes 64M --factor 64 --timeout 90 ;;
    ring4-ib) run_scenario ring4-ib 4 ring 300 record "${ib[@]}" --env NCCL_ALGO=Ring -- \
      --colls all_reduce --min-bytes 8 --max-bytes 64M --factor 64 --timeout 90 ;;
    ring4-relay|ring4-spark-relay|ring4-relay-twin|ring4-spark-twin)
      # The relayed 4-ring, plain or of Spark cables, through one relay or two per connection
      # (two are the plugin's default since 2026-11-28: the one-relay names say TWIN=0).
      local topo=ring twin=(--env NCCL_MESH_RELAY_TWIN=0)
      case "$1" in ring4-spark-*) topo=ring+fn2 ;; esac
      case "$1" in *-twin) twin=(--env NCCL_MESH_RELAY_TWIN=1) ;; esac
      run_scenario "$1" 4 "$topo" 1200 pass "${mesh[@]}" --env NCCL_MESH_RELAY=auto "${twin[@]}" \
        --env NCCL_RUNTIME_CONNECT=0 -- --colls "$colls_all" "${sizes[@]}" ;;
    line4-relay) run_scenario line4-relay 4 line 1200 pass "${mesh[@]}" --env NCCL_MESH_RELAY=auto -- \
      --colls "$colls_all" "${sizes[@]}" ;;
    pair-spark-plugin) run_scenario pair-spark-plugin 2 full+fn2 900 pass "${mesh[@]}" -- \
      --colls all_reduce,all_gather,sendrecv "${sizes[@]}" ;;
    pair-spark-ib) run_scenario pair-spark-ib 2 full+fn2 900 pass "${ib[@]}" -- \
      --colls all_reduce,all_gather,sendrecv "${sizes[@]}" ;;
    pair-spark-nosplit) run_scenario pair-spark-nosplit 2 full+fn2 900 pass "${mesh[@]}" --env NCCL_MESH_SPLIT_MIN=1G -- \
      --colls all_reduce,all_gather,sendrecv "${sizes[@]}" ;;
    ring4-spark-tree|ring4-spark-tree-twin|ring4-spark-a2a|ring4-spark-a2a-twin)
      # Issue 31's figures under real NCCL: NCCL's tree all-reduce, or its all-to-all.
      local perf=(--env NCCL_MESH_RELAY_TWIN=0) colls=alltoall lo=16M
      [ "$QUICK" -eq 1 ] && lo=$max
      case "$1" in *-twin) perf=(--env NCCL_MESH_RELAY_TWIN=1) ;; esac
      case "$1" in *-tree*) perf+=(--env NCCL_ALGO=Tree) colls=all_reduce ;; esac
      run_scenario "$1" 4 ring+fn2 600 pass "${mesh[@]}" --env NCCL_MESH_RELAY=auto --env NCCL_RUNTIME_CONNECT=0 \
        "${perf[@]}" -- --colls "$colls" --min-bytes "$lo" --max-bytes "$max" --factor 4 ;;
    pair-spark-port) run_scenario pair-spark-port 2 full+fn2 900 pass "${mesh[@]}" --env NCCL_MESH_DEVICES=port -- \
      --colls all_reduce,all_gather,sendrecv "${sizes[@]}" ;;
    pair-p2p|pair-p2p-ib|spark-p2p|spark-p2p-port|spark-p2p-speed|spark-p2p-ib)
      local how=("${mesh[@]}") topo=full p2p=(--colls sendrecv,alltoall --min-bytes 32M --max-bytes 256M --factor 2)
      [ "$QUICK" -eq 1 ] && p2p=(--colls sendrecv,alltoall --min-bytes "$max" --max-bytes "$max")
      case "$1" in spark-*) topo=full+fn2 ;; esac
      [ "$1" = spark-p2p-port ] && how+=(--env NCCL_MESH_DEVICES=port)
      [ "$1" = spark-p2p-speed ] && how+=(--env NCCL_MESH_SPEED=400000)
      case "$1" in *-ib) how=("${ib[@]}") ;; esac
      run_scenario "$1" 2 "$topo" 300 pass "${how[@]}" -- "${p2p[@]}" ;;
    relay-bench) run_relay_bench relay-bench NCCL_MESH_RELAY_TWIN=0 ;;  # no NCCL and no GPU: the same under --rehearse
    relay-bench-twin) run_relay_bench relay-bench-twin NCCL_MESH_RELAY_TWIN=1 ;;
    vs-nccl-ib) run_vs_nccl_ib ;;  # no GPU either
    pair-p2p-trace) run_scenario pair-p2p-trace 2 full 300 pass "${mesh[@]}" --env NCCL_MESH_TRACE_MAX=48M -- \
      --colls sendrecv,alltoall --min-bytes "$([ "$QUICK" -eq 1 ] && echo "$max" || echo 32M)" \
      --max-bytes "$([ "$QUICK" -eq 1 ] && echo "$max" || echo 128M)" --factor 4 ;;
    switch4-plugin) run_scenario switch4-plugin 4 switch+fn2 1200 pass "${mesh[@]}" --env NCCL_MESH_RELAY=auto -- \
      --colls "$colls_all" "${sizes[@]}" ;;
    switch4-ib) run_scenario switch4-ib 4 switch+fn2 1200 pass "${ib[@]}" -- --colls "$colls_all" "${sizes[@]}" ;;
    fix-pair) run_scenario fix-pair 2 full 300 pass "${mesh[@]}" -- "${tiny[@]}" ;;
    fix-tri) run_scenario fix-tri 3 full 300 pass "${mesh[@]}" -- "${tiny[@]}" ;;
    fix-ring4-relay|fix-ring4-twin)
      local twin=(--env NCCL_MESH_RELAY_TWIN=0)
      [ "$1" = fix-ring4-twin ] && twin=(--env NCCL_MESH_RELAY_TWIN=1)
      run_scenario "$1" 4 ring 300 pass "${mesh[@]}" --env NCCL_MESH_RELAY=auto "${twin[@]}" \
        --env NCCL_RUNTIME_CONNECT=0 -- "${tiny[@]}" ;;
  esac
}

main() {
  check_prereqs
  DRIVER_EXTRA=() REPORT_EXTRA=()
  [ "$REHEARSE" -eq 1 ] && DRIVER_EXTRA=(--rehearse) REPORT_EXTRA=(--rehearse)
  mkdir -p "$OUT_DIR"
  : >"$OUT_DIR/summary.txt"
  FAILED=() NOT_RUN=()
  local plugin_dir max=$MAX_BYTES name order=("${ALL_SCENARIOS[@]}")
  colls_all="all_reduce,all_gather,reduce_scatter,broadcast,alltoall,sendrecv"
  plugin_dir=$(cd "$(dirname "$PLUGIN")" && pwd)
  [ "$QUICK" -eq 1 ] && max=1M
  mesh=(--env "LD_LIBRARY_PATH=$plugin_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        --env NCCL_NET_PLUGIN=mesh --env NCCL_NET=Mesh
        --env "NCCL_MESH_IBVERBS_LIB=$DROPIN/libibverbs.so.1")
  # NCCL IB on the fabric: the ranks get /sys/class/infiniband entries for the fabric's devices
  # (nccl_e2e_rank.py fake_ib_sysfs; without a PCI path NCCL 2.28.9 dies with SIGSEGV), and
  # NCCL_GIN_TYPE=2 (the proxy GIN): with the default (-1) NCCL 2.28.9 calls through a -1
  # pointer when its GDAKI GIN finds no device (ncclNetPluginInit; libnccl.so.2+0x139a56 in
  # ncclNetInit, seen on the GPU machine), which is what the fabric's devices are to it.
  # NCCL_NET_MERGE_LEVEL=LOC: the fake sysfs is no PCI tree, so NCCL hangs every device off
  # the first CPU and then fuses a node's devices into one virtual NIC that the GPU has no
  # path to ("Could not find any local path from gpu 0 to net", 2.28.9, seen with two devices
  # per node). Unfused matches a DGX Spark: its two functions of a port sit under different
  # PCI root complexes, which NCCL's default merge level (PORT) never fuses.
  ib=(--env "LD_LIBRARY_PATH=$DROPIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      --env NCCL_NET_PLUGIN=none --env NCCL_NET=IB --env NCCL_E2E_IB_HCA=auto --env NCCL_IB_GID_INDEX=1
      --env NCCL_GIN_TYPE=2 --env NCCL_NET_MERGE_LEVEL=LOC)
  sizes=(--min-bytes 8 --max-bytes "$max" --factor 4)
  # The fixtures: every collective, few sizes, one iteration, so the trace stays small.
  tiny=(--colls "$colls_all" --min-bytes 8 --max-bytes 1M --factor 16 --warmup 0 --min-iters 1 --max-iters 1)
  if [ -n "$ONLY" ]; then
    IFS=, read -r -a order <<<"$ONLY"
    for name in "${order[@]}"; do
      case " ${ALL_SCENARIOS[*]} " in *" $name "*) ;; *) say "unknown scenario '$name' (known: ${ALL_SCENARIOS[*]})"; exit 64 ;; esac
    done
  fi
  local -A runs=()
  for name in "${order[@]}"; do
    runs[$name]=$((${runs[$name]:-0} + 1))
    RUN_SUFFIX=""
    [ "${runs[$name]}" -gt 1 ] && RUN_SUFFIX=".${runs[$name]}"
    run_named "$name"
  done

  python3 "$REPO/scripts/nccl_e2e_report.py" tables --dir "$OUT_DIR" | tee "$OUT_DIR/tables.txt"
  echo
  summarize_traces
  cat "$OUT_DIR/summary.txt"
  if [ ${#FAILED[@]} -gt 0 ]; then
    say "FAILED: ${FAILED[*]}${NOT_RUN[*]:+; not run (deadline): ${NOT_RUN[*]}}"
    exit 1
  fi
  if [ ${#NOT_RUN[@]} -gt 0 ]; then
    say "every scenario that ran behaved as expected; not run (deadline): ${NOT_RUN[*]}"
    exit 4
  fi
  say "every scenario behaved as expected"
}

main
