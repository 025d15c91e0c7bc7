#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# lab_probe_line3: nccl-mesh-info --probe on a 3-node line (0 - 1 - 2: nodes 0 and 2 share
# no cable), each node running `nccl-mesh-info --serve` on its management address.
#   rank 0 probes rank 1: one cable, verified        (exit 0)
#   rank 0 probes rank 2: no cable, both sides' subnets named (exit 2)
#   rank 1 takes p2 (its cable to rank 2) down after its responder started; rank 2 probes
#   rank 1: the cable shares a subnet but carries nothing: its port, subnet and the
#   handshake error are named (exit 3)
#   rank 0: an NCCL_MESH_HCA include entry that matches no device gets a WARN
# Usage: probe_guest.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
build=$1
info=$build/nccl-mesh-info
mgmt() { echo "198.19.0.$(($1 + 1))"; }
fails=0
fail() { echo "FAIL probe rank $VMESH_RANK: $*"; fails=$((fails + 1)); }

# expect_probe PEER_RANK STATUS REGEX...: runs the probe, checks its exit status and that
# each extended regex matches a line of its output.
expect_probe() {
    peer=$1 want=$2
    shift 2
    "$info" --probe "$(mgmt "$peer")" --timeout 5 >"/tmp/probe.$peer" 2>&1
    rc=$?
    sed "s/^/[probe $VMESH_RANK->$peer] /" "/tmp/probe.$peer"
    [ "$rc" -eq "$want" ] || fail "probe of rank $peer exited $rc, expected $want"
    for re in "$@"; do
        grep -Eq "$re" "/tmp/probe.$peer" || fail "probe of rank $peer: no line matches '$re'"
    done
}

lab_serve "responder$VMESH_RANK" 18601 "$info" --serve --bind "$(mgmt "$VMESH_RANK")" --port 18601
if [ "$VMESH_RANK" = 1 ]; then
    # The responder found p2 ACTIVE at its start; now the cable goes dark on this side.
    lab_poll 30 lab_listening 18601 || lab_fail "the responder never listened"
    ip link set p2 down || lab_fail "ip link set p2 down"
fi
lab_publish_servers

case "$VMESH_RANK" in
0)
    lab_client responder1 true
    lab_client responder2 true
    expect_probe 1 0 \
        '^  cable 1: rxe_p1:1/p1 198\.18\.0\.1/24 <-> 198\.19\.0\.2 rxe_p0:1/p0 198\.18\.0\.2/24 \(subnet 198\.18\.0\.0/24\): OK: QP connected, 65536-byte RDMA write verified' \
        '^verdict: OK: 1 cable\(s\) to 198\.19\.0\.2 carry RDMA$'
    expect_probe 2 2 \
        '^verdict: NO CABLE: no cable between this node and 198\.19\.0\.3: no port here shares a subnet with a port there \(this node: 198\.18\.0\.1/24 on rxe_p1:1/p1; 198\.19\.0\.3: 198\.18\.1\.3/24 on rxe_p1:1/p1\)'
    NCCL_MESH_HCA=rxe_p1,mlx5_9 "$info" >/tmp/hca.out 2>&1
    grep -q "WARN NET/Mesh : NCCL_MESH_HCA='rxe_p1,mlx5_9': entry 'mlx5_9' matches no RDMA device (devices here: rxe_p1)" /tmp/hca.out ||
        fail "no WARN for the NCCL_MESH_HCA entry mlx5_9: $(cat /tmp/hca.out)"
    ;;
2)
    lab_client responder1 true
    expect_probe 1 3 \
        '^  cable 1: rxe_p1:1/p1 198\.18\.1\.3/24 <-> 198\.19\.0\.2 rxe_p2:1/p2 198\.18\.1\.2/24 \(subnet 198\.18\.1\.0/24\): FAILED: connect returned nccl[A-Za-z]+Error: .*198\.18\.1\.2' \
        '^verdict: FAILED: RDMA does not work over rxe_p1:1/p1 \(subnet 198\.18\.1\.0/24\) to 198\.19\.0\.2'
    ;;
esac

lab_barrier probed
kill "$(awk '{print $3}' /tmp/lab.servers)" 2>/dev/null
[ "$fails" -eq 0 ] && echo "PASS probe rank $VMESH_RANK"
[ "$fails" -eq 0 ]
