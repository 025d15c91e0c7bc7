#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs in every guest at about the same time: nccl-mesh-info --routes --listen runs the
# relay's route discovery (HELLOs over UDP on every cable) and must settle on a table that
# has every subnet this node is not on, learned from the neighbour attached to it: hops 1,
# on the port cabled to that neighbour, via its address there. A far subnet none of our
# neighbours is on (rings of 6 and more) must at least be learned. No WARN may appear (a
# refused or garbled HELLO would say so). No static routes: everything comes off the wire.
# Usage: routes_live_guest.sh PATH_TO_NCCL_MESH_INFO [LISTEN_SECONDS (20)]
set -u
rdma=rxe
[ -z "${MESHFAB_DIR:-}" ] || rdma=fab
info=$1
listen=${2:-20}
fails=0
fail() { echo "FAIL rank $VMESH_RANK: $*"; fails=$((fails + 1)); }

# VMESH_LINK_TABLE lines: L node_a node_b netdev_a netdev_b addr_a addr_b
# Pass 1: our links; for each neighbour, its address on our link and our netdev facing it.
neighbours=0
while read -r link a b dev_a dev_b addr_a addr_b; do
  [ -n "$link" ] || continue
  if [ "$a" = "$VMESH_RANK" ]; then eval "via_$b=$addr_b dev_$b=$dev_a"; neighbours=$((neighbours + 1))
  elif [ "$b" = "$VMESH_RANK" ]; then eval "via_$a=$addr_a dev_$a=$dev_b"; neighbours=$((neighbours + 1)); fi
done <"$VMESH_LINK_TABLE"

unset NCCL_MESH_ROUTES
start=$(date +%s)
out=$("$info" --routes --listen "$listen" 2>&1)
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -eq 0 ] || fail "nccl-mesh-info --routes --listen $listen: exit $rc"
echo "$out" | grep -q "learned by listening [0-9.]* s (settled;" ||
  fail "the table did not settle within $listen s: $(echo "$out" | grep 'learned by listening')"
echo "$out" | grep -q "^Neighbours heard: $neighbours\$" ||
  fail "expected $neighbours neighbours: $(echo "$out" | grep -A4 '^Neighbours heard')"
echo "$out" | grep -q "WARN" && fail "warnings: $(echo "$out" | grep WARN | head -n 3)"

# Pass 2: every link we are not on.
far=0
while read -r link a b dev_a dev_b addr_a addr_b; do
  [ -n "$link" ] || continue
  [ "$a" = "$VMESH_RANK" ] || [ "$b" = "$VMESH_RANK" ] && continue
  far=$((far + 1))
  subnet="${addr_a%.*}\\.0/24"
  want=""
  for end in $a $b; do
    eval "via=\${via_$end:-} dev=\${dev_$end:-}"
    [ -n "$via" ] && want="$want${want:+|}${subnet} learned hops 1 on ${rdma}_$dev:1/$dev via $via \\(node [0-9a-f]+\\)"
  done
  if [ -n "$want" ]; then
    echo "$out" | grep -Eq "^  ($want)\$" ||
      fail "no hops-1 route to ${addr_a%.*}.0/24 through the neighbour on it: $(echo "$out" | grep -F "${addr_a%.*}.0/24")"
  else
    echo "$out" | grep -Eq "^  $subnet learned hops [0-9]+ on " ||
      fail "no learned route to ${addr_a%.*}.0/24: $(echo "$out" | grep -F "${addr_a%.*}.0/24")"
  fi
done <"$VMESH_LINK_TABLE"

[ "$fails" -eq 0 ] || echo "$out" | sed "s/^/[rank $VMESH_RANK output] /"
[ "$fails" -eq 0 ] && echo "PASS rank $VMESH_RANK: $neighbours neighbours, $far far subnets learned in ${took} s"
[ "$fails" -eq 0 ]
