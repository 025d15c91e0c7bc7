#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test.sh: the project's test command (README, .ci/run). Runs scripts/setup.sh, then the
# ctest tiers in order, each under a header, and stops at the first tier that fails:
#   unit  module logic without RDMA        abi  the built plugin loaded as NCCL loads it
#   fabric  end to end on the userspace RDMA fabric (tests/fabric) in network namespaces:
#         the lab's scenarios and checks, rdma-core tools, 8 ranks, ASan/TSan, benchmarks
#   sanitize  the unit tier under ASan+UBSan (build-asan/), and the threaded tests
#         (reactor, handshake, registration cache) under TSan (build-tsan/)
#   fuzz  bounded libFuzzer runs (clang)
#   arm64  the unit and abi tests and the fabric's e2e scenarios cross-built for aarch64
#         (build-arm64/, cmake/toolchain-aarch64-linux-gnu.cmake), run under qemu-aarch64
#   lab  end to end on the QEMU Soft-RoCE mesh; then, when build-arm64/ exists, the same
#         kind of scenarios in aarch64 guests (label lab-arm64, scripts/vmesh --arch arm64)
# A tier with no registered tests fails (unit, abi, fabric, lab), except fuzz on a machine
# without clang++, where it is skipped with the reason. Each tier's ctest output is also
# kept in build/test-logs/<tier>.log; the last lines recap every tier's ctest summary.
#
#   scripts/test.sh [--tier unit|abi|fabric|sanitize|fuzz|arm64|lab]... [--no-setup]
set -euo pipefail

ALL_TIERS=(unit abi fabric sanitize fuzz arm64 lab)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR="$REPO/build"
LOG_DIR="$BUILD_DIR/test-logs"
tiers=()
run_setup=1
summary=()
timings=()

usage() {
  cat <<'EOF'
usage: scripts/test.sh [--tier unit|abi|fabric|sanitize|fuzz|arm64|lab]... [--no-setup]

Runs scripts/setup.sh (packages, build into build/), then the tiers unit, abi, fabric,
sanitize, fuzz, arm64 and lab in that order, stopping at the first failing tier.
  --tier T     run only tier T (repeatable; tiers still run in the order above)
  --no-setup   use build/ as it is (no package check, no rebuild)
EOF
}

header() {
  echo
  echo "======================================================================"
  echo "== $*"
  echo "======================================================================"
}

recap() {
  [ ${#summary[@]} -eq 0 ] && return
  header "summary"
  printf '%s\n' "${summary[@]}"
  # Wall time per tier (a tier's own builds included; setup's build is in "setup"): CI has
  # 90 minutes and the suite is meant to stay under 30.
  [ ${#timings[@]} -gt 0 ] && echo "time: $(printf '%s, ' "${timings[@]}" | sed 's/, $//')"
  return 0
}

fail() {
  summary+=("$1: FAILED: $2")
  echo "test.sh: $1: $2" >&2
  recap
  exit "${3:-1}"
}

test_count() {
  ctest --test-dir "$BUILD_DIR" -N -L "^$1\$" | sed -n 's/^Total Tests: *//p'
}

have_clang() {
  command -v clang++ >/dev/null 2>&1 || command -v clang++-14 >/dev/null 2>&1
}

# True when the tier may run; otherwise records why (and fails where that is not allowed).
tier_has_tests() {
  local tier=$1 count
  count=$(test_count "$tier")
  [ "${count:-0}" -gt 0 ] && return 0
  echo "tier $tier: no tests registered"
  if [ "$tier" = fuzz ] && ! have_clang; then
    summary+=("fuzz: skipped: no tests registered because clang++ is not installed" \
              "      (scripts/setup.sh installs clang)")
    echo "tier fuzz: skipped: clang++ is not installed, so no fuzzer was built"
    return 1
  fi
  case "$tier" in
    fuzz) fail fuzz "no tests registered although clang++ is present; see the cmake output in build/setup.log (clang's compiler-rt missing? install libclang-rt-dev)" ;;
    lab) fail lab "no tests registered (tests/lab/CMakeLists.txt missing or the lab disabled)" ;;
    fabric) fail fabric "no tests registered (tests/fabric/CMakeLists.txt missing?)" ;;
    *) fail "$tier" "no tests registered; this tier must exist" ;;
  esac
}

