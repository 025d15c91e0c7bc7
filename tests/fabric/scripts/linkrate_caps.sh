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
# (MESHFAB_PACE_BURST_US) over a 2 s sample. Rank 0 prints LINKRATE_CAPS lines with the figures.
# Two streams at once: each ib_write_bw samples its own 2 s (after a 1 s margin of a 4 s run),
# and the two samples need not start together (the clients start apart). Their sum is held to
# the ceiling over the union of the two samples, at most 2 s plus their offset, which the
# times perftest printed its heading and its figures bound. (Two figures summed against one
# window, as this script once did, failed a cap that held when one client started 70 ms first.)
# shellcheck disable=SC3043,SC2086
# shellcheck source-path=SCRIPTDIR source=../../lab/lib.sh
. "$(dirname "$0")/../../lab/lib.sh"

[ -n "${LINKRATE_WIRE:-}" ] && [ -n "${LINKRATE_FN:-}" ] || lab_fail "LINKRATE_WIRE and LINKRATE_FN must be set"

# Goodput ceiling in perftest's MB/s (MiB/s) of a rate in bytes/s: 4096-byte packets carry 82
# bytes of RoCE v2 and Ethernet overhead each.
ceiling() {
    awk -v r="$1" 'BEGIN { printf "%.2f", r * 4096 / 4178 / 1048576 }'
}

at_most() {  # $1 <= $2 * 1.03
    awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > 0 && a <= b * 1.03) }'
}

# Each run streams RUN_S seconds and samples SAMPLE_S of them after MARGIN_S (perftest's -D, -f).
MARGIN_S=1
SAMPLE_S=${LINKRATE_SECONDS:-2}
RUN_S=$((SAMPLE_S + 2 * MARGIN_S))

# Prefixes every line of stdin with the wall-clock time it arrived (every rank's namespace
# shares the host's clock).
stamp_lines() {
    python3 -c 'import sys, time
for line in iter(sys.stdin.readline, ""):
    sys.stdout.write("%.6f %s" % (time.time(), line))
    sys.stdout.flush()'
}

# Runs ib_write_bw "$@" as lab client $1 once its server is ready, its output line-buffered and
# stamped; prints "MBps first last": perftest prints its "#bytes" heading just before the
# traffic starts (first) and the figures RUN_S later, once it has stopped (last).
stream() {
    local name="$1" out
    shift
    out="$LAB_TMP/$name.out"
    { lab_client "$name" stdbuf -oL ib_write_bw "$@" 2>&1; echo "ib_write_bw exit $?"; } | stamp_lines >"$out"
    grep -q "ib_write_bw exit 0$" "$out" || { cat "$out" >&2; lab_fail "ib_write_bw ($name) failed"; }
    awk 'found { print $5, first, $1; ok = 1; exit } / #bytes/ { found = 1; first = $1 }
         END { exit !ok }' "$out" || { cat "$out" >&2; lab_fail "no figure from ib_write_bw ($name)"; }
}

# The ceiling two samples together may reach: $1 MB/s over the union of two SAMPLE_S windows.
# A run's traffic starts after its "first" stamp and stops RUN_S later, before its "last", so
# its sample starts in [first + MARGIN_S, last - RUN_S + MARGIN_S]; $2 and $3 are
# "MBps first last". Prints the ceiling and the largest offset of the two samples.
union_ceiling() {
    echo "$2 $3" | awk -v c="$1" -v s="$SAMPLE_S" -v run="$RUN_S" '{
        d = $3 - run - $5; e = $6 - run - $2
        if (e > d) d = e
        if (d < 0) d = 0
        if (d > s) d = s
        printf "%.2f %.3f", c * (s + d) / s, d }'
}

# Checks that two streams ("MBps first last" each, named $1 and $2) moved at most ceiling $3
# together; prints the LINKRATE_CAPS line, prefixed by $4.
at_most_together() {
    local a b sum both bound offset
    a=${1%% *}
    b=${2%% *}
    both=$(union_ceiling "$3" "$1" "$2")
    bound=${both% *}
    offset=${both#* }
    sum=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a + b }')
    echo "LINKRATE_CAPS $4 sum=${sum} MB/s ceiling=$3, over the two samples (offset <= ${offset} s) ${bound}"
    awk -v o="$offset" -v s="$SAMPLE_S" 'BEGIN { exit !(o < s / 2) }' ||
        lab_note "the two samples may be ${offset} s apart: the sum's bound is loose"
    at_most "$sum" "$bound"
}

peer_addr() {  # the peer's address on netdev $1
    lab_my_links | awk -v nd="$1" '$3 == nd { print $5 }'
}

common="-x 1 -F -s 1048576 -D $RUN_S -f $MARGIN_S"
single="-x 1 -F -s 1048576 -D $SAMPLE_S"  # one stream: its whole run is the sample

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
        wire=$(ceiling "$LINKRATE_WIRE")
        echo "LINKRATE_CAPS incast node1=${a%% *} node2=${b%% *} MB/s into node 0's cable"
        at_most_together "$a" "$b" "$wire" "incast" ||
            lab_fail "two senders moved more than node 0's cable carries (above)"
        echo "LINKRATE_CAPS ok"
        return
    fi
    stream "in$VMESH_RANK" -d fab_sw -p $((21200 + VMESH_RANK)) $common 198.18.0.1 \
        >"$VMESH_SHARED/incast.tmp.$VMESH_RANK"
    mv "$VMESH_SHARED/incast.tmp.$VMESH_RANK" "$VMESH_SHARED/incast.$VMESH_RANK"
}
if [ "$VMESH_TOPOLOGY" = switch ]; then
    incast
    exit 0
fi

[ "$VMESH_NODES" -eq 2 ] || lab_fail "needs 2 nodes"
if [ "$VMESH_RANK" -eq 1 ]; then
    lab_serve alone 21100 ib_write_bw -d fab_p0 -p 21100 $single
    lab_serve both0 21101 ib_write_bw -d fab_p0 -p 21101 $common
    lab_serve both1 21102 ib_write_bw -d fab_p0f1 -p 21102 $common
    lab_publish_servers
    lab_reap_servers
    exit 0
fi

fn=$(ceiling "$LINKRATE_FN")
wire=$(ceiling "$LINKRATE_WIRE")
alone=$(stream alone -d fab_p1 -p 21100 $single "$(peer_addr p1)") || exit 1
alone=${alone%% *}
echo "LINKRATE_CAPS alone fab_p1=${alone} MB/s function_ceiling=${fn}"
at_most "$alone" "$fn" || lab_fail "one function moved $alone MB/s, above its ceiling $fn MB/s"

stream both0 -d fab_p1 -p 21101 $common "$(peer_addr p1)" >"$LAB_TMP/both0.figure" &
first=$!
both1=$(stream both1 -d fab_p1f1 -p 21102 $common "$(peer_addr p1f1)") || exit 1
wait "$first" || lab_fail "the first function's stream failed"
both0=$(cat "$LAB_TMP/both0.figure")
a=${both0%% *}
b=${both1%% *}
echo "LINKRATE_CAPS both fab_p1=${a} fab_p1f1=${b} MB/s function_ceiling=${fn}"
at_most "$a" "$fn" || lab_fail "function fab_p1 moved $a MB/s, above its ceiling $fn MB/s"
at_most "$b" "$fn" || lab_fail "function fab_p1f1 moved $b MB/s, above its ceiling $fn MB/s"
at_most_together "$both0" "$both1" "$wire" "both" ||
    lab_fail "both functions together moved more than the wire carries (above)"
echo "LINKRATE_CAPS ok"
