#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# bench-fabric.sh --link-rate: the plugin's figures on the userspace fabric with links that have
# a rate (tests/fabric/lib/pace.h), each a fraction of what the cabling allows.
#
# The fabric's links are capped far below what this machine can copy (see --calibrate), so a
# figure depends on the ports, functions and relays the plugin chooses, and its ceiling is
# known exactly: one cable direction moves rate x 4096 / 4178 bytes of payload per second at
# MTU 4096 (82 bytes of RoCEv2 and Ethernet overhead per packet). Every receiver spins as
# NCCL's proxy does; every figure is the best of --rounds alternating rounds; data is checked
# by every tool except perftest (the raw reference).
#   1. pair, one cable: perftest ib_write_bw and nccl-mesh-perf at 64 KiB, 1 MiB and 16 MiB
#   2. a DGX Spark cable (two functions per end on one wire, each function capped at
#      --fn-rate): the plugin at 16 MiB over both functions (halves), and with
#      NCCL_MESH_HCA naming one function (onefn), as fractions of the wire
#   3. NCCL's ring all-reduce at 64 MiB on a triangle and on a 4-node ring (tests/e2e
#      coll-bench: NCCL's channels, slots and steps), busbw / the topology's bound
#   4. the 4-ring with NCCL_MESH_RELAY=auto: a relayed 0 -> 2 stream / a direct 0 -> 1 one at
#      4 MiB (relay-bench), NCCL's double binary tree all-reduce and an all-to-all
#   5. contention: a relayed stream and a direct one into the same cable direction, each
#      one's share and their sum, as fractions of that cable
#   6. 4 and 5 again on DGX Spark cables (--functions 2, each function capped at --fn-rate):
#      the relay, NCCL's ring, tree and all-to-all on the 4-ring, contention (spark_*)
#   7. all-to-all on a 6-node ring, plain and Spark cables (ring6_a2a, spark_ring6_a2a)
#   8. with NCCL_MESH_RELAY_TWIN=0 (one relay per connection; two where two ways are as short
#      are the default): NCCL's tree and the all-to-all on the 4-ring, plain and Spark cables
#      (the LINKRATE-ONE-RELAY line)
# and ends with one line:
#   LINKRATE pair64k=F pair1m=F pair16m=F perftest1m=F halves=F onefn=F tri_ring=F ring4_ring=F
#            relay=F ring4_tree=F ring4_a2a=F share_min=F share_sum=F spark_relay=F
#            spark_ring4_ring=F spark_ring4_tree=F spark_ring4_a2a=F spark_share_min=F
#            spark_share_sum=F ring6_a2a=F spark_ring6_a2a=F
# (the bounds: a Spark cable's wire is one cable's ceiling, its two functions together can
# fill it; NCCL's collectives against the cabling's bound, best shortest paths).
#
# bench-fabric.sh --vs-nccl-ib: the plugin beside NCCL's own IB transport (net_ib, out of an
# installed libnccl.so.2: tests/e2e/nccl_ib.h) on one cable of a 2-node fabric, uncapped (or
# --rate): mesh_e2e coll-bench --vs loads both into the same two processes and alternates their
# iterations, so what the host does to one run (core placement, a neighbour) it does to both.
# nccl-tests' sendrecv (NCCL's p2p: 128 KiB chunks, 2 channels, a comm pair per channel) and
# NCCL's ring all-reduce (2 channels, 512 KiB slices), 256 MiB, 20 iterations each, --rounds
# runs (default 5); per figure the median over runs of each run's median per-iteration ratio
# plugin / NCCL IB, then one line:
#   VSNCCLIB sendrecv=R sendrecv_oldest=R ring=R spark_sendrecv=R switch4_spark_alltoall=R
# (sendrecv_oldest: each connection's oldest request tested once per pass, as NCCL's proxy
# does, not every one in flight; spark_sendrecv: one DGX Spark cable, the plugin's one device
# of two functions and 2 channels against NCCL IB's two devices and 4 channels, as NCCL ran
# them on the GPU machine; switch4_spark_alltoall: 4 nodes on a switch, DGX Spark cables to
# it with a rate (25M, functions 14M: NVIDIA's switched layout, where NCCL IB works too), an
# all-to-all of 32 MiB with two comms per peer, NCCL IB's one on each function; its summary
# row also gives the plugin's fraction of the switch's bound, each node's one cable)
#
# usage: scripts/bench-fabric.sh --link-rate [--build DIR] [--rate R] [--fn-rate R]
#                                [--rounds 3] [--out DIR]
#        scripts/bench-fabric.sh --vs-nccl-ib [--build DIR] [--nccl LIB] [--rate R] [--rounds 5]
#                                [--figures sendrecv,sendrecv_oldest,ring,spark_sendrecv,switch4_spark_alltoall]
#        scripts/bench-fabric.sh --calibrate [--build DIR] [--rates 250M,500M,...] [--seconds 3]
#   --build DIR   the CMake build tree (default <repo>/build): plugin, tools, mesh_e2e, drop-in
#   --rate R      every cable's rate per direction (default 25M = 25 MB/s: half the highest
#                 rate at which this machine served all 8 directions of a 4-ring with perftest
#                 at >= 0.97 of the cap, --calibrate; docs/figures.md, "Links with a rate")
#   --fn-rate R   a Spark function's own cap (default 0.56 x --rate: one function ~110 Gb/s of
#                 a 196 Gb/s cable, as users measure on a DGX Spark)
#   --nccl LIB    the libnccl.so.2 whose IB transport is the reference (default: ldconfig's,
#                 else /usr/local/cuda/lib64/libnccl.so.2); it must keep its symbol table
#   --figures L   --vs-nccl-ib's figures to take (default all; switch4_spark_alltoall is held to
#                 its links' rate: about 15 s a run whatever the cores)
#   --calibrate   ib_write_bw on every cable direction of a 4-node ring at once (8 streams,
#                 16 perftest processes), --rounds times for each of --rates: every stream's
#                 best round, and the lowest of those as a fraction of the cap
# Exit: 0 every figure measured; 2 a measurement failed or is missing.
set -u

