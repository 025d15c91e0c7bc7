#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# bench-lab.sh: the plugin against raw verbs on the same lab link, in the same guests.
#
# One `scripts/vmesh run --nodes 2` session runs, between node 0 (client) and node 1
# (server), over link 0 (198.18.0.0/24, rxe_p1 on node 0, rxe_p0 on node 1):
#   perftest ib_write_bw at 64 KiB and 1 MiB, ib_write_lat at 8 B,
#   then nccl-mesh-perf (through the plugin's ABI) for the same sizes,
# and prints on the host the ratios against the issue's targets:
#   bandwidth plugin/ib_write_bw >= 0.90 at 1 MiB, >= 0.75 at 64 KiB;
#   latency   plugin/ib_write_lat <= 1.5 at 8 B.
# Absolute numbers in the lab mean little (TCG emulation, ~25 MB/s, ms latencies);
# only ratios measured in the same run are meaningful.
#
# With --fabric, the same two ranks run on the userspace fabric instead (tests/fabric:
# scripts/fabric-net namespaces, the drop-in libibverbs for perftest, NCCL_MESH_IBVERBS_LIB
# for the plugin), with a receiver that spins as NCCL's proxy does (no idle sleep) and
# larger defaults (BENCH_BW_BYTES 1G, BENCH_LAT_ITERS 2000, BENCH_REPEAT 3). Those ratios
# describe the emulator (shared memory between two processes on this machine), not a NIC.
#
# usage: scripts/bench-lab.sh [--fabric] [--build DIR] [--out DIR] [--strict]
#   --build DIR      the CMake build tree with nccl-mesh-perf and libnccl-net-mesh.so (and,
#                    with --fabric, the drop-in) (default $VMESH_BUILD_DIR or <repo>/build;
#                    --build-dir DIR: the same)
#   --out DIR        where the log, the raw tool outputs and summary.txt go
#                    (default <build>/bench-lab/<date>-<time>)
#   --strict         exit 1 when a ratio misses its target (default: report it, exit 0)
# Tunables (environment): BENCH_BW_BYTES (40M bytes per bandwidth size),
#   BENCH_LAT_ITERS (100), BENCH_BW_WINDOW (nccl-mesh-perf's window, 8),
#   BENCH_REPEAT (2: rounds of perftest then plugin; each figure is the best round's),
#   BENCH_BW_IDLE_SLEEP_US (50: nccl-mesh-perf --bw-idle-sleep-us). Why: the lab's NICs are
#   emulated by QEMU threads on the same 2 host cores as the guests' vCPUs; a receiver
#   that spins keeps its vCPU busy and starves that packet forwarding (measured here:
#   16 MB/s spinning vs 30 MB/s sleeping 50 us between empty polls, same build).
#   perftest's ib_write_bw server does not poll at all, so sleeping when idle is the fair
#   comparison. Latency is measured spinning (sched_yield), as ib_write_lat spins.
#   BENCH_TIMEOUT (vmesh --timeout, 900).
# Exit: 0 all figures measured (and, with --strict, on target); 1 below target with
# --strict; 2 a measurement failed or is missing.
#
# Internally the same script runs inside each guest as `bench-lab.sh --guest BUILD_DIR`
# and reports with "BENCH ..." / "PERF ..." lines that vmesh prefixes with "[rank] ".
set -u

REPO=$(cd "$(dirname "$0")/.." && pwd)

BW_SIZES="65536 1048576"
LAT_SIZE=8
FABRIC=0
for a in "$@"; do [ "$a" = --fabric ] && FABRIC=1; done
if [ "$FABRIC" = 1 ]; then
    BW_BYTES=${BENCH_BW_BYTES:-1G}
    LAT_ITERS=${BENCH_LAT_ITERS:-2000}
    REPEAT=${BENCH_REPEAT:-3}
    BW_IDLE_SLEEP_US=${BENCH_BW_IDLE_SLEEP_US:-0}
else
    BW_BYTES=${BENCH_BW_BYTES:-40M}
    LAT_ITERS=${BENCH_LAT_ITERS:-100}
    REPEAT=${BENCH_REPEAT:-2}
    BW_IDLE_SLEEP_US=${BENCH_BW_IDLE_SLEEP_US:-50}
fi
BW_WINDOW=${BENCH_BW_WINDOW:-8}
PORT_BASE=18515
SERVER_ADDR=198.18.0.2   # node 1 on link 0
TOOL_TIMEOUT=180         # any single tool run

die() {
    echo "bench-lab: $*" >&2
    exit 2
}

to_bytes() {  # 40M -> 41943040
    case "$1" in
        *K) echo $((${1%K} * 1024)) ;;
        *M) echo $((${1%M} * 1048576)) ;;
        *G) echo $((${1%G} * 1073741824)) ;;
        *) echo "$1" ;;
    esac
}

