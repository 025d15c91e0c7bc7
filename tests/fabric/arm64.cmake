# SPDX-License-Identifier: Apache-2.0
# The fabric half of the arm64 tier (label arm64): tests/e2e's scenarios with the cross-built
# plugin and drop-in (meshfab) on scripts/fabric-net's namespaces, mesh_e2e run by
# qemu-aarch64 in every namespace. fabric-net itself, iproute2 and the shell are the host's.
set(FABRIC_NET ${PROJECT_SOURCE_DIR}/scripts/fabric-net)
set(FABRIC_LIB $<TARGET_SONAME_FILE:meshfab>)

# fabric_arm64_e2e(NAME NODES DEADLINE FABRIC_NET_ARGS... -- SCENARIO_ARGS...)
function(fabric_arm64_e2e name nodes deadline)
  set(net_args)
  set(scenario_args)
  set(in_scenario FALSE)
  foreach(arg ${ARGN})
    if(arg STREQUAL "--")
      set(in_scenario TRUE)
    elseif(in_scenario)
      list(APPEND scenario_args ${arg})
    else()
      list(APPEND net_args ${arg})
    endif()
  endforeach()
  math(EXPR net_timeout "${deadline} + 30")
  math(EXPR ctest_timeout "${deadline} + 60")
  add_test(NAME arm64_fabric_e2e_${name}
           COMMAND ${FABRIC_NET} run --nodes ${nodes} --timeout ${net_timeout} ${net_args}
                   -- env LD_LIBRARY_PATH=$<TARGET_FILE_DIR:nccl-net-mesh> NCCL_MESH_IBVERBS_LIB=${FABRIC_LIB}
                   ${CMAKE_CROSSCOMPILING_EMULATOR} $<TARGET_FILE:mesh_e2e> ${scenario_args} --deadline ${deadline})
  set_tests_properties(arm64_fabric_e2e_${name} PROPERTIES
    LABELS arm64 TIMEOUT ${ctest_timeout} FAIL_REGULAR_EXPRESSION "FAIL [a-z-]+ rank=")
endfunction()

# The fabric tier's scenario list (tests/fabric/CMakeLists.txt), less the 8-rank ones (eight
# emulators on a 2-core CI machine) and the sanitizer runs (host-only runtimes).
fabric_arm64_e2e(connect_mesh 3 60 -- connect-mesh)
fabric_arm64_e2e(ring_diagonal 4 60 --topology ring -- ring-diagonal)
fabric_arm64_e2e(cycles 2 120 -- cycles --count 100)
foreach(mode never-accept listener-dies peer-killed idle mid-send)
  string(REPLACE "-" "_" mode_name ${mode})
  fabric_arm64_e2e(dead_peer_${mode_name} 2 60 --env NCCL_MESH_CONNECT_TIMEOUT_MS=5000 -- dead-peer --mode ${mode})
endforeach()
fabric_arm64_e2e(pair 2 60 -- pair)
fabric_arm64_e2e(pair_v9 2 60 -- pair --api v9)
fabric_arm64_e2e(pair_v10 2 60 -- pair --api v10 --traffic-class 96)
fabric_arm64_e2e(pair_v11 2 60 -- pair --api v11)
fabric_arm64_e2e(chunked_v11 2 60 --env NCCL_MESH_CHUNK_SIZE=64K -- pair --api v11 --big 4194305 --iters 1)
fabric_arm64_e2e(pair_flush 2 60 --env NCCL_MESH_FORCE_FLUSH=1 -- pair)
fabric_arm64_e2e(allreduce_3 3 60 -- allreduce --pairs 4)
fabric_arm64_e2e(allreduce_ring4 4 60 --topology ring -- allreduce --pairs 4)
fabric_arm64_e2e(links 2 60 --links 2 -- links)
fabric_arm64_e2e(close_inflight 2 60 -- close-inflight)
fabric_arm64_e2e(link_down 3 60 --env NCCL_MESH_PEER_TIMEOUT_MS=5000 --env NCCL_MESH_IB_TIMEOUT=14 -- link-down)
fabric_arm64_e2e(reload 2 60 -- reload --rounds 3)
# reload counts /proc/self/task right after dlclose. Under qemu-user a joined thread's host
# thread lingers a moment after the guest's join returns (QEMU clears the thread id and wakes
# the joiner before the host thread is gone); with another emulator competing for the CPU
# that moment was long enough to count it once in a few runs. Alone it passed every time.
set_tests_properties(arm64_fabric_e2e_reload PROPERTIES RUN_SERIAL TRUE)
fabric_arm64_e2e(bad_input 2 60 --env NCCL_MESH_CONNECT_TIMEOUT_MS=5000 -- bad-input)
fabric_arm64_e2e(memlock 2 60 -- memlock)
fabric_arm64_e2e(contract_v8 2 60 -- contract)
fabric_arm64_e2e(contract_v11 2 60 -- contract --api v11 --traffic-class 96)
fabric_arm64_e2e(abort_reload 2 120 -- abort-reload --api v11 --cycles 20)
fabric_arm64_e2e(fork 2 60 -- fork)
