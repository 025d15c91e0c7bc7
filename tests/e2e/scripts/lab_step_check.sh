#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# lab_step_check.sh LOG NAME NODES: one step of a shared lab boot (lab_steps.sh) as a test of
# its own: prints every rank's lines of step NAME from the group's LOG and passes only when
# every rank 0..NODES-1 ran it and it exited 0 there, with no FAIL line.
set -u
log=$1 name=$2 nodes=$3
if [ ! -r "$log" ]; then
  echo "FAIL lab-step $name: no log $log (did its group's boot run?)"
  exit 1
fi
awk -v name="$name" -v nodes="$nodes" '
  match($0, /^\[[0-9]+\] /) {
    rank = substr($0, 2, RLENGTH - 3) + 0
    text = substr($0, RLENGTH + 1)
    if (text == "lab-step " name " begin") { inside[rank] = 1; began[rank] = 1; print; next }
    if (inside[rank] && index(text, "lab-step " name " rc=") == 1) {
      inside[rank] = 0; rc[rank] = substr(text, length("lab-step " name " rc=") + 1); print; next
    }
    if (inside[rank]) { print; if (text ~ /FAIL [a-z-]+ rank=/) failed = 1 }
  }
  END {
    bad = ""
    for (r = 0; r < nodes; r++) {
      if (!(r in began)) bad = bad " rank " r " never began it;"
      else if (!(r in rc)) bad = bad " rank " r " did not finish it;"
      else if (rc[r] != "0") bad = bad " rank " r " exited " rc[r] ";"
    }
    if (failed) bad = bad " a FAIL line;"
    if (bad != "") { print "FAIL lab-step " name ":" bad; exit 1 }
    print "PASS lab-step " name " on " nodes " ranks"
  }' "$log"
