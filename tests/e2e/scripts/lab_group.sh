#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# lab_group.sh LOG CMD...: runs CMD (one scripts/vmesh boot running lab_steps.sh), its output
# both on stdout and in LOG for the per-step tests (lab_step_check.sh); exits with CMD's status.
set -u
log=$1
shift
mkdir -p "$(dirname "$log")"
rm -f "$log"
"$@" 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