# One sanitizer build: configure + build a unit test binary (TARGET) into its own tree, run it.
sanitized_run() {
  local name=$1 flags=$2 filter=$3 target=$4 dir="$REPO/build-$1" rc line
  mkdir -p "$LOG_DIR"
  echo "-- $name: building unit tests with -fsanitize=$flags in ${dir#"$REPO"/}"
  if ! { cmake -S "$REPO" -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DMESH_SANITIZE="$flags" \
           -DMESH_BUILD_TESTS=ON -DMESH_WERROR=ON &&
         cmake --build "$dir" -j "$(nproc)" --target "$target"; } >"$LOG_DIR/$name-build.log" 2>&1; then
    tail -n 30 "$LOG_DIR/$name-build.log"
    fail sanitize "$name build failed (log: $LOG_DIR/$name-build.log)"
  fi
  # The GoogleTest binary itself (the unit label also holds tool checks this tree lacks).
  set +e
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    "$dir/tests/$target" --gtest_brief=1 ${filter:+--gtest_filter="$filter"} 2>&1 |
    tee "$LOG_DIR/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  line=$(grep -E '^\[  PASSED  \] [0-9]+ tests' "$LOG_DIR/$name.log" | tail -n 1 || true)
  [ "$rc" -eq 0 ] || fail sanitize "$name: unit tests exited $rc" "$rc"
  summary+=("sanitize ($name): ${line:-no summary line}")
}

run_sanitize() {
  header "tier: sanitize"
  sanitized_run asan address,undefined "" mesh_unit_tests
  # The threaded tests only, in a binary of their own (tests/CMakeLists.txt).
  sanitized_run tsan thread 'Reactor*:HandshakeTest*:RegCache*:MrRegistry*:FifoLitmus*:StatsDir*:RelayServiceTest*' mesh_unit_tests_threaded
}

