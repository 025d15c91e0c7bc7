# SPDX-License-Identifier: Apache-2.0
# info_tool_no_rdma: nccl-mesh-info on a node without a usable RDMA port.
#   cmake -DTOOL=/path/to/nccl-mesh-info -P info_tool_check.cmake
# Checks exit statuses (1 no usable port, 64 usage error, 0 --help) and that the
# output tells the user what to do. Cases that need "no RDMA device on this machine"
# force it with settings, so the test means the same on a node that has RDMA.
if(NOT TOOL OR NOT EXISTS "${TOOL}")
  message(FATAL_ERROR "TOOL=${TOOL} does not exist")
endif()

set(failures 0)

# run(<name> <expected exit> <regex the combined output must match> ARGS...)
function(run name expected_rc regex)
  execute_process(COMMAND "${TOOL}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  set(all "${out}${err}")
  if(NOT rc STREQUAL "${expected_rc}")
    message(SEND_ERROR "${name}: exit status ${rc}, expected ${expected_rc}\n${all}")
  elseif(NOT all MATCHES "${regex}")
    message(SEND_ERROR "${name}: output does not match '${regex}'\n${all}")
  else()
    message(STATUS "${name}: ok (exit ${rc})")
  endif()
endfunction()

file(GLOB rdma_devices /sys/class/infiniband/*)
if(rdma_devices)
  message(STATUS "plain run skipped: this machine has RDMA devices (${rdma_devices})")
else()
  run("plain run, no RDMA device" 1 "RDMA ports usable by the mesh: 0.*hint: no usable RDMA port.*ibv_devinfo")
  run("--peer without a port" 1 "hint: no usable RDMA port" --peer 198.18.0.2)
endif()

set(ENV{NCCL_MESH_HCA} "=no_such_rdma_device")
run("every port filtered out" 1 "RDMA ports usable by the mesh: 0.*hint: no usable RDMA port.*NCCL_MESH_HCA")
unset(ENV{NCCL_MESH_HCA})

set(ENV{NCCL_MESH_IBVERBS_LIB} "/nonexistent/libibverbs.so.1")
run("no libibverbs" 1 "/nonexistent/libibverbs.so.1.*install rdma-core")
unset(ENV{NCCL_MESH_IBVERBS_LIB})

run("unknown option" 64 "unknown argument '--bogus'.*usage: nccl-mesh-info" --bogus)
run("bad --peer" 64 "'198.18.0.300' is not an IPv4 address" --peer 198.18.0.300)
run("--peer without value" 64 "--peer needs a value" --peer)
run("--help" 0 "usage: nccl-mesh-info.*Exit status" --help)
