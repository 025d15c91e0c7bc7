#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Lab checks that run inside every vmesh guest: `lab_guest.sh STEP...`.
#
#   devices      the RDMA devices are exactly those the topology cables, each
#                ACTIVE, MTU 4096, with a RoCE v2 GID for its 198.18.L.(rank+1)
#   pingpong     ibv_rc_pingpong (data checked) over every link, both directions (on a
#                switch: with every other node, over the one port)
#   no-diagonal  (4-node ring) the opposite node is unreachable: no route, and a
#                pingpong to it fails fast instead of hanging
#   mgmt         every other guest answers ping on the management network
#
# Exits non-zero on the first failed check. Also runs on the userspace fabric under
# scripts/fabric-net (devices fab_<netdev>; see lib.sh).
# shellcheck disable=SC3043,SC2086  # `local` (see lib.sh); $PP_OPTS is a word list
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

PP_SIZE=4096
PP_ITERS=20
PP_MTU=4096

step_devices() {
    actual=$(lab_rdma_devices)
    expected=$(lab_expected_devices)
    [ "$actual" = "$expected" ] ||
        lab_fail "RDMA devices are [$(echo "$actual" | xargs)], want [$(echo "$expected" | xargs)]"
    while read -r l peer netdev addr peer_addr; do
        dev=${LAB_RDMA}_$netdev
        [ "$addr" = "198.18.$l.$((VMESH_RANK + 1))" ] || lab_fail "$netdev has $addr on link $l"
        [ "$peer_addr" = "198.18.$l.$((peer + 1))" ] || lab_fail "peer of $netdev is $peer_addr on link $l"
        case "$(ip -4 -o address show dev "$netdev")" in
            *" inet $addr/24 "*) ;;
            *) lab_fail "$netdev does not carry $addr/24" ;;
        esac
        info=$(lab_devinfo "$dev")
        case "$info" in *"state:"*PORT_ACTIVE*) ;; *) lab_fail "$dev is not ACTIVE" ;; esac
        case "$info" in *"active_mtu:"*"4096 (5)"*) ;; *) lab_fail "$dev active MTU is not 4096" ;; esac
        gid=$(lab_gid_index "$dev" "$addr")
        [ -n "$gid" ] || lab_fail "$dev has no RoCE v2 GID for $addr"
        lab_note "$dev on $netdev: $addr, peer $peer at $peer_addr, ACTIVE, MTU 4096, RoCE v2 GID index $gid"
    done <<EOF
$(lab_my_links)
EOF
}

# Sets PP_OPTS: ibv_rc_pingpong options for device $1 whose address is $2.
set_pp_opts() {
    local gid
    gid=$(lab_gid_index "$1" "$2")
    [ -n "$gid" ] || lab_fail "$1 has no RoCE v2 GID for $2"
    PP_OPTS="-d $1 -g $gid -c -s $PP_SIZE -n $PP_ITERS -m $PP_MTU"
}

# The TCP port of the pingpong between this rank and $2 on link $1: one per link and pair
# (on a switch every pair shares link 0 and the one port).
pp_port() {
    if [ "$VMESH_RANK" -lt "$2" ]; then
        echo $((20000 + 64 * $1 + 8 * VMESH_RANK + $2))
    else
        echo $((20000 + 64 * $1 + 8 * $2 + VMESH_RANK))
    fi
}

# Every guest serves each of its links on that link's port and is the client of the
# peer's server on the same link: both directions of every link, all at once.
step_pingpong() {
    links=$(lab_my_links)
    while read -r l peer netdev addr peer_addr; do
        set_pp_opts "${LAB_RDMA}_$netdev" "$addr"
        port=$(pp_port "$l" "$peer")
        lab_serve "pp$port.$VMESH_RANK" "$port" ibv_rc_pingpong $PP_OPTS -p "$port"
    done <<EOF
$links
EOF
    lab_publish_servers
    clients=""
    while read -r l peer netdev addr peer_addr; do
        set_pp_opts "${LAB_RDMA}_$netdev" "$addr"
        port=$(pp_port "$l" "$peer")
        lab_client "pp$port.$peer" ibv_rc_pingpong $PP_OPTS -p "$port" "$peer_addr" \
            >"$LAB_TMP/pp$port.client.log" 2>&1 &
        clients="$clients $port:$!:$peer_addr"
    done <<EOF
$links
EOF
    for c in $clients; do
        port=${c%%:*}
        rest=${c#*:}
        wait "${rest%%:*}" ||
            { cat "$LAB_TMP/pp$port.client.log"; lab_fail "pingpong client on port $port to ${rest#*:} failed"; }
        sed "s/^/pp$port client: /" "$LAB_TMP/pp$port.client.log"
    done
    lab_reap_servers
    lab_note "pingpong ok on every link, both directions"
}

# In a ring of 4 the opposite node is two hops away and shares no subnet with us.
step_no_diagonal() {
    { [ "$VMESH_TOPOLOGY" = ring ] && [ "$VMESH_NODES" -eq 4 ]; } || lab_fail "no-diagonal needs a 4-node ring"
    far=$(((VMESH_RANK + 2) % 4))
    ! lab_rdma_devices | grep -qx "${LAB_RDMA}_p$far" || lab_fail "${LAB_RDMA}_p$far exists: node $far is cabled"
    far_addrs=$(awk -v n="$far" '$2 == n { print $6 } $3 == n { print $7 }' "$VMESH_LINK_TABLE")
    [ -n "$far_addrs" ] || lab_fail "link table lists no address of node $far"
    read -r l peer netdev addr peer_addr <<EOF
$(lab_my_links)
EOF
    set_pp_opts "${LAB_RDMA}_$netdev" "$addr"
    for far_addr in $far_addrs; do
        if ip route get "$far_addr" >/dev/null 2>&1; then
            lab_fail "node $far's $far_addr is routable: $(ip route get "$far_addr")"
        fi
        timeout 30 ibv_rc_pingpong $PP_OPTS -p 20999 "$far_addr" >"$LAB_TMP/far.log" 2>&1
        status=$?
        [ "$status" -ne 0 ] || lab_fail "pingpong to unreachable $far_addr succeeded"
        [ "$status" -ne 124 ] || lab_fail "pingpong to unreachable $far_addr hung (killed after 30 s)"
        lab_note "node $far at $far_addr: no route; pingpong failed with status $status: $(head -n 1 "$LAB_TMP/far.log")"
    done
}

# The mgmt NICs share one subnet through vmesh's hub, whatever the topology: that
# is how jobs bootstrap (NCCL_SOCKET_IFNAME=mgmt) where the mesh has no path.
step_mgmt() {
    rank=0
    while [ "$rank" -lt "$VMESH_NODES" ]; do
        addr=198.19.0.$((rank + 1))
        # A peer may still be booting: poll, bounded.
        [ "$rank" -eq "$VMESH_RANK" ] ||
            lab_poll 60 lab_ping "$addr" >/dev/null ||
            lab_fail "rank $rank does not answer ping on mgmt ($addr)"
        rank=$((rank + 1))
    done
    lab_barrier mgmt
    lab_note "mgmt: every other guest answers ping on 198.19.0.0/24"
}

[ $# -gt 0 ] || lab_fail "usage: lab_guest.sh devices|pingpong|no-diagonal|mgmt..."
for step in "$@"; do
    case "$step" in
        devices) step_devices ;;
        pingpong) step_pingpong ;;
        no-diagonal) step_no_diagonal ;;
        mgmt) step_mgmt ;;
        *) lab_fail "unknown step $step" ;;
    esac
done
