# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh disable=SC3043  # `local`: dash, bash and busybox sh have it
# Helpers for lab test scripts that run inside vmesh guests (POSIX sh; sourced).
#
# Uses the environment vmesh gives every guest: VMESH_RANK, VMESH_NODES,
# VMESH_TOPOLOGY, VMESH_LINKS, VMESH_SHARED (a directory all guests share) and
# VMESH_LINK_TABLE (one line per link: L node_a node_b netdev_a netdev_b addr_a addr_b).
#
# Rendezvous between guests goes through files in $VMESH_SHARED; every wait is a
# poll with a deadline, never a bare sleep. Under TCG every program start costs
# 0.1 s or more, so helpers prefer shell builtins to spawning tools. Helpers keep
# their variables `local` (dash, bash and busybox sh have it) so that callers'
# variables survive.

LAB_DEADLINE_S=${LAB_DEADLINE_S:-120}

# The same checks run on the userspace fabric (tests/fabric) under scripts/fabric-net,
# which sets MESHFAB_DIR: its devices are fab_<netdev> instead of rxe_<netdev>, and all
# ranks share one /tmp there, so each rank keeps its scratch files apart.
if [ -n "${MESHFAB_DIR:-}" ]; then
    LAB_RDMA=${LAB_RDMA:-fab}
    LAB_TMP=${LAB_TMP:-$VMESH_SHARED/tmp.$VMESH_RANK}
else
    LAB_RDMA=${LAB_RDMA:-rxe}
    LAB_TMP=${LAB_TMP:-/tmp}
fi
mkdir -p "$LAB_TMP"

lab_fail() {
    echo "FAIL(rank $VMESH_RANK): $*" >&2
    exit 1
}

lab_note() {
    echo "lab: $*"
}

# Seconds since boot, read without starting a process.
lab_now() {
    local uptime _
    read -r uptime _ </proc/uptime
    echo "${uptime%.*}"
}

# Runs "$@" every 0.2 s until it succeeds; fails once $1 seconds have passed.
lab_poll() {
    local until=$(($(lab_now) + $1))
    shift
    until "$@"; do
        [ "$(lab_now)" -lt "$until" ] || return 1
        sleep 0.2
    done
}

# Peers this rank is cabled to, derived from the topology rules (not from vmesh's
# own link table, so the tests check vmesh's planner).
lab_expected_peers() {
    local n="$VMESH_NODES" r="$VMESH_RANK" peers p
    case "$VMESH_TOPOLOGY" in
        full | switch) peers=$(seq 0 $((n - 1))) ;;
        line) peers="$((r - 1)) $((r + 1))" ;;
        ring) peers="$(((r + 1) % n)) $(((r + n - 1) % n))" ;;
        *) lab_fail "unknown topology $VMESH_TOPOLOGY" ;;
    esac
    for p in $peers; do
        [ "$p" -ge 0 ] && [ "$p" -lt "$n" ] && [ "$p" -ne "$r" ] && echo "$p"
    done | sort -un
}

# RDMA device names the topology gives this node: rxe_p<peer>, rxe_p<peer>b, ... (fab_... on the
# fabric); on a switch its one port, rxe_sw.
lab_expected_devices() {
    local peer k
    if [ "$VMESH_TOPOLOGY" = switch ]; then
        echo "${LAB_RDMA}_sw"
        return
    fi
    for peer in $(lab_expected_peers); do
        set -- "" b c d e f g h
        k=0
        while [ "$k" -lt "$VMESH_LINKS" ]; do
            echo "${LAB_RDMA}_p$peer$1"
            shift
            k=$((k + 1))
        done
    done | sort
}

# This rank's links: "L peer netdev my_addr peer_addr" per line.
lab_my_links() {
    local l a b na nb aa ab
    while read -r l a b na nb aa ab; do
        if [ "$a" = "$VMESH_RANK" ]; then
            echo "$l $b $na $aa $ab"
        elif [ "$b" = "$VMESH_RANK" ]; then
            echo "$l $a $nb $ab $aa"
        fi
    done <"$VMESH_LINK_TABLE"
}

