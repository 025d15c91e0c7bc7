# SPDX-License-Identifier: Apache-2.0
# The fabric half of the arm64 tier (label arm64): tests/e2e's scenarios with the cross-built
# plugin and drop-in (meshfab) on scripts/fabric-net's namespaces, mesh_e2e run by
# qemu-aarch64 in every namespace. fabric-net itself, iproute2 and the shell are the host's.
set(FABRIC_NET ${PROJECT_SOURCE_DIR}/scripts/fabric-net)
set(FABRIC_LIB $<TARGET_SONAME_FILE:meshfab>)

# fabric_arm64_e2e(NAME NODES DEADLINE FABRIC_NET_ARGS... -- SCENARIO_ARGS...)
function(fabric_arm64_e2e name nodes deadline)
  mesh_split_at_dashes(net_args scenario_args ${ARGN})
  math(EXPR net_timeout "${deadline} + 30")
  math(EXPR ctest_timeout "${deadline} + 60")
  add_test(NAME arm64_fabric_e2e_${name}
           COMMAND ${FABRIC_NET} run --nodes ${nodes} --timeout ${net_timeout} ${net_args}
                   -- env LD_LIBRARY_PATH=$<TARGET_FILE_DIR:nccl-net-mesh> NCCL_MESH_IBVERBS_LIB=${FABRIC_LIB}
                   ${CMAKE_CROSSCOMPILING_EMULATOR} $<TARGET_FILE:mesh_e2e> ${scenario_args} --deadline ${deadline})
  set_tests_properties(arm64_fabric_e2e_${name} PROPERTIES
    LABELS arm64 TIMEOUT ${ctest_timeout} FAIL_REGULAR_EXPRESSION "FAIL [a-z-]+ rank=")
endfunction()

# The fabric tier's scenario list (e2e_scenarios.cmake), less the 8-rank ones (eight
# emulators on a 2-core CI machine). The sanitizer runs are not in it (host-only runtimes).
macro(fabric_scenario name nodes)
  if(${nodes} LESS 8)
    fabric_arm64_e2e(${name} ${nodes} ${ARGN})
  endif()
endmacro()
include(${CMAKE_CURRENT_SOURCE_DIR}/e2e_scenarios.cmake)
# reload counts /proc/self/task right after dlclose. Under qemu-user a joined thread's host
# thread lingers a moment after the guest's join returns (QEMU clears the thread id and wakes
# the joiner before the host thread is gone); with another emulator competing for the CPU
# that moment was long enough to count it once in a few runs. Alone it passed every time.
set_tests_properties(arm64_fabric_e2e_reload PROPERTIES RUN_SERIAL TRUE)
