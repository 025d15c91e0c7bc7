#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs in every guest: nccl-mesh-info must list exactly this node's rxe ports with the
# lab's addresses, /24 prefixes and RoCEv2 GID index 1, and route every address of every
# other node that shares a cable with us to the port on that cable (and fail for the rest).
# Usage: info_guest.sh PATH_TO_NCCL_MESH_INFO   (also on the fabric: devices fab_<netdev>)
set -u
rdma=rxe
[ -z "${MESHFAB_DIR:-}" ] || rdma=fab
info=$1
out=$("$info" 2>&1)
fails=0
fail() { echo "FAIL rank $VMESH_RANK: $*"; fails=$((fails + 1)); }

mine=0
peers=""
# VMESH_LINK_TABLE lines: L node_a node_b netdev_a netdev_b addr_a addr_b
while read -r link a b dev_a dev_b addr_a addr_b; do
  [ -n "$link" ] || continue
  if [ "$a" = "$VMESH_RANK" ]; then dev=$dev_a; addr=$addr_a; peer=$addr_b
  elif [ "$b" = "$VMESH_RANK" ]; then dev=$dev_b; addr=$addr_b; peer=$addr_a
  else peers="$peers $addr_a $addr_b"; continue; fi
  mine=$((mine + 1))
  # Port row: "rxe_p1:1 p1 ACTIVE 198.18.0.1/24 1 ..."
  echo "$out" | grep -Eq "^ *${rdma}_$dev:1 +$dev +ACTIVE +$addr/24 +1 " ||
    fail "no port row '${rdma}_$dev:1 $dev ACTIVE $addr/24 GID index 1'"
  route=$("$info" --peer "$peer" 2>&1)
  echo "$route" | grep -Eq "$peer -> ${rdma}_$dev:1/$dev via $addr/24 \(GID index 1\)" ||
    fail "peer $peer not routed to ${rdma}_$dev:1/$dev via $addr/24: $(echo "$route" | grep -F "$peer" | tail -n 1)"
done <"$VMESH_LINK_TABLE"

echo "$out" | grep -q "RDMA ports usable by the mesh: $mine\$" ||
  fail "expected exactly $mine usable ports: $(echo "$out" | grep 'usable by the mesh')"
for addr in $peers; do  # addresses on cables we are not on: no route, exit status 2
  "$info" --peer "$addr" >/dev/null 2>&1
  rc=$?
  [ "$rc" -eq 2 ] || fail "peer $addr on a cable we are not on: exit $rc, expected 2 (no route)"
done
[ "$fails" -eq 0 ] && echo "PASS rank $VMESH_RANK: $mine ports, routes to every cabled peer, none to the rest"
[ "$fails" -eq 0 ]
