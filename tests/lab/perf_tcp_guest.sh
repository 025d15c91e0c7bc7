#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# lab_perf_tcp: nccl-mesh-perf between two guests as between two hosts: rank 1 runs
# `--server` on its management address, rank 0 `--client 198.19.0.2`; the ranks meet over
# the management network only (no shared directory), the data runs over the cable through
# the plugin, and every size is verified on the receiver.
# Usage: perf_tcp_guest.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
build=$1
perf=$build/nccl-mesh-perf
export LD_LIBRARY_PATH=$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fails=0
fail() { echo "FAIL perf-tcp rank $VMESH_RANK: $*"; fails=$((fails + 1)); }

if [ "$VMESH_RANK" = 1 ]; then
    lab_serve perf 18600 "$perf" --server --bind 198.19.0.2 --port 18600 --timeout 100
    lab_publish_servers
    lab_reap_servers
    grep -q "data check: 0 byte(s) wrong in what rank 1 received" /tmp/perf.server.log ||
        fail "the server's data check line is missing or not clean"
else
    lab_client perf "$perf" --client 198.19.0.2 --lat-sizes 8,4096 --lat-iters 10 \
        --bw-sizes 65536,1M --bw-bytes 4M --bw-iters 16 --timeout 100 \
        --csv /tmp/perf.csv --json /tmp/perf.json >/tmp/perf.out 2>&1
    rc=$?
    cat /tmp/perf.out
    [ "$rc" -eq 0 ] || fail "the client exited $rc"
    grep -q "ranks met through TCP 198.19.0.2:18600" /tmp/perf.out || fail "the report does not name the server"
    grep -q "^# Data check: 0 byte(s) wrong, every transfer verified" /tmp/perf.out || fail "no clean data check"
    for size in 65536 1048576; do
        grep -Eq "^ +$size +$size +uint8 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+ +0$" /tmp/perf.out ||
            fail "no verified bandwidth row for $size bytes"
    done
    [ "$(grep -c '^bandwidth,' /tmp/perf.csv)" = 2 ] || fail "the CSV does not hold 2 bandwidth rows"
    grep -q '"wrong": 0' /tmp/perf.json || fail "the JSON does not report 0 wrong bytes"
fi
[ "$fails" -eq 0 ] && echo "PASS perf-tcp rank $VMESH_RANK"
[ "$fails" -eq 0 ]
