#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# admin_test_sh: scripts/test.sh (the README's test command, .ci/run) on a scratch tree whose
# build/ holds stand-in ctest tests, so its own logic is checked in seconds:
#  - `--tier lab --no-setup` with lab tests that pass and no build-arm64/: exit 0, the lab's
#    summary line, and the aarch64 guests recorded as skipped with the reason (it once ended
#    with status 1 and no word there: ctest on a missing tree under pipefail);
#  - a failing lab test: a non-zero exit and "lab: FAILED" in the summary;
#  - an unknown tier: exit 64 with usage.
# usage: test_sh_selftest.sh PATH/TO/scripts/test.sh
set -u
script=$1
fails=0
fail() { echo "FAIL admin_test_sh: $*"; fails=$((fails + 1)); }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-sh-selftest.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT

# A scratch "repository": the script (it finds the repository from its own path) and a
# build/ whose ctest file registers the given lab tests.
scratch() {
  local dir=$tmp/$1
  shift
  mkdir -p "$dir/scripts" "$dir/build"
  cp "$script" "$dir/scripts/test.sh"
  : >"$dir/build/CTestTestfile.cmake"
  while [ $# -gt 0 ]; do
    printf 'add_test(%s "%s")\nset_tests_properties(%s PROPERTIES LABELS lab)\n' "$1" "$2" "$1" \
      >>"$dir/build/CTestTestfile.cmake"
    shift 2
  done
  echo "$dir"
}

dir=$(scratch pass lab_ok /bin/true)
out=$(bash "$dir/scripts/test.sh" --tier lab --no-setup 2>&1)
rc=$?
[ "$rc" -eq 0 ] || fail "passing lab tests, no build-arm64/: exit $rc, expected 0; output: $out"
echo "$out" | grep -q '^lab: 100% tests passed' || fail "no lab summary line: $out"
echo "$out" | grep -q '^lab (arm64): skipped: no build-arm64/' || fail "the aarch64 guests' skip not recorded: $out"
echo "$out" | grep -q '^time: lab [0-9]* s' || fail "no time line: $out"

dir=$(scratch failing lab_ok /bin/true lab_bad /bin/false)
out=$(bash "$dir/scripts/test.sh" --tier lab --no-setup 2>&1)
rc=$?
[ "$rc" -ne 0 ] || fail "a failing lab test: exit 0"
echo "$out" | grep -q '^lab: FAILED' || fail "a failing lab test: no 'lab: FAILED' line: $out"

out=$(bash "$script" --tier nosuch 2>&1)
rc=$?
[ "$rc" -eq 64 ] || fail "--tier nosuch: exit $rc, expected 64"
echo "$out" | grep -q "unknown tier 'nosuch'" || fail "--tier nosuch: no reason: $out"

[ "$fails" -eq 0 ] && echo "admin_test_sh: 3 cases passed"
exit "$fails"