# ------------------------------------------------------------------------ inside a guest

# sysfs spells an IPv4-mapped GID 0000:0000:0000:0000:0000:ffff:c612:0001.
ipv4_gid() {
    local IFS=.
    # shellcheck disable=SC2086
    set -- $1
    printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$1" "$2" "$3" "$4"
}

# The GID index of the RoCE v2 GID for the IPv4 address of netdev $2 on device $1.
gid_index() {
    local dev=$1 netdev=$2 addr want gid idx
    addr=$(ip -4 -o addr show dev "$netdev" | awk '{print $4}' | cut -d/ -f1 | head -n1)
    [ -n "$addr" ] || return 1
    if [ ! -d /sys/class/infiniband/"$dev" ]; then  # the fabric: ask the verbs API
        ibv_devinfo -v -d "$dev" | awk -v want="::ffff:$addr, RoCE v2" '
            /GID\[/ { line = $0; sub(/^[^]]*\]:[ \t]*/, "", line)
                      if (line == want) { gsub(/.*\[ *|\].*/, ""); print; found = 1; exit } }
            END { exit !found }'
        return
    fi
    want=$(ipv4_gid "$addr")
    for gid in /sys/class/infiniband/"$dev"/ports/1/gids/*; do
        idx=${gid##*/}
        if [ "$(cat "$gid" 2>/dev/null)" = "$want" ] &&
            [ "$(cat /sys/class/infiniband/"$dev"/ports/1/gid_attrs/types/"$idx" 2>/dev/null)" = "RoCE v2" ]; then
            echo "$idx"
            return 0
        fi
    done
    return 1
}

# Runs one perftest tool. The server (rank 1) waits for one client; the client (rank 0)
# retries, bounded, until the server listens. Output goes to $results/<name>.<rank>.txt.
perftest() {
    local name=$1 tool=$2 size=$3 iters=$4 port=$5
    local out="$results/$name.$rank.txt" args try
    args=(-d "$dev" -x "$gid" -F -s "$size" -n "$iters" -p "$port")
    if [ "$rank" = 1 ]; then
        timeout "$TOOL_TIMEOUT" "$tool" "${args[@]}" >"$out" 2>&1
        echo "BENCH-RC $name $?"
        return 0
    fi
    for try in $(seq 1 60); do
        timeout "$TOOL_TIMEOUT" "$tool" "${args[@]}" "$SERVER_ADDR" >"$out" 2>&1 && return 0
        # Only "the server is not listening yet" is worth another try.
        grep -qiE "couldn't connect|connection refused|unable to (init|open)|failed to (create|connect)" "$out" || break
        sleep 1
    done
    echo "BENCH-ERROR $name: $tool failed (try $try):"
    sed 's/^/    /' "$out"
    return 1
}

# The data row of perftest's table: the first line whose first field is the size.
perftest_row() {
    awk -v size="$2" '$1 == size && NF >= 4 { print; exit }' "$1"
}

# One round: perftest's three figures, then nccl-mesh-perf's, on the same link.
measure() {
    local build=$1 rep=$2 bw_bytes i=0 size iters row port_base ok=0
    port_base=$((PORT_BASE + 10 * rep))
    bw_bytes=$(to_bytes "$BW_BYTES")
    for size in $BW_SIZES; do
        iters=$((bw_bytes / size))
        [ "$iters" -ge 5 ] || iters=5
        # A failure does not stop the round: both ranks must reach the same steps.
        perftest "ib_write_bw_$size.r$rep" ib_write_bw "$size" "$iters" $((port_base + i)) || ok=1
        i=$((i + 1))
        if [ "$rank" = 0 ] && row=$(perftest_row "$results/ib_write_bw_$size.r$rep.0.txt" "$size") && [ -n "$row" ]; then
            # #bytes #iterations BW_peak BW_average MsgRate  (MB/sec = 2^20 B/s)
            echo "$row" | awk -v s="$size" -v r="$rep" '{ printf "BENCH ib_write_bw size=%s MBps=%s iters=%s round=%s\n", s, $4, $2, r }'
        fi
    done
    perftest "ib_write_lat_$LAT_SIZE.r$rep" ib_write_lat "$LAT_SIZE" "$LAT_ITERS" $((port_base + i)) || ok=1
    if [ "$rank" = 0 ] && row=$(perftest_row "$results/ib_write_lat_$LAT_SIZE.r$rep.0.txt" "$LAT_SIZE") && [ -n "$row" ]; then
        # #bytes #iterations t_min t_max t_typical t_avg ...  (usec, half round trip)
        echo "$row" | awk -v s="$LAT_SIZE" -v r="$rep" '{ printf "BENCH ib_write_lat size=%s usec=%s min=%s avg=%s iters=%s round=%s\n", s, $5, $3, $6, $2, r }'
    fi

    # The plugin, same link (the only cable between the two nodes), same sizes.
    env LD_LIBRARY_PATH="$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        timeout 600 "$build/nccl-mesh-perf" --rank "$rank" --rendezvous "$VMESH_SHARED" --tag "bench$rep" \
        --lat-sizes "$LAT_SIZE" --lat-iters "$LAT_ITERS" --lat-warmup 5 \
        --bw-sizes "$(echo "$BW_SIZES" | tr ' ' ',')" --bw-iters 100000 --bw-bytes "$BW_BYTES" \
        --bw-warmup 2 --bw-window "$BW_WINDOW" --bw-idle-sleep-us "$BW_IDLE_SLEEP_US" --timeout 500 2>&1 | tee "$results/nccl-mesh-perf.r$rep.$rank.txt"
    if [ "${PIPESTATUS[0]}" != 0 ]; then
        echo "BENCH-ERROR nccl-mesh-perf failed on rank $rank (round $rep)"
        ok=1
    fi
    return $ok
}

