#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Full lab scenarios with the plugin and the driver built under ASan+UBSan, LeakSanitizer
# on: every allocation the plugin makes while connecting, moving data, failing and
# unloading must be freed (or still reachable) when the process exits.
#
#   sanitized_lab.sh REPO LAB_BUILD_DIR ASAN_BUILD_DIR SCENARIO...
#
# Builds nccl-net-mesh and mesh_e2e in ASAN_BUILD_DIR (the tree scripts/test.sh's sanitize
# tier uses: Debug, -fsanitize=address,undefined; incremental when it exists), then runs
# each SCENARIO ("name:nodes[:vmesh options]") in the lab whose guest kernel is cached in
# LAB_BUILD_DIR. A scenario fails on a non-zero exit of any rank, or on any sanitizer
# report in the output. Nothing is suppressed.
set -euo pipefail

[ $# -ge 4 ] || { echo "usage: $0 REPO LAB_BUILD_DIR ASAN_BUILD_DIR SCENARIO..." >&2; exit 64; }
repo=$1 lab_build=$2 asan=$3
shift 3

log=$(mktemp -d /tmp/mesh-sanitized-lab.XXXXXX)
trap 'rm -rf "$log"' EXIT

echo "-- building nccl-net-mesh and mesh_e2e with -fsanitize=address,undefined in $asan"
if ! { cmake -S "$repo" -B "$asan" -DCMAKE_BUILD_TYPE=Debug -DMESH_SANITIZE=address,undefined \
         -DMESH_BUILD_TESTS=ON -DMESH_WERROR=ON &&
       cmake --build "$asan" -j "$(nproc)" --target nccl-net-mesh mesh_e2e; } >"$log/build.log" 2>&1; then
  tail -n 40 "$log/build.log"
  echo "FAIL sanitized-lab: the sanitizer build failed"
  exit 1
fi
plugin_dir=$(dirname "$(find "$asan" -maxdepth 1 -name 'libnccl-net-mesh.so' | head -n 1)")
driver=$asan/tests/e2e/mesh_e2e
[ -x "$driver" ] && [ -f "$plugin_dir/libnccl-net-mesh.so" ] || {
  echo "FAIL sanitized-lab: $driver or the plugin is missing after the build"; exit 1; }

# abort_on_error makes a report fatal at once; LSan runs at exit (every rank exits through
# main or _exit after a FAIL, which also fails the test). A small quarantine keeps the
# guests (1 GiB) out of memory trouble.
asan_opts=detect_leaks=1:abort_on_error=1:quarantine_size_mb=32:malloc_context_size=20
ubsan_opts=halt_on_error=1:print_stacktrace=1

status=0
for spec in "$@"; do
  IFS=: read -r name nodes vmesh_opts <<<"$spec"
  out=$log/$name.log
  echo "-- $name on $nodes nodes under ASan+LSan+UBSan ${vmesh_opts:+(vmesh $vmesh_opts)}"
  set +e
  # shellcheck disable=SC2086  # vmesh_opts is a word list
  "$repo/scripts/vmesh" run --build "$lab_build" --nodes "$nodes" --mem 1024 --timeout 500 \
    ${vmesh_opts} -- env LD_LIBRARY_PATH="$plugin_dir" ASAN_OPTIONS="$asan_opts" \
    UBSAN_OPTIONS="$ubsan_opts" "$driver" $name --deadline 300 >"$out" 2>&1
  rc=$?
  set -e
  grep -E "^\[[0-9]+\] (PASS|FAIL) " "$out" || true
  if grep -qE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: (Address|Leak|UndefinedBehavior)Sanitizer" "$out"; then
    echo "FAIL sanitized-lab $name: sanitizer report:"
    grep -E -A40 "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$out" | head -n 120
    status=1
  elif [ "$rc" -ne 0 ]; then
    echo "FAIL sanitized-lab $name: vmesh exited $rc"
    tail -n 60 "$out"
    status=1
  else
    echo "ok: $name: every rank passed, no sanitizer report"
  fi
done
exit $status
