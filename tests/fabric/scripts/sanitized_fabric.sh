#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tests/e2e's scenarios with the plugin, mesh_e2e AND the fabric library built under a
# sanitizer, on scripts/fabric-net namespaces.
#
#   sanitized_fabric.sh REPO BUILD_DIR address,undefined|thread SCENARIO...
#
# Builds meshfab, nccl-net-mesh and mesh_e2e in BUILD_DIR (Debug, -fsanitize=...;
# incremental: the sanitize tier of scripts/test.sh uses the same trees, build-asan/ and
# build-tsan/), then runs each SCENARIO ("name:nodes[:fabric-net options][:scenario args]",
# scenario args space-separated). A scenario fails on a non-zero exit of any rank or on
# any sanitizer report in its output.
# ASan+UBSan: LeakSanitizer on, nothing suppressed (the plugin dlcloses the fabric at
# unload: whatever it still held would be a leak). TSan: tests/fabric/tsan.supp, which
# names only the fabric's emulated DMA (see there why that is not a data race).
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 REPO BUILD_DIR SANITIZERS SCENARIO..." >&2; exit 64; }
repo=$1 tree=$2 san=$3
shift 3
log=$(mktemp -d /tmp/meshfab-sanitized.XXXXXX)
trap 'rm -rf "$log"' EXIT

echo "-- building meshfab, nccl-net-mesh and mesh_e2e with -fsanitize=$san in $tree"
start=$SECONDS
if ! { cmake -S "$repo" -B "$tree" -DCMAKE_BUILD_TYPE=Debug -DMESH_SANITIZE="$san" \
         -DMESH_BUILD_TESTS=ON -DMESH_WERROR=ON &&
       cmake --build "$tree" -j "$(nproc)" --target meshfab nccl-net-mesh mesh_e2e; } >"$log/build.log" 2>&1; then
  tail -n 40 "$log/build.log"
  echo "FAIL sanitized-fabric: the $san build failed"
  exit 1
fi
echo "   built in $((SECONDS - start)) s"
lib=$tree/tests/fabric/dropin/libibverbs.so.1
driver=$tree/tests/e2e/mesh_e2e
plugin_dir=$(dirname "$(find "$tree" -maxdepth 1 -name 'libnccl-net-mesh.so' | head -n 1)")
[ -f "$lib" ] && [ -x "$driver" ] && [ -f "$plugin_dir/libnccl-net-mesh.so" ] ||
  { echo "FAIL sanitized-fabric: a built file is missing in $tree"; exit 1; }

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:malloc_context_size=20
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=7:suppressions=$repo/tests/fabric/tsan.supp"
status=0
for spec in "$@"; do
  IFS=: read -r name nodes net_opts scenario_opts <<<"$spec"
  out=$log/$name.log
  echo "-- $name on $nodes nodes under -fsanitize=$san ${net_opts:+(fabric-net $net_opts)} $scenario_opts"
  t0=$SECONDS
  set +e
  # shellcheck disable=SC2086  # option lists are word lists
  # The fabric is named by its full path, a setting longer than 15 characters: LeakSanitizer
  # then also checks that unloading frees heap-allocated strings in the plugin's static
  # storage (releaseStatic in include/mesh/platform/static_state.h; 63 bytes per string leaked before).
  "$repo/scripts/fabric-net" run --nodes "$nodes" --timeout 280 $net_opts -- \
    env LD_LIBRARY_PATH="$plugin_dir" NCCL_MESH_IBVERBS_LIB="$lib" \
    "$driver" $name $scenario_opts --deadline 240 >"$out" 2>&1
  rc=$?
  set -e
  grep -E "^\[[0-9]+\] (PASS|FAIL) " "$out" | cut -c1-200 || true
  if grep -qE "ERROR: (AddressSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|runtime error:|SUMMARY: (Address|Leak|UndefinedBehavior|Thread)Sanitizer" "$out"; then
    echo "FAIL sanitized-fabric $name: sanitizer report:"
    grep -E -A60 "ERROR: (AddressSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|runtime error:" "$out" | head -n 150
    status=1
  elif [ "$rc" -ne 0 ]; then
    echo "FAIL sanitized-fabric $name: fabric-net exited $rc"
    tail -n 60 "$out"
    status=1
  else
    echo "ok: $name: every rank passed, no sanitizer report ($((SECONDS - t0)) s)"
  fi
done
exit $status