guest() {
    local build=$1
    rank=${VMESH_RANK:?not in a vmesh guest}
    local peer=$((1 - rank))
    dev=${BENCH_RDMA:-rxe}_p$peer
    results="${VMESH_SHARED:?}/bench"
    mkdir -p "$results"
    gid=$(gid_index "$dev" "p$peer") || {
        echo "BENCH-ERROR no RoCE v2 IPv4 GID on $dev (netdev p$peer)"
        ls -l /sys/class/infiniband/ 2>&1
        return 1
    }
    echo "BENCH-INFO rank $rank: $dev gid index $gid, $(ip -4 -o addr show dev "p$peer" | awk '{print $4}')"
    local rep ok=0
    # Alternate the tools, REPEAT times: the host takes each tool's best figure, so a
    # burst of load on the shared host during one tool's turn does not skew the ratio.
    for rep in $(seq 1 "$REPEAT"); do
        measure "$build" "$rep" || ok=1
    done
    return $ok
}

# ------------------------------------------------------------------------ on the host

# best KEY LINE-PREFIX max|min: the best KEY=... over every "[0] LINE-PREFIX" line in $log.
best() {
    grep -a "^\[0\] $2" "$log" | tr ' ' '\n' | awk -F= -v k="$1" -v m="$3" '
        $1 == k { v = $2 + 0; if (!n++ || (m == "max" ? v > b : v < b)) b = v }
        END { if (n) print b }'
}

# row LABEL RAW PLUGIN MODE TARGET: one table line; MODE ge (ratio >= target) or le.
row() {
    local label=$1 raw=$2 plugin=$3 mode=$4 target=$5
    if [ -z "$raw" ] || [ -z "$plugin" ]; then
        printf '%-26s %14s %16s %8s %9s   %s\n' "$label" "${raw:--}" "${plugin:--}" "-" "$mode $target" "MISSING"
        missing=1
        return
    fi
    awk -v l="$label" -v r="$raw" -v p="$plugin" -v m="$mode" -v t="$target" 'BEGIN {
        if (r + 0 <= 0) { printf "%-26s %14s %16s %8s %9s   %s\n", l, r, p, "-", m " " t, "MISSING"; exit 3 }
        ratio = p / r
        ok = (m == ">=") ? (ratio >= t) : (ratio <= t)
        printf "%-26s %14.2f %16.2f %8.3f %9s   %s\n", l, r, p, ratio, m " " t, ok ? "PASS" : "BELOW"
        exit ok ? 0 : 1
    }'
    case $? in
        0) ;;
        1) below=1 ;;
        *) missing=1 ;;
    esac
}

