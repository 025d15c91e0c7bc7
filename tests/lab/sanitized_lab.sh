#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Full lab scenarios with the plugin and the driver built under ASan+UBSan, LeakSanitizer
# on: every allocation the plugin makes while connecting, moving data, failing and
# unloading must be freed (or still reachable) when the process exits.
#
#   sanitized_lab.sh REPO LAB_BUILD_DIR ASAN_BUILD_DIR NODES STEP...
#
# Builds nccl-net-mesh and mesh_e2e in ASAN_BUILD_DIR (the tree scripts/test.sh's sanitize
# tier uses: Debug, -fsanitize=address,undefined; incremental when it exists), then runs every
# STEP ("NAME|DEADLINE|ENV|ARGS", as tests/e2e/scripts/lab_steps.sh takes them: a mesh_e2e
# scenario with its arguments and its own environment) in turn in one boot of NODES guests,
# whose kernel is cached in LAB_BUILD_DIR (one boot, not one per scenario: ~9 s of TCG each).
# A step fails when a rank did not run it to exit 0 (tests/e2e/scripts/lab_step_check.sh) or
# when a sanitizer reported anything while it ran. Nothing is suppressed.
set -euo pipefail

[ $# -ge 5 ] || { echo "usage: $0 REPO LAB_BUILD_DIR ASAN_BUILD_DIR NODES STEP..." >&2; exit 64; }
repo=$1 lab_build=$2 asan=$3 nodes=$4
shift 4

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

# Every step's deadline, and two minutes for the boot and the shutdown.
total=120
for step in "$@"; do
  IFS='|' read -r _ deadline _ <<<"$step"
  total=$((total + deadline))
done
out=$log/steps.log
echo "-- $# scenarios in one boot of $nodes guests under ASan+LSan+UBSan"
set +e
"$repo/scripts/vmesh" run --build "$lab_build" --nodes "$nodes" --mem 1024 --timeout "$total" -- \
  env ASAN_OPTIONS="$asan_opts" UBSAN_OPTIONS="$ubsan_opts" \
  bash "$repo/tests/e2e/scripts/lab_steps.sh" "$plugin_dir" "$driver" "$@" >"$out" 2>&1
rc=$?
set -e

# A sanitizer's report: where one begins, and any line that says there was one.
report_start='ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:'
report_any="$report_start|SUMMARY: (Address|Leak|UndefinedBehavior)Sanitizer"
show_reports() { grep -E -A40 "$report_start" "$out" | head -n 120; }

# The step each sanitizer report came in: "NAME" per report, from the rank's last step begun.
reports=$(awk -v report="$report_any" '
  match($0, /^\[[0-9]+\] /) {
    rank = substr($0, 2, RLENGTH - 3); text = substr($0, RLENGTH + 1)
    if (text ~ /^lab-step [^ ]+ begin$/) { split(text, w, " "); step[rank] = w[2] }
    if (text ~ report) print (rank in step ? step[rank] : "(before any step)")
  }' "$out" | sort -u)
status=0
for step in "$@"; do
  IFS='|' read -r name _ <<<"$step"
  checked=0
  check=$(bash "$repo/tests/e2e/scripts/lab_step_check.sh" "$out" "$name" "$nodes") || checked=$?
  grep -E "^\[[0-9]+\] (PASS|FAIL) " <<<"$check" || true
  if grep -qx "$name" <<<"$reports"; then
    echo "FAIL sanitized-lab $name: sanitizer report:"
    show_reports
    status=1
  elif [ "$checked" -ne 0 ]; then
    echo "FAIL sanitized-lab $name: $(tail -n 1 <<<"$check")"
    status=1
  else
    echo "ok: $name: every rank passed, no sanitizer report"
  fi
done
if [ "$rc" -ne 0 ]; then
  echo "FAIL sanitized-lab: vmesh exited $rc"
  tail -n 60 "$out"
  status=1
fi
if grep -qx "(before any step)" <<<"$reports"; then
  echo "FAIL sanitized-lab: a sanitizer report outside every step:"
  show_reports
  status=1
fi
exit $status
