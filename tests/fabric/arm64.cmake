# SPDX-License-Identifier: Apache-2.0
# The fabric half of the arm64 tier (label arm64): tests/e2e's scenarios with the cross-built
# plugin and drop-in (meshfab) on scripts/fabric-net's namespaces, mesh_e2e run by
# qemu-aarch64 in every namespace (fabric_e2e, CMakeLists.txt: the fabric tier's function,
# which names arm64_fabric_e2e_* tests in a cross build). fabric-net itself, iproute2 and the
# shell are the host's.

# The fabric tier's scenario list (e2e_scenarios.cmake), less the 8-rank ones (eight
# emulators on a 2-core CI machine). The sanitizer runs are not in it (host-only runtimes).
macro(fabric_scenario name nodes)
  if(${nodes} LESS 8)
    fabric_e2e(${name} ${nodes} ${ARGN})
  endif()
endmacro()
include(${CMAKE_CURRENT_SOURCE_DIR}/e2e_scenarios.cmake)
# reload counts /proc/self/task right after dlclose. Under qemu-user a joined thread's host
# thread lingers a moment after the guest's join returns (QEMU clears the thread id and wakes
# the joiner before the host thread is gone); with another emulator competing for the CPU
# that moment was long enough to count it once in a few runs. Alone it passed every time.
set_tests_properties(arm64_fabric_e2e_reload PROPERTIES RUN_SERIAL TRUE)