host() {
    local build="" out="" strict=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --fabric) shift ;;
            --build|--build-dir) build=$2; shift 2 ;;
            --out) out=$2; shift 2 ;;
            --strict) strict=1; shift ;;
            -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
            *) die "unknown argument $1 (see --help)" ;;
        esac
    done
    build=$(cd "${build:-${VMESH_BUILD_DIR:-$REPO/build}}" 2>/dev/null && pwd) || die "no build directory (--build)"
    [ -x "$build/nccl-mesh-perf" ] || die "$build/nccl-mesh-perf not built (cmake --build $build)"
    [ -e "$build/libnccl-net-mesh.so" ] || die "$build/libnccl-net-mesh.so not built"
    if ! command -v ib_write_bw >/dev/null || ! command -v ib_write_lat >/dev/null; then
        die "perftest not installed (apt-get install perftest)"
    fi
    local where="Soft-RoCE link (QEMU lab)" runner=("$REPO/scripts/vmesh" run --build "$build")
    if [ "$FABRIC" = 1 ]; then
        local dropin="$build/tests/fabric/dropin"
        [ -e "$dropin/libibverbs.so.1" ] || die "$dropin/libibverbs.so.1 not built (cmake --build $build --target meshfab)"
        where="meshfab link (userspace fabric, fabric-net; emulator figures, not hardware)"
        runner=("$REPO/scripts/fabric-net" run --dropin "$dropin" --env BENCH_RDMA=fab
                --env "NCCL_MESH_IBVERBS_LIB=$dropin/libibverbs.so.1")
    fi
    out=${out:-$build/bench-lab/$(date +%Y%m%d-%H%M%S)$([ "$FABRIC" = 1 ] && echo -fabric)}
    mkdir -p "$out" || die "cannot create $out"
    log="$out/run.log"
    echo "bench-lab: results in $out"

    # The ranks get only PATH, LD_LIBRARY_PATH and NCCL_* from here: pass the tunables.
    "${runner[@]}" --nodes 2 --keep-shared \
        --timeout "${BENCH_TIMEOUT:-900}" --env "BENCH_BW_BYTES=$BW_BYTES" \
        --env "BENCH_LAT_ITERS=$LAT_ITERS" --env "BENCH_BW_WINDOW=$BW_WINDOW" --env "BENCH_BW_IDLE_SLEEP_US=$BW_IDLE_SLEEP_US" --env "BENCH_REPEAT=$REPEAT" \
        -- "$REPO/scripts/bench-lab.sh" --guest "$build" 2>&1 | tee "$log"
    local vmesh_rc=${PIPESTATUS[0]}
    # The shared directory was kept (raw tool outputs); bring them along, then drop it.
    local kept
    kept=$(sed -n 's/^\(vmesh\|fabric-net\): shared directory kept: //p' "$log" | tail -n1)
    if [ -n "$kept" ] && [ -d "$kept" ]; then
        cp -r "$kept/bench" "$out/raw" 2>/dev/null
        rm -rf "$kept"
        rmdir "$(dirname "$kept")" 2>/dev/null
    fi

    missing=0
    below=0
    {  # not a pipeline: row() sets missing/below in this shell
        echo
        echo "bench-lab: nccl-mesh (plugin, through its ABI) vs perftest on the same $where, same run"
        echo "  bandwidth in MB/s (2^20 B/s, perftest's unit); latency in usec, typical (median) half round trip;"
        echo "  nccl-mesh-perf window $BW_WINDOW, $BW_BYTES per bandwidth size, $LAT_ITERS latency iterations,"
        if [ "$BW_IDLE_SLEEP_US" = 0 ]; then
            echo "  the receiver spins on test() as NCCL's proxy does;"
        else
            echo "  bandwidth polls sleep ${BW_IDLE_SLEEP_US} us when idle (emulated NICs share the host cores);"
        fi
        echo "  each figure the best of $REPEAT alternating rounds (bandwidth: highest; latency: lowest typical)"
        printf '%-26s %14s %16s %8s %9s   %s\n' "metric" "ib_write_*" "nccl-mesh-perf" "ratio" "target" "verdict"
        row "bandwidth 64 KiB (MB/s)" "$(best MBps "BENCH ib_write_bw size=65536 " max)" \
            "$(best MBps "PERF bw size=65536 " max)" ">=" 0.75
        row "bandwidth 1 MiB (MB/s)" "$(best MBps "BENCH ib_write_bw size=1048576 " max)" \
            "$(best MBps "PERF bw size=1048576 " max)" ">=" 0.90
        row "latency 8 B (usec)" "$(best usec "BENCH ib_write_lat size=8 " min)" \
            "$(best usec "PERF lat size=8 " min)" "<=" 1.5
        echo "  (latency min: ib_write_lat $(best min "BENCH ib_write_lat size=8 " min) usec," \
             "plugin $(best min "PERF lat size=8 " min) usec)"
    } >"$out/summary.txt"
    cat "$out/summary.txt"

    if [ "$vmesh_rc" != 0 ] || [ "$missing" = 1 ]; then
        echo "bench-lab: FAILED: vmesh exit $vmesh_rc, missing figures: $missing (see $log)" | tee -a "$out/summary.txt"
        grep -a "BENCH-ERROR\|FAIL" "$log" | head -n 20
        exit 2
    fi
    if [ "$below" = 1 ]; then
        echo "bench-lab: some ratios are below target" | tee -a "$out/summary.txt"
        [ "$strict" = 1 ] && exit 1
    fi
    exit 0
}

if [ "${1:-}" = "--guest" ]; then
    [ $# -ge 2 ] || die "--guest needs the build directory"
    guest "$2"
    exit $?
fi
host "$@"
