#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Raw-verbs baselines across one lab link (run by vmesh on 2+ guests): perftest's
# ib_write_bw at 64 KiB and 1 MiB and ib_write_lat at 8 bytes, rank 1 serving,
# rank 0 measuring. Rank 0 prints one line per figure:
#   BASELINE ib_write_bw size=65536 MBps=... peak_MBps=...
#   BASELINE ib_write_lat size=8 typical_us=... min_us=... avg_us=...
# Plugin benchmarks are meant to be read as ratios against these, measured on the
# same link in the same kind of run (the lab's absolute numbers mean little).
# shellcheck disable=SC3043,SC2086  # `local` (see lib.sh); option lists are word lists
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

[ "$VMESH_NODES" -ge 2 ] || lab_fail "needs at least 2 guests"
[ "$VMESH_RANK" -le 1 ] || exit 0

# The first link between ranks 0 and 1.
read -r _ _ netdev addr peer_addr <<EOF
$(lab_my_links | awk -v p=$((1 - VMESH_RANK)) '$2 == p' | head -n 1)
EOF
[ -n "$netdev" ] || lab_fail "no link between ranks 0 and 1"
dev=${LAB_RDMA}_$netdev
gid=$(lab_gid_index "$dev" "$addr")
[ -n "$gid" ] || lab_fail "$dev has no RoCE v2 GID for $addr"

# Small iteration counts: a lab link moves about 25 MB/s.
# name:TCP port:tool:options
TESTS="bw64k:21001:ib_write_bw:-s 65536 -n 200
bw1m:21002:ib_write_bw:-s 1048576 -n 40
lat8:21003:ib_write_lat:-s 8 -n 100"

# The figures line follows the header line that starts with "#bytes".
figures() {
    awk 'found { print; exit } /^ *#bytes/ { found = 1 }' "$1"
}

positive() {
    awk -v v="$1" 'BEGIN { exit !(v > 0) }'
}

# Prints the BASELINE line from a perftest client's output file; fails if the
# figure is missing or not positive.
report() {
    local tool="$1" out="$2"
    # shellcheck disable=SC2046  # the figures line is a list of numbers
    set -- $(figures "$out")
    case "$tool" in
        ib_write_bw)
            if [ $# -lt 4 ] || ! positive "$4"; then
                cat "$out"
                lab_fail "$tool printed no bandwidth"
            fi
            echo "BASELINE ib_write_bw size=$1 MBps=$4 peak_MBps=$3 iters=$2 link=$dev" ;;
        ib_write_lat)
            if [ $# -lt 6 ] || ! positive "$5"; then
                cat "$out"
                lab_fail "$tool printed no latency"
            fi
            echo "BASELINE ib_write_lat size=$1 typical_us=$5 min_us=$3 avg_us=$6 iters=$2 link=$dev" ;;
    esac
}

echo "$TESTS" | while IFS=: read -r name port tool opts; do
    common="-d $dev -x $gid -F -p $port $opts"
    if [ "$VMESH_RANK" -eq 1 ]; then
        lab_serve "$name" "$port" $tool $common
        lab_publish_servers
        lab_reap_servers
    else
        lab_client "$name" $tool $common "$peer_addr" >"$LAB_TMP/$name.out" 2>&1 ||
            { cat "$LAB_TMP/$name.out"; lab_fail "$tool $opts failed"; }
        report "$tool" "$LAB_TMP/$name.out"
    fi
done || exit 1