# The arm64 tier: cross build into build-arm64/, then ctest -L arm64 there (every aarch64
# binary under qemu-aarch64). Without the cross compiler or QEMU it is skipped with the
# reason: both are optional packages that scripts/setup.sh installs where it can.
run_arm64() {
  local dir="$REPO/build-arm64" missing=() rc line tool
  header "tier: arm64"
  for tool in aarch64-linux-gnu-g++ qemu-aarch64-static; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  [ -e /lib/ld-linux-aarch64.so.1 ] || missing+=("/lib/ld-linux-aarch64.so.1 (libc6:arm64)")
  if [ ${#missing[@]} -gt 0 ]; then
    summary+=("arm64: skipped: missing ${missing[*]} (scripts/setup.sh installs the arm64 packages)")
    echo "tier arm64: skipped: missing ${missing[*]}"
    return 0
  fi
  mkdir -p "$LOG_DIR"
  echo "-- arm64: cross-building into ${dir#"$REPO"/}"
  # -O2 as users build it, but line tables only (-g1: backtraces keep file and line): full
  # debug info is a third of this build's compile time and nobody debugs this tree.
  if ! { cmake -S "$REPO" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
           -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
           -DCMAKE_TOOLCHAIN_FILE="$REPO/cmake/toolchain-aarch64-linux-gnu.cmake" \
           -DMESH_BUILD_TESTS=ON -DMESH_WERROR=ON &&
         cmake --build "$dir" -j "$(nproc)"; } >"$LOG_DIR/arm64-build.log" 2>&1; then
    tail -n 30 "$LOG_DIR/arm64-build.log"
    fail arm64 "cross build failed (log: $LOG_DIR/arm64-build.log)"
  fi
  [ "$(ctest --test-dir "$dir" -N -L '^arm64$' | sed -n 's/^Total Tests: *//p')" -gt 0 ] ||
    fail arm64 "no tests registered in ${dir#"$REPO"/} (qemu-aarch64 not found at configure time?)"
  set +e
  ctest --test-dir "$dir" --output-on-failure -L '^arm64$' -j "$(nproc)" 2>&1 | tee "$LOG_DIR/arm64.log"
  rc=${PIPESTATUS[0]}
  set -e
  line=$(grep -E '[0-9]+% tests passed' "$LOG_DIR/arm64.log" | tail -n 1 || true)
  [ "$rc" -eq 0 ] || fail arm64 "ctest exited $rc${line:+ ($line)}" "$rc"
  summary+=("arm64: ${line:-ctest printed no summary line}")
}

run_tier() {
  local tier=$1 jobs=1 rc line
  [ "$tier" = sanitize ] && { run_sanitize; return 0; }
  [ "$tier" = arm64 ] && { run_arm64; return 0; }
  header "tier: $tier"
  tier_has_tests "$tier" || return 0
  if [ "$tier" = lab ] && [ "$run_setup" -eq 1 ]; then
    # The lab's guest kernel is fetched once (network); a failure here fails this tier only.
    "$REPO/scripts/setup.sh" --no-build || fail lab "preparing the lab failed"
  fi
  # fabric: tests in their own namespaces, mostly waiting; its sanitizer runs are RUN_SERIAL.
  # fuzz: each fuzzer is one single-threaded process for a fixed time, so one per core.
  case "$tier" in unit|abi|fabric|fuzz) jobs=$(nproc) ;; esac
  mkdir -p "$LOG_DIR"
  set +e
  ctest --test-dir "$BUILD_DIR" --output-on-failure -L "^$tier\$" -j "$jobs" 2>&1 |
    tee "$LOG_DIR/$tier.log"
  rc=${PIPESTATUS[0]}
  set -e
  line=$(grep -E '[0-9]+% tests passed' "$LOG_DIR/$tier.log" | tail -n 1 || true)
  if [ "$rc" -ne 0 ]; then
    fail "$tier" "ctest exited $rc${line:+ ($line)}" "$rc"
  fi
  summary+=("$tier: ${line:-ctest printed no summary line}")
  [ "$tier" = lab ] && run_lab_arm64
  return 0
}

# The aarch64 lab (label lab-arm64 in build-arm64/, which the arm64 tier built): aarch64 TCG
# guests with Debian's arm64 kernel and rxe run pair, grouped and ring scenarios (~45 s, plus
# a one-time download of the arm64 kernel and userland). Part of the lab tier; skipped
# with the reason when the arm64 tier did not build its tree here.
run_lab_arm64() {
  local dir="$REPO/build-arm64" rc line count
  # No tree at all is the skip below too: ctest fails on a missing directory, and under
  # pipefail that would end this script with status 1 and no word after the lab passed.
  count=0
  if [ -f "$dir/CTestTestfile.cmake" ]; then
    count=$(ctest --test-dir "$dir" -N -L '^lab-arm64$' 2>/dev/null | sed -n 's/^Total Tests: *//p' || true)
  fi
  if [ "${count:-0}" -eq 0 ]; then
    summary+=("lab (arm64): skipped: no build-arm64/ with lab-arm64 tests (run the arm64 tier first)")
    return 0
  fi
  header "tier: lab (arm64 guests)"
  set +e
  ctest --test-dir "$dir" --output-on-failure -L '^lab-arm64$' 2>&1 | tee "$LOG_DIR/lab-arm64.log"
  rc=${PIPESTATUS[0]}
  set -e
  line=$(grep -E '[0-9]+% tests passed' "$LOG_DIR/lab-arm64.log" | tail -n 1 || true)
  [ "$rc" -eq 0 ] || fail lab "arm64 guests: ctest exited $rc${line:+ ($line)}" "$rc"
  summary+=("lab (arm64): ${line:-ctest printed no summary line}")
}

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --tier)
        [ $# -ge 2 ] || { echo "test.sh: --tier needs a value" >&2; exit 64; }
        case " ${ALL_TIERS[*]} " in
          *" $2 "*) tiers+=("$2") ;;
          *) echo "test.sh: unknown tier '$2' (${ALL_TIERS[*]})" >&2; exit 64 ;;
        esac
        shift ;;
      --tier=*) parse_args --tier "${1#--tier=}" ;;
      --no-setup) run_setup=0 ;;
      -h|--help) usage; exit 0 ;;
      *) echo "test.sh: unknown option '$1'" >&2; usage >&2; exit 64 ;;
    esac
    shift
  done
}

main() {
  parse_args "$@"
  [ ${#tiers[@]} -gt 0 ] || tiers=("${ALL_TIERS[@]}")
  cd "$REPO"
  if [ "$run_setup" -eq 1 ]; then
    header "setup"
    # The lab is prepared just before the lab tier, so an offline machine still gets
    # the unit, abi and fuzz results.
    scripts/setup.sh --no-lab || { echo "test.sh: setup failed" >&2; exit 1; }
    timings+=("setup $SECONDS s")
  fi
  [ -f "$BUILD_DIR/CTestTestfile.cmake" ] || fail setup "no test tree in build/; run scripts/setup.sh"
  local tier start
  for tier in "${ALL_TIERS[@]}"; do
    case " ${tiers[*]} " in
      *" $tier "*)
        start=$SECONDS
        run_tier "$tier"
        timings+=("$tier $((SECONDS - start)) s") ;;
    esac
  done
  timings+=("total $SECONDS s")
  recap
}

main "$@"
