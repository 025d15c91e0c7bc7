#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Host-side checks that vmesh reports failing guests and cleans up after itself.
#
#   vmesh_failures.sh VMESH BUILD_DIR
#
# 1. A CMD that exits 3 on rank 1 and a kernel panic on rank 2 fail the run, and
#    the report names each guest and why (rank 0, which passed, says exit 0).
# 2. A guest that powers itself off mid-run is reported as such; the guest left
#    hanging is stopped --fail-grace seconds later.
# 3. --timeout stops a hanging CMD and says so (run in the background beside the others).
# 4. SIGTERM to vmesh stops every guest and exits 143.
# After each run: its run directory is gone and no process still refers to it.
# shellcheck disable=SC2016  # the $VMESH_* in CMDs expand in the guests
set -u
vmesh=$1
build_dir=$2
log=$(mktemp /tmp/vmesh-failures.XXXXXX)
trap 'rm -f "$log"' EXIT
failures=0

fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}

expect_line() {
    grep -qE "$1" "$log" || fail "no line matching /$1/ in vmesh's output"
}

# Every CMD below prints "RUNDIR <path>" on rank 0 so we can check the cleanup.
check_cleaned_up() {
    rundir=$(sed -n 's/^\[0\] RUNDIR //p' "$log" | head -n 1)
    if [ -z "$rundir" ]; then
        fail "rank 0 never printed its run directory"
        return
    fi
    [ ! -e "$rundir" ] || fail "run directory $rundir outlived vmesh"
    # The pattern must not contain the path itself, or grep would find its own
    # command line: match the last character through a bracket expression.
    pattern="${rundir%?}[${rundir: -1}]"
    if grep -ls "$pattern" /proc/[0-9]*/cmdline >/dev/null; then
        fail "a process still refers to $rundir: $(grep -ls "$pattern" /proc/[0-9]*/cmdline)"
    fi
}

run_vmesh() {
    echo "--- vmesh run $*"
    "$vmesh" run --build "$build_dir" "$@" >"$log" 2>&1
    status=$?
    cat "$log"
}

announce='[ "$VMESH_RANK" != 0 ] || echo "RUNDIR $VMESH_RUN"'

# 3. timeout, started first and in the background: its guest only sleeps while the other
# cases run (45 s of waiting otherwise added to this test's time); checked after case 4.
timeout_log=$(mktemp /tmp/vmesh-failures.XXXXXX)
trap 'rm -f "$log" "$timeout_log"' EXIT
echo "--- vmesh run --nodes 1 --no-mgmt --timeout 45 (in the background)"
"$vmesh" run --build "$build_dir" --nodes 1 --no-mgmt --timeout 45 -- sh -c "$announce; sleep 600" \
    >"$timeout_log" 2>&1 &
timeout_pid=$!

# 1. exit status and panic
run_vmesh --nodes 3 --no-mgmt -- sh -c "$announce"'
    case $VMESH_RANK in
        1) exit 3 ;;
        2) echo c >/proc/sysrq-trigger ;;
    esac'
[ "$status" -ne 0 ] || fail "vmesh exited 0 although ranks 1 and 2 failed"
expect_line '^vmesh: rank 0: exit 0$'
expect_line '^vmesh: rank 1: CMD exited with status 3$'
expect_line '^vmesh: rank 2: kernel panic while running CMD: Kernel panic - not syncing: sysrq triggered crash$'
expect_line '^vmesh: FAILED: rank 1, rank 2 '
check_cleaned_up

# 2. a guest killed mid-run; the other one hangs and is stopped by the grace period
run_vmesh --nodes 2 --no-mgmt --fail-grace 5 -- sh -c "$announce"'
    if [ "$VMESH_RANK" = 1 ]; then echo o >/proc/sysrq-trigger; fi
    sleep 600'
[ "$status" -ne 0 ] || fail "vmesh exited 0 although rank 1 died"
expect_line '^vmesh: rank 1: guest powered off or was killed mid-run without reporting an exit status \(while running CMD\)$'
expect_line '^vmesh: rank 0: killed: stopped 5 s after another guest failed \(while running CMD\)$'
check_cleaned_up

# 4. SIGTERM once the CMD runs
echo "--- vmesh run --nodes 1 (SIGTERM once CMD runs)"
"$vmesh" run --build "$build_dir" --nodes 1 --no-mgmt -- \
    sh -c "$announce; echo CMD-STARTED; sleep 600" >"$log" 2>&1 &
pid=$!
deadline=$((SECONDS + 120))
until grep -q 'CMD-STARTED' "$log" || [ $SECONDS -ge $deadline ] || ! kill -0 $pid 2>/dev/null; do
    sleep 0.2
done
kill -TERM $pid
deadline=$((SECONDS + 30))
while kill -0 $pid 2>/dev/null && [ $SECONDS -lt $deadline ]; do
    sleep 0.2
done
if kill -0 $pid 2>/dev/null; then
    fail "vmesh still running 30 s after SIGTERM"
    kill -KILL $pid
fi
wait $pid
status=$?
cat "$log"
[ "$status" -eq 143 ] || fail "vmesh exited $status after SIGTERM, want 143"
expect_line '^vmesh: rank 0: killed: vmesh got SIGTERM \(while running CMD\)$'
expect_line '^vmesh: interrupted by SIGTERM$'
check_cleaned_up

# 3. timeout (started before case 1)
wait "$timeout_pid"
status=$?
cp "$timeout_log" "$log"
echo "--- vmesh run --nodes 1 --no-mgmt --timeout 45 (background, done)"
cat "$log"
[ "$status" -ne 0 ] || fail "vmesh exited 0 although its guest timed out"
expect_line '^vmesh: rank 0: killed: timed out after 45 s \(while running CMD\)$'
check_cleaned_up

echo "vmesh_failures: $failures failure(s)"
[ "$failures" -eq 0 ]
