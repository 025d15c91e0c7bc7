#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# lab_step_check_selftest.sh: lab_step_check.sh on made-up group logs (unit tier): a step
# passes only when every rank began it, finished it with rc=0 and printed no FAIL line.
set -u
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0
expect() {  # expect pass|fail NODES STEP LOG-TEXT
  local want=$1 nodes=$2 step=$3 got
  printf '%s\n' "$4" >"$tmp/log"
  if bash "$here/lab_step_check.sh" "$tmp/log" "$step" "$nodes" >"$tmp/out" 2>&1; then got=pass; else got=fail; fi
  if [ "$got" != "$want" ]; then
    echo "FAIL selftest: step $step on $nodes ranks: expected $want, got $got; output:"
    cat "$tmp/out"
    bad=1
  fi
}
ok2='[0] lab-step a begin
[1] lab-step a begin
[0] [e2e r0] working
[1] PASS pair rank=1
[0] PASS pair rank=0
[0] lab-step a rc=0
[1] lab-step a rc=0
[0] lab-step b begin
[1] lab-step b begin
[1] FAIL pair rank=1 nodes=2: broken
[0] lab-step b rc=0
[1] lab-step b rc=1'
expect pass 2 a "$ok2"
expect fail 2 b "$ok2"
expect fail 3 a "$ok2"                       # rank 2 never began it
expect fail 2 c "$ok2"                       # nobody ran it
expect fail 2 a '[0] lab-step a begin
[1] lab-step a begin
[0] lab-step a rc=0'                         # rank 1 did not finish
expect fail 2 a '[0] lab-step a begin
[1] lab-step a begin
[0] FAIL pair rank=0 nodes=2: wrong data
[0] lab-step a rc=0
[1] lab-step a rc=0'                         # a FAIL line with rc 0
expect pass 2 a '[0] lab-step a begin
[1] lab-step a begin
[0] lab-step a rc=0
[1] lab-step a rc=0
[0] lab-step ab begin
[0] FAIL pair rank=0 nodes=2: another step
[0] lab-step ab rc=1'                        # another step with a longer name is not this one
if bash "$here/lab_step_check.sh" "$tmp/none" a 2 >/dev/null 2>&1; then
  echo "FAIL selftest: a missing log passed"
  bad=1
fi
[ "$bad" -eq 0 ] && echo "PASS lab_step_check selftest"
exit "$bad"
