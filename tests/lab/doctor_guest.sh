#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# nccl-mesh-info --doctor inside every vmesh guest: `doctor_guest.sh INFO [switch]`.
#
# Pings every address of this node's links first (the kernel's ARP table is what tells the
# doctor a switch from a cable), then runs the doctor for a job of $VMESH_NODES nodes with the
# environment the test gives it. Passes when it exits 0 with no FAIL line; with `switch` its
# relay check must also be OK and name the switch with every other node in the ARP table.
# python3 is left off the doctor's PATH: in a TCG guest its start-up takes 15-30 s, and the
# PyTorch check it serves depends on the machine, not on the mesh (tests/admin's fabric
# doctor tests check it).
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

[ $# -ge 1 ] || lab_fail "usage: doctor_guest.sh INFO [switch]"
info=$1
expect=${2:-}

while read -r l peer netdev addr peer_addr; do
    lab_poll 30 lab_ping "$peer_addr" >/dev/null ||
        lab_fail "node $peer does not answer ping at $peer_addr on $netdev (link $l, from $addr)"
done <<EOF
$(lab_my_links)
EOF

out=$(env PATH=/usr/sbin:/sbin "$info" --doctor --nodes "$VMESH_NODES" 2>&1)
rc=$?
echo "$out" | sed 's/^/doctor: /'
[ "$rc" -eq 0 ] || lab_fail "the doctor exited $rc"
! echo "$out" | grep -q '^FAIL' || lab_fail "the doctor FAILed a check: $(echo "$out" | grep '^FAIL' | head -n 1)"
case "$expect" in
    "") ;;
    switch)
        want="on a switch: 198.18.0.0/24 on sw ($((VMESH_NODES - 1)) neighbours in the ARP table)"
        echo "$out" | grep '^OK  *relay ' | grep -qF "$want" ||
            lab_fail "the relay check is not OK with \"$want\"" ;;
    *) lab_fail "unknown expectation $expect" ;;
esac
lab_note "doctor: exit 0, no FAIL${expect:+, $expect as expected}"
