#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The fabric's link rates hold (tests/fabric/lib/pace.h), checked with perftest on a Spark
# cable: scripts/fabric-net run --nodes 2 --functions 2 --rate WIRE --fn-rate FN, and this
# script on both ranks with LINKRATE_WIRE and LINKRATE_FN (bytes/s) in the environment.
#   1. one function streams alone: ib_write_bw must stay within the function's goodput
#      ceiling (a transfer takes at least its wire bytes / rate);
#   2. both functions stream at once: each within its own ceiling, and together within
#      the wire's, which is below the sum of the two functions' caps (they share the wire).
# On a switch instead (scripts/fabric-net run --topology switch --nodes 3 --rate WIRE, with
# LINKRATE_FN=0): nodes 1 and 2 stream to node 0 at once, and together must stay within
# node 0's cable (the switch's port towards it: pace.h's inbound caps), not twice it.
# Every check is an upper bound: a slow machine cannot make it pass by accident, only a cap
# that does not hold makes it fail. A margin of 3 % covers the buckets' burst allowance
# (MESHFAB_PACE_BURST_US) over a 2 s run. Rank 0 prints LINKRATE_CAPS lines with the figures.
# shellcheck disable=SC3043,SC2086
# shellcheck source-path=SCRIPTDIR source=../../lab/lib.sh
. "$(dirname "$0")/../../lab/lib.sh"

[ -n "${LINKRATE_WIRE:-}" ] && [ -n "${LINKRATE_FN:-}" ] || lab_fail "LINKRATE_WIRE and LINKRATE_FN must be set"
SECONDS_PER_RUN=${LINKRATE_SECONDS:-2}

# Goodput ceiling in perftest's MB/s (MiB/s) of a rate in bytes/s: 4096-byte packets carry 82
# bytes of RoCE v2 and Ethernet overhead each.
ceiling() {
    awk -v r="$1" 'BEGIN { printf "%.2f", r * 4096 / 4178 / 1048576 }'
}

# MB/s (MiB/s) ib_write_bw reported in file $1 (the average column of the figures line).
measured() {
    awk 'found { print $4; exit } /^ *#bytes/ { found = 1 }' "$1"
}

at_most() {  # $1 <= $2 * 1.03
    awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > 0 && a <= b * 1.03) }'
}

peer_addr() {  # the peer's address on netdev $1
    lab_my_links | awk -v nd="$1" '$3 == nd { print $5 }'
}

common="-x 1 -F -s 1048576 -D $SECONDS_PER_RUN"

# Two senders into one port of a switch.
incast() {
    [ "$VMESH_NODES" -eq 3 ] || lab_fail "the switch check needs 3 nodes"
    if [ "$VMESH_RANK" -eq 0 ]; then
        lab_serve in1 21201 ib_write_bw -d fab_sw -p 21201 $common
        lab_serve in2 21202 ib_write_bw -d fab_sw -p 21202 $common
        lab_publish_servers
        lab_reap_servers
        lab_poll 60 test -s "$VMESH_SHARED/incast.1" || lab_fail "node 1 reported no figure"
        lab_poll 60 test -s "$VMESH_SHARED/incast.2" || lab_fail "node 2 reported no figure"
        a=$(cat "$VMESH_SHARED/incast.1")
        b=$(cat "$VMESH_SHARED/incast.2")
        sum=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a + b }')
        wire=$(ceiling "$LINKRATE_WIRE")
        echo "LINKRATE_CAPS incast node1=${a} node2=${b} sum=${sum} MB/s into node 0's cable, ceiling=${wire}"
        at_most "$sum" "$wire" || lab_fail "two senders moved $sum MB/s into node 0, above its cable's ceiling $wire MB/s"
        echo "LINKRATE_CAPS ok"
        return
    fi
    lab_client "in$VMESH_RANK" ib_write_bw -d fab_sw -p $((21200 + VMESH_RANK)) $common 198.18.0.1 \
        >"$LAB_TMP/in.out" 2>&1 || { cat "$LAB_TMP/in.out"; lab_fail "ib_write_bw to node 0 failed"; }
    figure=$(measured "$LAB_TMP/in.out")
    [ -n "$figure" ] || { cat "$LAB_TMP/in.out"; lab_fail "no figure from ib_write_bw"; }
    echo "$figure" >"$VMESH_SHARED/incast.tmp.$VMESH_RANK"
    mv "$VMESH_SHARED/incast.tmp.$VMESH_RANK" "$VMESH_SHARED/incast.$VMESH_RANK"
}
if [ "$VMESH_TOPOLOGY" = switch ]; then
    incast
    exit 0
fi

[ "$VMESH_NODES" -eq 2 ] || lab_fail "needs 2 nodes"
if [ "$VMESH_RANK" -eq 1 ]; then
    lab_serve alone 21100 ib_write_bw -d fab_p0 -p 21100 $common
    lab_serve both0 21101 ib_write_bw -d fab_p0 -p 21101 $common
    lab_serve both1 21102 ib_write_bw -d fab_p0f1 -p 21102 $common
    lab_publish_servers
    lab_reap_servers
    exit 0
fi

fn=$(ceiling "$LINKRATE_FN")
wire=$(ceiling "$LINKRATE_WIRE")
lab_client alone ib_write_bw -d fab_p1 -p 21100 $common "$(peer_addr p1)" >"$LAB_TMP/alone.out" 2>&1 ||
    { cat "$LAB_TMP/alone.out"; lab_fail "ib_write_bw on one function failed"; }
alone=$(measured "$LAB_TMP/alone.out")
echo "LINKRATE_CAPS alone fab_p1=${alone} MB/s function_ceiling=${fn}"
at_most "$alone" "$fn" || lab_fail "one function moved $alone MB/s, above its ceiling $fn MB/s"

lab_client both0 ib_write_bw -d fab_p1 -p 21101 $common "$(peer_addr p1)" >"$LAB_TMP/both0.out" 2>&1 &
first=$!
lab_client both1 ib_write_bw -d fab_p1f1 -p 21102 $common "$(peer_addr p1f1)" >"$LAB_TMP/both1.out" 2>&1 ||
    { cat "$LAB_TMP/both1.out"; lab_fail "ib_write_bw on the second function failed"; }
wait "$first" || { cat "$LAB_TMP/both0.out"; lab_fail "ib_write_bw on the first function failed"; }
a=$(measured "$LAB_TMP/both0.out")
b=$(measured "$LAB_TMP/both1.out")
sum=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a + b }')
echo "LINKRATE_CAPS both fab_p1=${a} fab_p1f1=${b} sum=${sum} MB/s wire_ceiling=${wire} function_ceiling=${fn}"
at_most "$a" "$fn" || lab_fail "function fab_p1 moved $a MB/s, above its ceiling $fn MB/s"
at_most "$b" "$fn" || lab_fail "function fab_p1f1 moved $b MB/s, above its ceiling $fn MB/s"
at_most "$sum" "$wire" || lab_fail "both functions moved $sum MB/s together, above the wire's ceiling $wire MB/s"
echo "LINKRATE_CAPS ok"
