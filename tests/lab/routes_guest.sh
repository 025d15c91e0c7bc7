#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs in every guest: nccl-mesh-info --routes must list this node's links as attached
# relay routes, and with NCCL_MESH_ROUTES sending every subnet we are not on through our
# first neighbour, show that route for each of them and, for a peer address on such a
# subnet, say a relay would go through that neighbour (while the direct route still fails:
# the relay is not active). Usage: routes_guest.sh PATH_TO_NCCL_MESH_INFO
set -u
rdma=rxe
[ -z "${MESHFAB_DIR:-}" ] || rdma=fab
info=$1
fails=0
fail() { echo "FAIL rank $VMESH_RANK: $*"; fails=$((fails + 1)); }

via=""
mine=""
others=""
# VMESH_LINK_TABLE lines: L node_a node_b netdev_a netdev_b addr_a addr_b
while read -r link a b dev_a dev_b addr_a addr_b; do
  [ -n "$link" ] || continue
  if [ "$a" = "$VMESH_RANK" ]; then mine="$mine $addr_a:$dev_a"; [ -n "$via" ] || via=$addr_b
  elif [ "$b" = "$VMESH_RANK" ]; then mine="$mine $addr_b:$dev_b"; [ -n "$via" ] || via=$addr_a
  else others="$others $addr_b"; fi
done <"$VMESH_LINK_TABLE"

routes=""
for addr in $others; do routes="$routes${routes:+,}${addr%.*}.0/24=$via"; done
export NCCL_MESH_ROUTES="$routes"
out=$("$info" --routes 2>&1)
for entry in $mine; do
  addr=${entry%%:*}
  dev=${entry#*:}
  echo "$out" | grep -Eq "^  ${addr%.*}\.0/24 attached hops 0 on ${rdma}_$dev:1/$dev\$" ||
    fail "no attached route for ${addr%.*}.0/24 on ${rdma}_$dev:1/$dev"
done
for addr in $others; do
  echo "$out" | grep -Eq "^  ${addr%.*}\.0/24 static hops 1 on [^ ]+ via $via\$" ||
    fail "no static route for ${addr%.*}.0/24 via $via"
  peer=$("$info" --routes --peer "$addr" 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "peer $addr: exit $rc, expected 2 (no direct route; the relay is not active)"
  echo "$peer" | grep -Fq "with NCCL_MESH_RELAY=auto a relay goes via $via (static, 1 relay hop) to $addr" ||
    fail "peer $addr: no relay way via $via: $(echo "$peer" | grep -F 'relay' | tail -n 1)"
done
echo "$out" | grep -q "NCCL_MESH_ROUTES.*ignored" && fail "a static route was ignored: $(echo "$out" | grep ignored)"
[ "$fails" -eq 0 ] && echo "PASS rank $VMESH_RANK: relay table with $(echo "$mine" | wc -w) links, $(echo "$others" | wc -w) static routes via $via"
[ "$fails" -eq 0 ]
