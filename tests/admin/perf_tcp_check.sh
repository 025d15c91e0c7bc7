#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# admin_perf_tcp_*: nccl-mesh-perf --server / --client on this host over TCP (loopback
# stands in for the management network), driving the e2e stand-in plugin (no RDMA needed).
# The lab tier runs the same against the real plugin between two guests.
#
# usage: perf_tcp_check.sh ok|corrupt|no-server PERF FAKE_PLUGIN_DIR PLOT_SCRIPT
set -u
mode=$1 perf=$2 fake=$3 plot=$4
fails=0
fail() { echo "FAIL admin_perf_tcp ($mode): $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/perf-tcp.XXXXXX") || exit 2
server_pid=
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

# The stand-in plugin learns its rank from VMESH_RANK/VMESH_NODES; the tool does not need them.
export LD_LIBRARY_PATH=$fake VMESH_NODES=2
[ "$mode" = corrupt ] && export FAKE_CORRUPT=1
sizes=(--lat-sizes 8,4096 --bw-sizes 4096,65536,1M --lat-iters 5 --timeout 30)

if [ "$mode" = no-server ]; then
    # A port nobody listens on: the client retries refused connections until --timeout.
    start=$SECONDS
    VMESH_RANK=0 "$perf" --client 127.0.0.1:1 --timeout 2 >"$tmp/client.out" 2>&1
    rc=$?
    cat "$tmp/client.out"
    [ "$rc" -eq 1 ] || fail "client exit $rc, expected 1"
    grep -q "FAIL (rank 0): --client: cannot connect to 127.0.0.1:1: Connection refused" "$tmp/client.out" ||
        fail "no 'cannot connect ... Connection refused' message"
    [ $((SECONDS - start)) -le 10 ] || fail "took $((SECONDS - start)) s with --timeout 2"
    [ "$fails" -eq 0 ] && echo "PASS admin_perf_tcp ($mode)"
    exit $((fails > 0))
fi

VMESH_RANK=1 "$perf" --server --port 0 --timeout 30 >"$tmp/server.out" 2>&1 &
server_pid=$!
port=
for _ in $(seq 1 100); do  # the server prints its port once it listens (bounded: 10 s)
    port=$(sed -n 's/.*listening on every interface port \([0-9]*\);.*/\1/p' "$tmp/server.out")
    [ -n "$port" ] && break
    sleep 0.1
done
[ -n "$port" ] || { cat "$tmp/server.out"; echo "FAIL admin_perf_tcp ($mode): the server never listened"; exit 1; }
VMESH_RANK=0 "$perf" --client "127.0.0.1:$port" "${sizes[@]}" --csv "$tmp/r.csv" --json "$tmp/r.json" \
    --progress >"$tmp/client.out" 2>"$tmp/client.err"
client_rc=$?
wait "$server_pid"
server_rc=$?
server_pid=
echo "--- client (exit $client_rc)"; cat "$tmp/client.out" "$tmp/client.err"
echo "--- server (exit $server_rc)"; cat "$tmp/server.out"

if [ "$mode" = ok ]; then
    [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] || fail "exit statuses $client_rc/$server_rc, expected 0/0"
    grep -q "^# Data check: 0 byte(s) wrong, every transfer verified" "$tmp/client.out" || fail "no clean data check line"
    grep -Eq "^ +1048576 +1048576 +uint8 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+ +0$" "$tmp/client.out" ||
        fail "no 1 MiB bandwidth row with #wrong 0"
    grep -q "ranks met through TCP 127.0.0.1:$port" "$tmp/client.out" || fail "the report does not name the server"
    grep -q "data check: 0 byte(s) wrong in what rank 1 received" "$tmp/server.out" || fail "the server's check line"
    # --progress without a terminal: whole lines on stderr, none on stdout.
    # (at most one line every 2 s: this short run shows the first)
    grep -q "^nccl-mesh-perf: latency 1/2: 8 B$" "$tmp/client.err" || fail "no progress line on stderr"
    grep -q "^nccl-mesh-perf: latency" "$tmp/client.out" && fail "progress lines on stdout"
    [ "$(grep -c '^bandwidth,' "$tmp/r.csv")" = 3 ] && [ "$(grep -c '^latency,' "$tmp/r.csv")" = 2 ] ||
        fail "the CSV does not have 3 bandwidth and 2 latency rows"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["wrong"]==0 and len(d["bandwidth"])==3, d' \
        "$tmp/r.json" || fail "the JSON does not parse or is incomplete"
    "$plot" "$tmp/r.csv" --print >"$tmp/plot.out" || fail "plot-perf.py --print failed"
    grep -q "^r.csv bandwidth 1048576 " "$tmp/plot.out" || fail "plot-perf.py did not read the 1 MiB row"
    "$plot" "$tmp/r.csv" -o "$tmp/r.png" >"$tmp/plot.out" 2>&1
    case $? in
        0) [ "$(head -c 8 "$tmp/r.png" | od -An -tx1 | tr -d ' ')" = 89504e470d0a1a0a ] ||
               fail "plot-perf.py wrote no PNG" ;;
        3) grep -q "matplotlib is not installed" "$tmp/plot.out" || fail "plot-perf.py exit 3 without the reason" ;;
        *) cat "$tmp/plot.out"; fail "plot-perf.py failed" ;;
    esac
else  # corrupt: the stand-in flips byte 777 of every message above 1000 bytes
    [ "$client_rc" -eq 4 ] && [ "$server_rc" -eq 4 ] || fail "exit statuses $client_rc/$server_rc, expected 4/4"
    grep -Eq "^# Data check: [1-9][0-9]* byte\(s\) wrong$" "$tmp/client.out" || fail "no data check line with errors"
    grep -Eq "^ +65536 +65536 +uint8 .* [1-9][0-9]*$" "$tmp/client.out" || fail "the 64 KiB row shows no wrong bytes"
fi
[ "$fails" -eq 0 ] && echo "PASS admin_perf_tcp ($mode)"
[ "$fails" -eq 0 ]