REPO=$(cd "$(dirname "$0")/.." && pwd)
RATE=25M
FN_RATE=""
ROUNDS=""
BUILD=""
OUT=""
MODE=""
RATES="125M,250M,500M,1000M"
NCCL_LIB=""
FIGURES=""
RATE_SET=0
SECONDS_PER_STREAM=3

die() {
    echo "bench-fabric: $*" >&2
    exit 2
}

# Bytes per second of a rate (scripts/fabric-net's syntax: 400M, 3.2Gbit).
rate_bytes() {
    python3 -c 'import re,sys
m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]?)(bit|B|)", sys.argv[1])
v = float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]
print(int(v / 8 if m.group(3) == "bit" else v))' "$1" 2>/dev/null || die "bad rate $1"
}

# The goodput ceiling of a rate, bytes/s: 4096-byte packets carry 82 bytes of RoCEv2 and
# Ethernet overhead each.
ceiling_of() {
    awk -v r="$(rate_bytes "$1")" 'BEGIN { printf "%.0f", r * 4096 / 4178 }'
}

# --------------------------------------------------------------------------- inside a node

# Calibration: servers for both neighbours, then clients to both at once (duration mode).
rank_calibrate() {
    # shellcheck source=../tests/lab/lib.sh
    . "$REPO/tests/lab/lib.sh"
    local l peer netdev addr paddr
    while read -r l peer netdev addr paddr; do
        lab_serve "s${VMESH_RANK}from$peer" $((23000 + peer)) ib_write_bw -d "fab_$netdev" -x 1 -F -s 1048576 \
            -D "$SECONDS_PER_STREAM" -p $((23000 + peer))
    done <<EOF
$(lab_my_links)
EOF
    lab_publish_servers
    local pids=""
    while read -r l peer netdev addr paddr; do
        # shellcheck disable=SC2016
        ( lab_client "s${peer}from$VMESH_RANK" ib_write_bw -d "fab_$netdev" -x 1 -F -s 1048576 \
              -D "$SECONDS_PER_STREAM" -p $((23000 + VMESH_RANK)) "$paddr" >"$LAB_TMP/to$peer.out" 2>&1
          awk -v f="$VMESH_RANK" -v t="$peer" 'found { printf "LR stream from=%s to=%s MBps=%s\n", f, t, $4; exit }
              /^ *#bytes/ { found = 1 }' "$LAB_TMP/to$peer.out" ) &
        pids="$pids $!"
    done <<EOF
$(lab_my_links)
EOF
    # shellcheck disable=SC2086
    wait $pids
    lab_reap_servers >/dev/null
}

# perftest ib_write_bw on the cable between ranks 0 and 1: rank 1 serves, rank 0 measures
# `iters` messages (from the first post to the last completion: duration mode counts whole
# messages in its window, 9 % low for 16 MiB ones at 3 s).
rank_perftest() {
    . "$REPO/tests/lab/lib.sh"
    local size=$1 port=$2 iters=$3
    if [ "$VMESH_RANK" = 1 ]; then
        lab_serve bw $port ib_write_bw -d fab_p0 -x 1 -F -s "$size" -n "$iters" -p "$port"
        lab_publish_servers
        lab_reap_servers >/dev/null
        return
    fi
    lab_client bw ib_write_bw -d fab_p1 -x 1 -F -s "$size" -n "$iters" -p "$port" 198.18.0.2 \
        >"$LAB_TMP/bw.out" 2>&1 || { cat "$LAB_TMP/bw.out"; return 1; }
    awk -v s="$size" 'found { printf "LR perftest size=%s MBps=%s\n", s, $4; exit } /^ *#bytes/ { found = 1 }' "$LAB_TMP/bw.out"
}

# --------------------------------------------------------------------------- on the host

# nccl-mesh-perf on ranks 0 and 1 of the run, meeting in the run's shared directory.
PERF_RANK='exec "$0" --rank "$VMESH_RANK" --rendezvous "$VMESH_SHARED" "$@"'

fabric() {  # fabric() NET-ARGS... -- CMD...: one fabric-net run with the build's drop-in
    "$REPO/scripts/fabric-net" run --dropin "$BUILD/tests/fabric/dropin" --timeout 600 \
        --env "NCCL_MESH_IBVERBS_LIB=$BUILD/tests/fabric/dropin/libibverbs.so.1" \
        --env "LD_LIBRARY_PATH=$BUILD" "$@"
}

e2e() {  # e2e NET-ARGS... -- SCENARIO ARGS...: tests/e2e's mesh_e2e on every node
    local net=() arg
    while [ $# -gt 0 ] && [ "$1" != -- ]; do net+=("$1"); shift; done
    shift
    fabric "${net[@]}" -- env LD_LIBRARY_PATH="$BUILD" "$BUILD/tests/e2e/mesh_e2e" "$@"
}

# field KEY: KEY=value from the "[0] PASS" line on stdin (first match).
field() {
    grep -a "^\[$2\] PASS" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n1
}

record() {  # record NAME VALUE: one figure of this round
    if [ -z "$2" ]; then
        echo "bench-fabric: round $round: $1 missing" | tee -a "$LOG"
        missing=1
        return
    fi
    echo "FIG round=$round $1=$2" | tee -a "$LOG"
}

frac() {  # frac MiBps CEILING_BYTES: a perftest/nccl-mesh-perf MB/s (2^20) as a fraction
    awk -v v="$1" -v c="$2" 'BEGIN { if (v == "") exit; printf "%.3f", v * 1048576 / c }'
}

one_round() {
    local out size iters
    # 1. pair: perftest and the plugin, alternating tool by tool.
    for size in 65536 1048576 16777216; do
        # About 3 s of messages at the cap, at least 5.
        iters=$(awk -v c="$CEIL" -v s="$size" 'BEGIN { n = int(c * 3 / s + 0.5); print n < 5 ? 5 : n }')
        out=$(fabric --nodes 2 --rate "$RATE" -- "$0" --rank perftest "$size" $((24000 + round)) "$iters" 2>&1)
        echo "$out" >>"$LOG"
        record "perftest$size" "$(frac "$(echo "$out" | sed -n 's/^\[0\] LR perftest size=[0-9]* MBps=//p')" "$CEIL")"
    done
    out=$(fabric --nodes 2 --rate "$RATE" -- sh -c "$PERF_RANK" "$BUILD/nccl-mesh-perf" --no-lat \
        --bw-sizes 64K,1M,16M --bw-iters 100000 --bw-bytes "$BW_BYTES" --timeout 500 2>&1)
    echo "$out" >>"$LOG"
    for size in 65536 1048576 16777216; do
        record "plugin$size" "$(frac "$(echo "$out" | sed -n "s/^\[0\] PERF bw size=$size MBps=\([0-9.]*\).*wrong=0\$/\1/p")" "$CEIL")"
    done
    # 2. a Spark cable: both functions, then one.
    for mode in both one; do
        local hca=()
        [ "$mode" = one ] && hca=(--env "NCCL_MESH_HCA==fab_p1,fab_p0")
        out=$(fabric --nodes 2 --functions 2 --rate "$RATE" --fn-rate "$FN_RATE" "${hca[@]}" -- \
            sh -c "$PERF_RANK" "$BUILD/nccl-mesh-perf" --no-lat --bw-sizes 16M --bw-iters 100000 \
            --bw-bytes "$BW_BYTES" --timeout 500 2>&1)
        echo "$out" >>"$LOG"
        record "spark_$mode" "$(frac "$(echo "$out" | sed -n 's/^\[0\] PERF bw size=16777216 MBps=\([0-9.]*\).*wrong=0$/\1/p')" "$CEIL")"
    done
    # 3. ring all-reduce, 4. the relay, 5. contention.
    out=$(e2e --nodes 3 --rate "$RATE" -- coll-bench --algo ring --bytes 64M --ceiling "$CEIL" 2>&1)
    echo "$out" >>"$LOG"
    record tri_ring "$(echo "$out" | field fraction 0)"
    local algo
    for algo in ring tree alltoall; do
        out=$(e2e --nodes 4 --topology ring --rate "$RATE" --env NCCL_MESH_RELAY=auto -- \
            coll-bench --algo "$algo" --bytes 64M --ceiling "$CEIL" 2>&1)
        echo "$out" >>"$LOG"
        record "ring4_$algo" "$(echo "$out" | field fraction 0)"
    done
    out=$(e2e --nodes 4 --topology ring --rate "$RATE" --env NCCL_MESH_RELAY=auto -- \
        relay-bench --sizes 4M --bw-bytes "$BW_BYTES" --rounds 1 --lat-iters 10 2>&1)
    echo "$out" >>"$LOG"
    record relay "$(echo "$out" | field bw_ratio_4M 0)"
    out=$(e2e --nodes 4 --topology ring --rate "$RATE" --env NCCL_MESH_RELAY=auto -- \
        coll-bench --algo contention --ceiling "$CEIL" --seconds 3 2>&1)
    echo "$out" >>"$LOG"
    record share_min "$(echo "$out" | field share_min 2)"
    record share_sum "$(echo "$out" | field share_sum 2)"
    # 6. the same on Spark cables: two functions per cable end, each capped.
    local spark=(--functions 2 --rate "$RATE" --fn-rate "$FN_RATE" --env NCCL_MESH_RELAY=auto)
    out=$(e2e --nodes 4 --topology ring "${spark[@]}" -- \
        relay-bench --sizes 4M --bw-bytes "$BW_BYTES" --rounds 1 --lat-iters 10 2>&1)
    echo "$out" >>"$LOG"
    record spark_relay "$(echo "$out" | field bw_ratio_4M 0)"
    for algo in ring tree alltoall; do
        out=$(e2e --nodes 4 --topology ring "${spark[@]}" -- coll-bench --algo "$algo" --bytes 64M --ceiling "$CEIL" 2>&1)
        echo "$out" >>"$LOG"
        record "spark_ring4_$algo" "$(echo "$out" | field fraction 0)"
    done
    out=$(e2e --nodes 4 --topology ring "${spark[@]}" -- coll-bench --algo contention --ceiling "$CEIL" --seconds 3 2>&1)
    echo "$out" >>"$LOG"
    record spark_share_min "$(echo "$out" | field share_min 2)"
    record spark_share_sum "$(echo "$out" | field share_sum 2)"
    # 7. all-to-all on a 6-ring: the opposite nodes' pairs have two shortest ways each.
    out=$(e2e --nodes 6 --topology ring --rate "$RATE" --env NCCL_MESH_RELAY=auto -- \
        coll-bench --algo alltoall --bytes 64M --ceiling "$CEIL" 2>&1)
    echo "$out" >>"$LOG"
    record ring6_alltoall "$(echo "$out" | field fraction 0)"
    out=$(e2e --nodes 6 --topology ring "${spark[@]}" -- coll-bench --algo alltoall --bytes 64M --ceiling "$CEIL" 2>&1)
    echo "$out" >>"$LOG"
    record spark_ring6_alltoall "$(echo "$out" | field fraction 0)"
    # 8. one relay per connection (the default is two where two ways are as short).
    for algo in tree alltoall; do
        out=$(e2e --nodes 4 --topology ring --rate "$RATE" --env NCCL_MESH_RELAY=auto --env NCCL_MESH_RELAY_TWIN=0 -- \
            coll-bench --algo "$algo" --bytes 64M --ceiling "$CEIL" 2>&1)
        echo "$out" >>"$LOG"
        record "one_ring4_$algo" "$(echo "$out" | field fraction 0)"
        out=$(e2e --nodes 4 --topology ring "${spark[@]}" --env NCCL_MESH_RELAY_TWIN=0 -- \
            coll-bench --algo "$algo" --bytes 64M --ceiling "$CEIL" 2>&1)
        echo "$out" >>"$LOG"
        record "one_spark_ring4_$algo" "$(echo "$out" | field fraction 0)"
    done
}

worst() {  # worst NAME: the lowest value of NAME over the rounds
    sed -n "s/^FIG round=[0-9]* $1=//p" "$LOG" | sort -g | head -n1
}

best() {  # best NAME: the highest value of NAME over the rounds
    sed -n "s/^FIG round=[0-9]* $1=//p" "$LOG" | sort -g | tail -n1
}

link_rate() {
    local fn_bytes
    CEIL=$(ceiling_of "$RATE")
    FN_RATE=${FN_RATE:-$(awk -v r="$(rate_bytes "$RATE")" 'BEGIN { printf "%.0f", r * 0.56 }')}
    fn_bytes=$(rate_bytes "$FN_RATE")
    # About 2 s per bandwidth size at the cap.
    BW_BYTES=$(awk -v c="$CEIL" 'BEGIN { printf "%.0fM", c * 2 / 1048576 }')
    missing=0
    for round in $(seq 1 "$ROUNDS"); do
        echo "bench-fabric: round $round of $ROUNDS" | tee -a "$LOG"
        one_round
    done
    local k
    declare -A B W
    for k in perftest65536 perftest1048576 perftest16777216 plugin65536 plugin1048576 plugin16777216 \
             spark_both spark_one tri_ring ring4_ring ring4_tree ring4_alltoall relay share_min share_sum \
             spark_relay spark_ring4_ring spark_ring4_tree spark_ring4_alltoall spark_share_min spark_share_sum \
             ring6_alltoall spark_ring6_alltoall one_ring4_tree one_ring4_alltoall one_spark_ring4_tree \
             one_spark_ring4_alltoall; do
        B[$k]=$(best "$k")
        W[$k]=$(worst "$k")
        [ -n "${B[$k]}" ] || missing=1
    done
    {
        echo
        echo "bench-fabric --link-rate: emulated links (userspace fabric), cable $RATE per direction"
        echo "  ($(awk -v c="$CEIL" 'BEGIN { printf "%.1f", c / 1e6 }') MB/s goodput ceiling at MTU 4096), Spark function cap $FN_RATE;"
        echo "  best of $ROUNDS alternating rounds; receivers spin; fractions of the ceiling or bound"
        echo
        echo "| figure | fraction | of what |"
        echo "|---|---|---|"
        echo "| plugin, pair, 64 KiB | ${B[plugin65536]:--} | one cable's goodput ceiling |"
        echo "| plugin, pair, 1 MiB | ${B[plugin1048576]:--} | one cable's goodput ceiling |"
        echo "| plugin, pair, 16 MiB | ${B[plugin16777216]:--} | one cable's goodput ceiling |"
        echo "| perftest ib_write_bw, 64 KiB / 1 MiB / 16 MiB | ${B[perftest65536]:--} / ${B[perftest1048576]:--} / ${B[perftest16777216]:--} | one cable's goodput ceiling |"
        echo "| plugin, Spark cable, both functions, 16 MiB | ${B[spark_both]:--} | the wire's ceiling |"
        echo "| plugin, Spark cable, one function, 16 MiB | ${B[spark_one]:--} | the wire's ceiling (the function's cap: $(awk -v f="$fn_bytes" -v r="$(rate_bytes "$RATE")" 'BEGIN { printf "%.2f", f / r }')) |"
        echo "| ring all-reduce 64 MiB, triangle | ${B[tri_ring]:--} | busbw bound: one cable direction per rank |"
        echo "| ring all-reduce 64 MiB, 4-ring | ${B[ring4_ring]:--} | busbw bound: one cable direction per rank |"
        echo "| relayed 0 -> 2 / direct 0 -> 1, 4 MiB, 4-ring | ${B[relay]:--} | a direct stream |"
        echo "| tree all-reduce 64 MiB, 4-ring, relayed edges | ${B[ring4_tree]:--} | busbw bound of the cabling (best relays) |"
        echo "| all-to-all 64 MiB, 4-ring, relayed pairs | ${B[ring4_alltoall]:--} | busbw bound of the cabling (best relays) |"
        echo "| contention: relayed + direct into one cable, min share / sum | ${B[share_min]:--} / ${B[share_sum]:--} | that cable's ceiling |"
        echo "| Spark cables: relayed 0 -> 2 / direct 0 -> 1, 4 MiB, 4-ring | ${B[spark_relay]:--} | a direct stream (both functions) |"
        echo "| Spark cables: ring all-reduce 64 MiB, 4-ring | ${B[spark_ring4_ring]:--} (worst round ${W[spark_ring4_ring]:--}) | busbw bound: one cable (wire) direction per rank |"
        echo "| Spark cables: tree all-reduce 64 MiB, 4-ring | ${B[spark_ring4_tree]:--} (worst round ${W[spark_ring4_tree]:--}) | busbw bound of the cabling (best relays) |"
        echo "| Spark cables: all-to-all 64 MiB, 4-ring | ${B[spark_ring4_alltoall]:--} (worst round ${W[spark_ring4_alltoall]:--}) | busbw bound of the cabling (best relays) |"
        echo "| Spark cables: contention, min share / sum | ${B[spark_share_min]:--} / ${B[spark_share_sum]:--} | that cable's (wire's) ceiling |"
        echo "| all-to-all 64 MiB, 6-ring / on Spark cables | ${B[ring6_alltoall]:--} / ${B[spark_ring6_alltoall]:--} | busbw bound of the cabling (best relays) |"
        echo "| worst round: tree / all-to-all, 4-ring | ${W[ring4_tree]:--} / ${W[ring4_alltoall]:--} | as above |"
        echo "| one relay (NCCL_MESH_RELAY_TWIN=0): tree / all-to-all, 4-ring | ${B[one_ring4_tree]:--} / ${B[one_ring4_alltoall]:--} (worst ${W[one_ring4_tree]:--} / ${W[one_ring4_alltoall]:--}) | busbw bound of the cabling (best relays) |"
        echo "| one relay (NCCL_MESH_RELAY_TWIN=0), Spark cables: tree / all-to-all, 4-ring | ${B[one_spark_ring4_tree]:--} / ${B[one_spark_ring4_alltoall]:--} (worst ${W[one_spark_ring4_tree]:--} / ${W[one_spark_ring4_alltoall]:--}) | as above |"
        echo
        printf 'LINKRATE pair64k=%.2f pair1m=%.2f pair16m=%.2f perftest1m=%.2f halves=%.2f onefn=%.2f tri_ring=%.2f ring4_ring=%.2f relay=%.2f ring4_tree=%.2f ring4_a2a=%.2f share_min=%.2f share_sum=%.2f' \
            "${B[plugin65536]:-0}" "${B[plugin1048576]:-0}" "${B[plugin16777216]:-0}" "${B[perftest1048576]:-0}" \
            "${B[spark_both]:-0}" "${B[spark_one]:-0}" "${B[tri_ring]:-0}" "${B[ring4_ring]:-0}" "${B[relay]:-0}" \
            "${B[ring4_tree]:-0}" "${B[ring4_alltoall]:-0}" "${B[share_min]:-0}" "${B[share_sum]:-0}"
        printf ' spark_relay=%.2f spark_ring4_ring=%.2f spark_ring4_tree=%.2f spark_ring4_a2a=%.2f spark_share_min=%.2f spark_share_sum=%.2f ring6_a2a=%.2f spark_ring6_a2a=%.2f\n' \
            "${B[spark_relay]:-0}" "${B[spark_ring4_ring]:-0}" "${B[spark_ring4_tree]:-0}" "${B[spark_ring4_alltoall]:-0}" \
            "${B[spark_share_min]:-0}" "${B[spark_share_sum]:-0}" "${B[ring6_alltoall]:-0}" "${B[spark_ring6_alltoall]:-0}"
        printf 'LINKRATE-WORST ring4_tree=%.2f ring4_a2a=%.2f spark_ring4_tree=%.2f spark_ring4_a2a=%.2f\n' \
            "${W[ring4_tree]:-0}" "${W[ring4_alltoall]:-0}" "${W[spark_ring4_tree]:-0}" "${W[spark_ring4_alltoall]:-0}"
        printf 'LINKRATE-ONE-RELAY ring4_tree=%.2f ring4_a2a=%.2f spark_ring4_tree=%.2f spark_ring4_a2a=%.2f worst: %.2f %.2f %.2f %.2f\n' \
            "${B[one_ring4_tree]:-0}" "${B[one_ring4_alltoall]:-0}" "${B[one_spark_ring4_tree]:-0}" \
            "${B[one_spark_ring4_alltoall]:-0}" "${W[one_ring4_tree]:-0}" "${W[one_ring4_alltoall]:-0}" \
            "${W[one_spark_ring4_tree]:-0}" "${W[one_spark_ring4_alltoall]:-0}"
    } | tee "$OUT/summary.txt"
    [ "$missing" = 0 ] || { echo "bench-fabric: some figures are missing (see $LOG)"; exit 2; }
}

# coll-bench --vs on a 2-node fabric: the plugin and NCCL's IB transport in the same two
# processes, iterations alternating; the drop-in first in LD_LIBRARY_PATH (NCCL's IB transport
# dlopens libibverbs.so).
vs_run() {  # vs_run LIB ALGO NET ARGS...: every rank's output (NET: fabric-net's arguments
            # for the network, --rate R added unless they give the links a rate)
    local lib=$1 algo=$2 rate=() net
    read -r -a net <<<"$3"
    shift 3
    [ "$RATE_SET" = 1 ] && [[ " ${net[*]} " != *" --rate "* ]] && rate=(--rate "$RATE")
    fabric "${net[@]}" "${rate[@]}" -- env LD_LIBRARY_PATH="$BUILD/tests/fabric/dropin:$BUILD" \
        "$BUILD/tests/e2e/mesh_e2e" coll-bench --vs "nccl-ib:$lib" --algo "$algo" "$@" 2>&1
}

median() {  # median NAME [FORMAT]: the median of NAME's values over the rounds
    sed -n "s/^FIG round=[0-9]* $1=//p" "$LOG" | sort -g |
        awk -v f="${2:-%.3f}" '{ v[n++] = $1 } END { if (n) printf f, n % 2 ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2 }'
}

vs_nccl_ib() {
    local lib=$NCCL_LIB out algo args
    if [ -z "$lib" ]; then
        lib=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / { print $NF; exit }')
        [ -n "$lib" ] || lib=/usr/local/cuda/lib64/libnccl.so.2
    fi
    [ -f "$lib" ] || die "no libnccl.so.2 (--nccl LIB): NCCL's IB transport is the reference"
    missing=0
    # spark_sendrecv: one DGX Spark cable (two functions per end): the plugin as one device of
    # two functions with NCCL's 2 channels, NCCL IB with a device per function and 4 channels,
    # channel k on device k % 2, as NCCL ran them on the GPU machine.
    # switch4_spark_alltoall: its links' rate is its own (switch_rate), and its figure is read
    # against the switch's bound too (--ceiling).
    local switch_rate=25M switch_fn_rate=14M
    declare -A ARGS=([sendrecv]="--bytes 256M --channels 2 --slice 128K --iters 20"
                     [ring]="--bytes 256M --channels 2 --slice 512K --iters 20"
                     [spark_sendrecv]="--bytes 256M --channels 2 --ref-channels 4 --spread-devices --slice 128K --iters 20"
                     [sendrecv_oldest]="--bytes 256M --channels 2 --slice 128K --iters 20 --test-oldest"
                     [switch4_spark_alltoall]="--bytes 32M --peer-channels 2 --spread-devices --iters 5 --ceiling $(ceiling_of "$switch_rate")")
    declare -A ALGO=([sendrecv]=sendrecv [ring]=ring [spark_sendrecv]=sendrecv [sendrecv_oldest]=sendrecv
                     [switch4_spark_alltoall]=alltoall)
    declare -A NET=([sendrecv]="--nodes 2" [ring]="--nodes 2" [spark_sendrecv]="--nodes 2 --functions 2"
                    [sendrecv_oldest]="--nodes 2"
                    [switch4_spark_alltoall]="--nodes 4 --topology switch --functions 2 --fn-subnets split --rate $switch_rate --fn-rate $switch_fn_rate")
    local figures=(sendrecv sendrecv_oldest ring spark_sendrecv switch4_spark_alltoall) f
    if [ -n "$FIGURES" ]; then
        for f in ${FIGURES//,/ }; do
            [ -n "${ARGS[$f]:-}" ] || die "--figures: no figure $f (${figures[*]})"
        done
        read -r -a figures <<<"${FIGURES//,/ }"
    fi
    for round in $(seq 1 "$ROUNDS"); do
        echo "bench-fabric: round $round of $ROUNDS" | tee -a "$LOG"
        for algo in "${figures[@]}"; do
            read -r -a args <<<"${ARGS[$algo]}"
            out=$(vs_run "$lib" "${ALGO[$algo]}" "${NET[$algo]}" "${args[@]}")
            echo "$out" >>"$LOG"
            record "${algo}_ratio" "$(echo "$out" | field vs_ratio_median 0)"
            record "${algo}_plugin" "$(echo "$out" | field busbw_MBps 0)"
            record "${algo}_ib" "$(echo "$out" | field ref_busbw_MBps 0)"
            [ "$algo" = switch4_spark_alltoall ] && record "${algo}_fraction" "$(echo "$out" | field fraction 0)"
        done
    done
    local line="VSNCCLIB" r
    {
        echo
        echo "bench-fabric --vs-nccl-ib: 2 nodes, one cable of the userspace fabric ($([ "$RATE_SET" = 1 ] && echo "$RATE per direction" || echo uncapped));"
        echo "  the plugin and NCCL's IB transport ($lib) in the same processes, iterations alternating;"
        echo "  $ROUNDS runs: the median over runs of each run's median per-iteration ratio, and of each run's best busbw (MB/s)"
        echo
        echo "| figure | plugin / NCCL IB | plugin MB/s | NCCL IB MB/s |"
        echo "|---|---|---|---|"
        for algo in "${figures[@]}"; do
            r=$(median "${algo}_ratio")
            echo "| ${algo} (${ARGS[$algo]}) | ${r:--} | $(median "${algo}_plugin" %.0f) | $(median "${algo}_ib" %.0f) |"
            line+=" $algo=${r:-missing}"
        done
        if [[ " ${figures[*]} " == *" switch4_spark_alltoall "* ]]; then
            echo
            echo "switch4_spark_alltoall: 4 nodes on a switch, Spark cables to it at $switch_rate (functions $switch_fn_rate);"
            echo "  the plugin's busbw / the switch's bound (each node's one cable): $(median switch4_spark_alltoall_fraction)"
        fi
        echo
        echo "$line"
    } | tee "$OUT/summary.txt"
    [ "$missing" = 0 ] || { echo "bench-fabric: some figures are missing (see $LOG)"; exit 2; }
}

calibrate() {
    local rate ceil out worst round all
    for rate in ${RATES//,/ }; do
        ceil=$(ceiling_of "$rate")
        all=""
        for round in $(seq 1 "$ROUNDS"); do
            out=$(fabric --nodes 4 --topology ring --rate "$rate" -- "$0" --rank calibrate "$SECONDS_PER_STREAM" 2>&1)
            echo "$out" >>"$LOG"
            all+=$(echo "$out" | sed -n 's/^\[[0-9]*\] LR stream from=\([0-9]*\) to=\([0-9]*\) MBps=/\1-\2 /p')$'\n'
            worst=$(echo "$out" | sed -n 's/^\[[0-9]*\] LR stream from=[0-9]* to=[0-9]* MBps=//p' |
                awk -v c="$ceil" '{ f = $1 * 1048576 / c; if (!n++ || f < m) m = f } END { if (n == 8) printf "%.3f", m; else print "missing(" n " of 8)" }')
            echo "CALIBRATE rate=$rate round=$round min_fraction=$worst" >>"$LOG"
        done
        # Each stream's best round (as the benchmark keeps each figure's best), then the worst stream.
        worst=$(echo "$all" | awk -v c="$ceil" 'NF == 2 { f = $2 * 1048576 / c; if (f > b[$1]) b[$1] = f }
            END { n = 0; for (k in b) { if (!n++ || b[k] < m) m = b[k] } if (n == 8) printf "%.3f", m; else print "missing(" n " of 8)" }')
        echo "CALIBRATE rate=$rate streams=8 (4-ring, both directions of every cable, best of $ROUNDS per stream) min_fraction=$worst" | tee -a "$LOG"
    done
}

main() {
    if [ "${1:-}" = --rank ]; then
        SECONDS_PER_STREAM=${LINKRATE_SECONDS:-3}
        case "$2" in
            calibrate) SECONDS_PER_STREAM=$3; rank_calibrate ;;
            perftest) rank_perftest "$3" "$4" "$5" ;;
            *) die "unknown rank task $2" ;;
        esac
        return
    fi
    while [ $# -gt 0 ]; do
        case "$1" in
            --link-rate) MODE=link-rate; shift ;;
            --vs-nccl-ib) MODE=vs-nccl-ib; shift ;;
            --nccl) NCCL_LIB=$2; shift 2 ;;
            --figures) FIGURES=$2; shift 2 ;;
            --calibrate) MODE=calibrate; shift ;;
            --build) BUILD=$2; shift 2 ;;
            --rate) RATE=$2; RATE_SET=1; shift 2 ;;
            --fn-rate) FN_RATE=$2; shift 2 ;;
            --rates) RATES=$2; shift 2 ;;
            --rounds) ROUNDS=$2; shift 2 ;;
            --seconds) SECONDS_PER_STREAM=$2; shift 2 ;;
            --out) OUT=$2; shift 2 ;;
            -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
            *) die "unknown argument $1 (see --help)" ;;
        esac
    done
    [ -n "$MODE" ] || die "say --link-rate, --vs-nccl-ib or --calibrate (see --help)"
    [ -n "$ROUNDS" ] || { [ "$MODE" = vs-nccl-ib ] && ROUNDS=5 || ROUNDS=3; }
    BUILD=$(cd "${BUILD:-$REPO/build}" 2>/dev/null && pwd) || die "no build directory (--build)"
    for f in nccl-mesh-perf libnccl-net-mesh.so tests/e2e/mesh_e2e tests/fabric/dropin/libibverbs.so.1; do
        [ "$MODE" = vs-nccl-ib ] && [ "$f" = nccl-mesh-perf ] && continue
        [ -e "$BUILD/$f" ] || die "$BUILD/$f not built (cmake --build $BUILD)"
    done
    [ "$MODE" = vs-nccl-ib ] || command -v ib_write_bw >/dev/null || die "perftest not installed (apt-get install perftest)"
    OUT=${OUT:-$BUILD/bench-fabric/$(date +%Y%m%d-%H%M%S)-$MODE}
    mkdir -p "$OUT" || die "cannot create $OUT"
    LOG="$OUT/run.log"
    echo "bench-fabric: results in $OUT"
    case "$MODE" in
        calibrate) calibrate ;;
        vs-nccl-ib) vs_nccl_ib ;;
        *) link_rate ;;
    esac
}

main "$@"
