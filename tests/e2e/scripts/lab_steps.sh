#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# lab_steps.sh PLUGIN_DIR MESH_E2E STEP...: several mesh_e2e scenarios in one boot of the lab,
# run in every guest by scripts/vmesh (tests/e2e/CMakeLists.txt, mesh_e2e_lab_group). A STEP
# is "NAME|DEADLINE|ENV|ARGS": ENV is space-separated VAR=VALUE for this step only, ARGS the
# scenario's arguments. Each step meets the other ranks in a rendezvous directory of its own
# ($VMESH_SHARED/steps/NAME), so a step that fails on one rank only costs the others that
# step's deadline. ARGS that begin with "/" are a command of their own instead (a lab check
# such as tests/lab/lab_guest.sh or the doctor's), run with ENV under `timeout DEADLINE`.
# Prints "lab-step NAME begin" and "lab-step NAME rc=N" around each step
# (lab_step_check.sh reads them; each step's test gives its verdict), then the failed ones;
# exits 0 once every step ran, so that a failing step fails its own test, not the boot's.
set -u
plugin_dir=$1 e2e=$2
shift 2
failed=()
for step in "$@"; do
  IFS='|' read -r name deadline envs args <<<"$step"
  echo "lab-step $name begin"
  dir="$VMESH_SHARED/steps/$name"
  mkdir -p "$dir"
  # shellcheck disable=SC2086 # ENV and ARGS are word lists by design
  case "$args" in
    /*) env LD_LIBRARY_PATH="$plugin_dir" $envs timeout "$deadline" $args ;;
    *) env LD_LIBRARY_PATH="$plugin_dir" $envs "$e2e" $args --shared "$dir" --deadline "$deadline" ;;
  esac
  rc=$?
  echo "lab-step $name rc=$rc"
  [ "$rc" -eq 0 ] || failed+=("$name")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "lab-steps: ${#failed[@]} of $# exited non-zero: ${failed[*]}"
else
  echo "lab-steps: all $# exited 0"
fi
