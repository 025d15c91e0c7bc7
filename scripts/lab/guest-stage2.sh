#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# vmesh guest stage 2: runs inside every guest as root, chrooted into the host's
# root file system, with the host's own iproute2 and rdma-core.
#
# Cables the guest (renames each NIC after the peer it reaches, by MAC), puts a
# Soft-RoCE (rxe) device on every link, waits until each port is ACTIVE with its
# IPv4 RoCEv2 GID, then runs the user's command and records its exit status in
# the run directory, which the host reads once the guest has powered off.
#
# Input: $VMESH_RUN/ctl/node$VMESH_RANK.env, written by scripts/vmesh. Lines
# starting with "@@vmesh:" are progress markers that the host parses.
# shellcheck disable=SC2154  # the vm_* variables come from that file
set -u
ctl="$VMESH_RUN/ctl"
# shellcheck source=/dev/null
. "$ctl/node$VMESH_RANK.env"

marker() { echo "@@vmesh:$*"; }

# The result file is what the host trusts; write it whole or not at all.
result() {
    echo "$*" >"$ctl/result.$VMESH_RANK.tmp" &&
        mv "$ctl/result.$VMESH_RANK.tmp" "$ctl/result.$VMESH_RANK"
}

setup_failed() {
    marker "setup-failed $*"
    result "setup $*"
    exit 1
}

netdev_with_mac() {
    for dev in /sys/class/net/*; do
        read -r mac <"$dev/address"
        if [ "$mac" = "$1" ]; then
            echo "${dev##*/}"
            return 0
        fi
    done
    return 1
}

# $vm_links has one line per link: netdev-name mac address/prefix rxe-name.
# All commands go into one `ip -batch` and one `rdma -b`: every program
# start costs tens of milliseconds under TCG.
cable_links() {
    nl='
'
    ip_cmds="link set dev lo up"
    rdma_cmds=""
    while read -r name mac addr rxe; do
        [ -n "$name" ] || continue
        dev=$(netdev_with_mac "$mac") || setup_failed "no NIC with MAC $mac (for $name)"
        ip_cmds="$ip_cmds${nl}link set dev $dev name $name"
        ip_cmds="$ip_cmds${nl}link set dev $name mtu $vm_mtu up"
        ip_cmds="$ip_cmds${nl}address add $addr dev $name"
        rdma_cmds="$rdma_cmds${nl}link add $rxe type rxe netdev $name"
    done <<LINKS
$vm_links
LINKS
    if [ -n "$vm_mgmt" ]; then
        # shellcheck disable=SC2086  # "mac address/prefix": two words
        set -- $vm_mgmt
        dev=$(netdev_with_mac "$1") || setup_failed "no NIC with MAC $1 (for mgmt)"
        ip_cmds="$ip_cmds${nl}link set dev $dev name mgmt${nl}link set dev mgmt up"
        ip_cmds="$ip_cmds${nl}address add $2 dev mgmt"
    fi
    out=$(echo "$ip_cmds" | ip -batch - 2>&1) ||
        setup_failed "configuring NICs failed: $out"
    [ -n "$rdma_cmds" ] || return 0
    out=$(echo "$rdma_cmds" | rdma -b - 2>&1) ||
        setup_failed "adding rxe devices failed: $out"
}

# sysfs spells an IPv4-mapped GID as 0000:...:ffff:c612:0001.
ipv4_gid() {
    old_ifs=$IFS
    IFS=.
    # shellcheck disable=SC2086  # split the address into its four numbers
    set -- ${1%/*}
    IFS=$old_ifs
    printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$1" "$2" "$3" "$4"
}

# Succeeds when the rxe port is ACTIVE and lists the address as a RoCE v2 GID.
# rxe's GID table has 1024 entries and reading one costs milliseconds under TCG;
# in-use entries fill the lowest indices, so the scan stops at the first empty one.
port_ready() {
    port=/sys/class/infiniband/$1/ports/1
    read -r state 2>/dev/null <"$port/state" || return 1
    [ "$state" = "4: ACTIVE" ] || return 1
    want=$(ipv4_gid "$2")
    index=0
    while read -r gid 2>/dev/null <"$port/gids/$index"; do
        case "$gid" in 0000:0000:0000:0000:0000:0000:0000:0000) return 1 ;; esac
        if [ "$gid" = "$want" ]; then
            read -r type 2>/dev/null <"$port/gid_attrs/types/$index"
            [ "$type" = "RoCE v2" ] && return 0
        fi
        index=$((index + 1))
    done
    return 1
}

# Bounded poll: an rxe port follows its netdev's carrier a moment after creation.
wait_ports() {
    deadline=$(($(date +%s) + vm_link_timeout))
    while read -r name mac addr rxe; do
        [ -n "$name" ] || continue
        until port_ready "$rxe" "$addr"; do
            if [ "$(date +%s)" -ge "$deadline" ]; then
                state=$(cat "/sys/class/infiniband/$rxe/ports/1/state" 2>/dev/null)
                setup_failed "$rxe not ready after ${vm_link_timeout}s" \
                    "(port state '${state:-missing}', want a RoCE v2 GID for $addr)"
            fi
            sleep 0.1
        done
    done <<LINKS
$vm_links
LINKS
}

marker "stage2"
cable_links
marker "cabled"
wait_ports
marker "links-up"

marker "cmd"
(cd "$vm_cwd" && vm_cmd) </dev/null
rc=$?
result "exit $rc"
marker "exit $rc"