# `ibv_devinfo -v` for device $1, as the verbs API reports it. One ibv_devinfo
# run covers every device; it is cached in $LAB_TMP.
lab_devinfo() {
    [ -s "$LAB_TMP/lab.devinfo" ] || ibv_devinfo -v >"$LAB_TMP/lab.devinfo" ||
        lab_fail "ibv_devinfo -v failed"
    awk -v dev="$1" '/^hca_id:/ { this = ($2 == dev) } this' "$LAB_TMP/lab.devinfo"
}

# Names of the RDMA devices rdma-core lists here, sorted.
lab_rdma_devices() {
    lab_devinfo none >/dev/null
    awk '/^hca_id:/ { print $2 }' "$LAB_TMP/lab.devinfo" | sort
}

# Pings $1 once (busybox's ping in the guests, the system's where there is no busybox).
lab_ping() {
    if command -v busybox >/dev/null 2>&1; then
        busybox ping -c 1 -W 2 "$1"
    else
        ping -c 1 -W 2 "$1"
    fi
}

# Index of the RoCE v2 GID that carries IPv4 address $2 on device $1.
lab_gid_index() {
    lab_devinfo "$1" | awk -v want="::ffff:$2, RoCE v2" '
        /GID\[/ { line = $0; sub(/^[^]]*\]:[ \t]*/, "", line)
                  if (line == want) { gsub(/.*\[ *|\].*/, ""); print; exit } }'
}

# Succeeds once a TCP socket listens on port $1 (IPv4 or IPv6 wildcard).
lab_listening() {
    local hex table local_addr state
    hex=$(printf '%04X' "$1")
    for table in /proc/net/tcp /proc/net/tcp6; do
        while read -r _ local_addr _ state _; do
            [ "$state" = 0A ] && [ "${local_addr##*:}" = "$hex" ] && return 0
        done <"$table"
    done
    return 1
}

# Starts a server in the background and records "name port pid" in $LAB_TMP/lab.servers;
# lab_publish_servers waits until all of them listen. Output: $LAB_TMP/NAME.server.log.
lab_serve() {
    local name="$1" port="$2"
    shift 2
    timeout "$LAB_DEADLINE_S" "$@" >"$LAB_TMP/$name.server.log" 2>&1 &
    echo "$name $port $!" >>"$LAB_TMP/lab.servers"
}

# Waits until every server listens, then creates $VMESH_SHARED/ready.NAME for each,
# which lab_client waits for.
lab_publish_servers() {
    local name port pid
    while read -r name port pid; do
        if ! lab_poll "$LAB_DEADLINE_S" lab_listening "$port"; then
            cat "$LAB_TMP/$name.server.log"
            lab_fail "$name: server did not listen on port $port within ${LAB_DEADLINE_S}s"
        fi
        : >"$VMESH_SHARED/ready.$name"
    done <"$LAB_TMP/lab.servers"
}

# Waits for a server's ready file, then runs the client "$@" with a deadline.
lab_client() {
    local name="$1"
    shift
    lab_poll "$LAB_DEADLINE_S" test -e "$VMESH_SHARED/ready.$name" ||
        lab_fail "$name: peer never published ready.$name"
    timeout "$LAB_DEADLINE_S" "$@"
}

# Waits for every server started by lab_serve; prints their output; fails if any
# of them failed.
lab_reap_servers() {
    local name port pid status
    while read -r name port pid; do
        wait "$pid"
        status=$?
        sed "s/^/$name server: /" "$LAB_TMP/$name.server.log"
        [ "$status" -eq 0 ] || lab_fail "$name: server exited with status $status"
    done <"$LAB_TMP/lab.servers"
    rm -f "$LAB_TMP/lab.servers"
}

# Succeeds when every guest has created $VMESH_SHARED/barrier.$1.<rank>.
lab_all_arrived() {
    local rank=0
    while [ "$rank" -lt "$VMESH_NODES" ]; do
        [ -e "$VMESH_SHARED/barrier.$1.$rank" ] || return 1
        rank=$((rank + 1))
    done
}

# Waits until every guest has reached barrier $1. A guest whose command ends
# powers off, so guests that still talk to it must have finished first.
lab_barrier() {
    : >"$VMESH_SHARED/barrier.$1.$VMESH_RANK"
    lab_poll "$LAB_DEADLINE_S" lab_all_arrived "$1" ||
        lab_fail "not every guest reached barrier $1 within ${LAB_DEADLINE_S}s"
}
