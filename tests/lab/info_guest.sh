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
  # The ECE column (third from the end: GUID and PCI path follow): what a new QP offers (the
  # fabric answers as mlx5, MESHFAB_ECE; rxe has none).
  row=$(echo "$out" | grep -E "^ *${rdma}_$dev:1 +$dev +ACTIVE +$addr/24 ")
  if [ "$rdma" = fab ]; then want=" 0x15b3:0x30000001 "; else want=" no "; fi
  echo "$row" | awk '{print " " $(NF-2) " "}' | grep -qF -- "$want" ||
    fail "port row's ECE column is not$want: $row"
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
# --watch with no job (issue 34): no process, and on the real kernel (rxe) the NIC's own sysfs
# counters of every port; --prometheus writes them for node_exporter.
watch=$("$info" --watch --count 1 --interval 0.5 --stats-dir "/tmp/nccl-mesh-watch.$$" 2>&1)
echo "$watch" | grep -q "^nccl-mesh-info --watch: .* 0 process(es) with the plugin" ||
  fail "--watch with no job: $(echo "$watch" | head -n 3)"
echo "$watch" | grep -q "^WARN" && fail "--watch warned: $(echo "$watch" | grep '^WARN' | head -n 2)"
if [ "$rdma" = rxe ]; then
  while read -r link a b dev_a dev_b addr_a addr_b; do
    [ -n "$link" ] || continue
    if [ "$a" = "$VMESH_RANK" ]; then dev=$dev_a; elif [ "$b" = "$VMESH_RANK" ]; then dev=$dev_b; else continue; fi
    # NIC table row: "rxe_p1:1  -  -  ..." (rxe keeps no port data counters, only hw_counters)
    echo "$watch" | sed -n '/^NIC counters/,$p' | grep -Eq "^ +rxe_$dev:1 " ||
      fail "--watch lists no NIC counters row for rxe_$dev:1: $(echo "$watch" | sed -n '/^NIC counters/,$p' | head -n 4)"
  done <"$VMESH_LINK_TABLE"
  prom="/tmp/nccl-mesh-watch.$$.prom"
  "$info" --prometheus "$prom" --count 1 --interval 0.5 --stats-dir "/tmp/nccl-mesh-watch.$$" >/dev/null 2>&1 ||
    fail "--prometheus exited $?"
  grep -q '^nccl_mesh_processes 0$' "$prom" || fail "--prometheus: no 'nccl_mesh_processes 0' in $prom"
  grep -q '^nccl_mesh_nic_hw_counter_total{device="rxe_' "$prom" ||
    fail "--prometheus: no rxe hw_counters: $(grep -c . "$prom") lines"
  rm -f "$prom"
fi
rm -rf "/tmp/nccl-mesh-watch.$$"
[ "$fails" -eq 0 ] && echo "PASS rank $VMESH_RANK: $mine ports, routes to every cabled peer, none to the rest, --watch with no job"
[ "$fails" -eq 0 ]
