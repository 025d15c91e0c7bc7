# SPDX-License-Identifier: Apache-2.0
# admin_tools: what an admin sees first from the two tools, on any machine (no RDMA needed).
#   cmake -DINFO=... -DPERF=... -DVERSION=x.y.z -P tools_check.cmake
# --version on both tools; --settings, --probe, --serve in nccl-mesh-info's usage; --probe and
# --serve without a port, and their command-line errors; the JSON names a reason
# when no port is usable; a malformed NCCL_MESH_HCA entry is reported once, with the
# variable named once; --routes names an unusable static route, and a malformed
# NCCL_MESH_ROUTES is one WARN naming its entry; --listen's command-line errors, and no
# listening without a port; --subnets without a port; --ring-order without RDMA on a shuffled
# 4-ring, a 4-line from stdin, a malformed line and a duplicate node (exit 2, the line named), a
# directory (exit 2).
foreach(var INFO PERF VERSION)
  if(NOT ${var})
    message(FATAL_ERROR "${var} not set")
  endif()
endforeach()

# check(<name> <expected exit or ANY> <regex the output must match> [NOT <regex it must not match>]
#       -- COMMAND...)
function(check name expected_rc regex)
  cmake_parse_arguments(C "" "NOT" "" ${ARGN})
  execute_process(COMMAND ${C_UNPARSED_ARGUMENTS} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  set(all "${out}${err}")
  if(NOT expected_rc STREQUAL "ANY" AND NOT rc STREQUAL "${expected_rc}")
    message(SEND_ERROR "${name}: exit status ${rc}, expected ${expected_rc}\n${all}")
  elseif(NOT all MATCHES "${regex}")
    message(SEND_ERROR "${name}: output does not match '${regex}'\n${all}")
  elseif(C_NOT AND all MATCHES "${C_NOT}")
    message(SEND_ERROR "${name}: output matches '${C_NOT}'\n${all}")
  else()
    message(STATUS "${name}: ok (exit ${rc})")
  endif()
endfunction()

string(REPLACE "." "\\." version_re "${VERSION}")
check("nccl-mesh-info --version" 0 "^nccl-mesh-info: nccl-mesh ${version_re}( \\(git [0-9a-f]+(-dirty)?\\))?\n$"
      ${INFO} --version)
check("nccl-mesh-perf --version" 0 "^nccl-mesh-perf: nccl-mesh ${version_re}( \\(git [0-9a-f]+(-dirty)?\\))?\n$"
      ${PERF} --version)
check("usage lines list --settings, --probe, --serve and --ring-order" 0
      "usage: nccl-mesh-info [^\n]*\n +nccl-mesh-info --probe PEER[^\n]*\n +nccl-mesh-info --serve[^\n]*\n +nccl-mesh-info --settings[^\n]*\n +nccl-mesh-info --subnets \\| --ring-order FILE\n"
      ${INFO} --help)
check("nccl-mesh-info usage on a bad option names --version" 64 "--version" ${INFO} --frob)

set(ENV{NCCL_MESH_IBVERBS_LIB} "/nonexistent/libibverbs.so.1")
check("--probe on a node without a port" 1 "^probe: this node .*\nverdict: NO PORT: no RDMA: " ${INFO} --probe 127.0.0.1)
check("--serve on a node without a port" 1 "--serve: no RDMA: " ${INFO} --serve --once)
check("--probe with a bad port" 64 "--probe 'h:0': the port must be a number" ${INFO} --probe h:0)
check("--probe without a value" 64 "--probe needs a value" ${INFO} --probe)
check("JSON gives the reason for 0 ports" 1
      "\"reason\": \"libibverbs \\(/nonexistent/libibverbs.so.1\\) could not be loaded[^\n]*\n  \"ports\": \\[\\]"
      ${INFO} --json)
set(ENV{NCCL_MESH_ROUTES} "198.18.2.0/24=198.18.0.2")
check("--routes without a port: the static route is ignored, and why" 1
      "Relay routes \\(computed[^\n]*\n[^\n]*: 0\n  NCCL_MESH_ROUTES 198\\.18\\.2\\.0/24=198\\.18\\.0\\.2: the next hop is on none of this node's links \\(no ports\\); ignored"
      ${INFO} --routes)
set(ENV{NCCL_MESH_ROUTES} "198.18.2.5/24=198.18.0.2")
check("a malformed NCCL_MESH_ROUTES: one WARN naming the entry, the variable named once" 1
      "WARN NET/Mesh : NCCL_MESH_ROUTES='198\\.18\\.2\\.5/24=198\\.18\\.0\\.2' is not valid [^\n]*: entry 1 [^\n]*did you mean 198\\.18\\.2\\.0/24\\?; using the default \\(empty\\)"
      NOT "NCCL_MESH_ROUTES[^\n]*NCCL_MESH_ROUTES"
      ${INFO} --routes)
unset(ENV{NCCL_MESH_ROUTES})
check("--subnets without a port: the name alone, and why" 1
      "^[^ \n]+\n.*--subnets: no usable mesh port" ${INFO} --subnets)

# --ring-order reads what --subnets printed on each node; the node files are written here.
# Ring A-B-C-D-A (cables 198.18.0-3.0/24), listed C, A, D, B.
set(ring4 "${CMAKE_CURRENT_BINARY_DIR}/ring_order_ring4.txt")
file(WRITE ${ring4} "# for h in ...; do ssh $h nccl-mesh-info --subnets; done\n"
                    "nodeC 198.18.1.0/24 198.18.2.0/24\n\n"
                    "nodeA 198.18.3.0/24 198.18.0.0/24\n"
                    "nodeD 198.18.2.0/24 198.18.3.0/24  # a comment\n"
                    "nodeB 198.18.0.0/24 198.18.1.0/24\n")
check("--ring-order on a shuffled 4-ring (no RDMA needed): the cable order" 0
      "^Ring order \\(4 nodes, follows the cables everywhere\\): nodeC nodeD nodeA nodeB\nLaunch ranks in this order \\(rank 0 on nodeC[^\n]*mpirun -H nodeC,nodeD,nodeA,nodeB [^\n]*\\(nodeC 0, nodeD 1, nodeA 2, nodeB 3\\)\n$"
      ${INFO} --ring-order ${ring4})
set(line4 "${CMAKE_CURRENT_BINARY_DIR}/ring_order_line4.txt")
file(WRITE ${line4} "nodeA 198.18.0.0/24\nnodeC 198.18.1.0/24 198.18.2.0/24\nnodeD 198.18.2.0/24\n"
                    "nodeB 198.18.0.0/24 198.18.1.0/24\n")
check("--ring-order - on a 4-line: the wrap pair named" 0
      "^Ring order \\(4 nodes, line: nodeD -> nodeA is not cabled: NCCL's ring closes through the relay there\\): nodeA nodeB nodeC nodeD\n"
      sh -c "\"$1\" --ring-order - < \"$2\"" sh ${INFO} ${line4})
set(bad "${CMAKE_CURRENT_BINARY_DIR}/ring_order_bad.txt")
file(WRITE ${bad} "nodeA 198.18.0.0/24\n# fine\nnodeB 198.18.0.0/24 198.18.1.0/33\n")
check("--ring-order on a malformed line: exit 2, the line named" 2
      "--ring-order [^\n]*ring_order_bad\\.txt: line 3: '198\\.18\\.1\\.0/33' is not a subnet A\\.B\\.C\\.D/LEN"
      NOT "Ring order" ${INFO} --ring-order ${bad})
file(WRITE ${bad} "nodeA 198.18.0.0/24\nnodeB 198.18.0.0/24\nnodeA 198.18.1.0/24\n")
check("--ring-order with a node listed twice: exit 2, both lines named" 2
      "node 'nodeA' is listed twice \\(line 1 and line 3\\)" ${INFO} --ring-order ${bad})
check("--ring-order on a missing file: exit 2" 2 "--ring-order: cannot read '/nonexistent/nodes\\.txt'"
      ${INFO} --ring-order /nonexistent/nodes.txt)
# A directory threw out of the stream's read (std::terminate, exit 134).
check("--ring-order on a directory: exit 2" 2 "--ring-order: cannot read '${CMAKE_CURRENT_BINARY_DIR}'"
      ${INFO} --ring-order ${CMAKE_CURRENT_BINARY_DIR})
check("--routes --listen without a port: exit 1 at once, the table computed, nothing heard" 1
      "Relay routes \\(computed[^\n]*\n[^\n]*: 0\n"
      NOT "learned by listening"
      ${INFO} --routes --listen 30)
unset(ENV{NCCL_MESH_IBVERBS_LIB})
check("--listen needs --routes" 64 "--listen shows the route table: use it with --routes" ${INFO} --listen 5)
check("--listen takes 1..60 seconds" 64 "--listen needs a number of seconds, 1\\.\\.60" ${INFO} --routes --listen 61)
check("--listen without a value" 64 "--listen needs a number of seconds" ${INFO} --routes --listen)
check("--ring-order without a value" 64 "--ring-order needs a value" ${INFO} --ring-order)

set(ENV{NCCL_MESH_HCA} "mlx5_0:x")
check("a malformed NCCL_MESH_HCA entry: one WARN, the variable named once" ANY
      "WARN NET/Mesh : NCCL_MESH_HCA='mlx5_0:x': entry 'mlx5_0:x' has port 'x'"
      NOT "NCCL_MESH_HCA: NCCL_MESH_HCA|NCCL_MESH_HCA='mlx5_0:x': NCCL_MESH_HCA"
      ${INFO})
unset(ENV{NCCL_MESH_HCA})
