#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# lab_abi_versions_devices (a step of lab_e2e_boot_pair2): the ABI tests through v8-v12 where
# the plugin has devices (one rxe port per guest): the properties NCCL range-checks, and
# init/listen/connect/unload with real ports. The two no-device tests are left out; any other
# skip fails the step, as a failure does.
# Usage: abi_devices_guest.sh PATH_TO_ABI_VERSIONS_LOAD_TEST   (LD_LIBRARY_PATH: the plugin's dir)
set -u
out=$("$1" '--gtest_filter=-Abi/EachVersion.InitWithoutRdmaPortsReportsZeroDevices/*:Abi/EachVersion.ListenAndConnectWithoutADeviceFail/*' 2>&1)
rc=$?
echo "$out"
if echo "$out" | grep -q '^\[  SKIPPED \]'; then
    echo "FAIL abi-devices rank=$VMESH_RANK: a test was skipped although this guest has an RDMA port"
    exit 1
fi
[ "$rc" -eq 0 ] || echo "FAIL abi-devices rank=$VMESH_RANK: the tests exited $rc"
exit "$rc"
