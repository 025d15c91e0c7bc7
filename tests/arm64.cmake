# SPDX-License-Identifier: Apache-2.0
# The arm64 tier (ctest -L arm64), registered only in a cross build tree
# (cmake/toolchain-aarch64-linux-gnu.cmake; scripts/test.sh --tier arm64 uses build-arm64/).
# The unit and abi tests, built for aarch64 and run under user-mode QEMU through
# CMAKE_CROSSCOMPILING_EMULATOR. What it shows: the code compiles for aarch64 (LP64,
# unsigned char, no x86 intrinsics), the ABI structs keep their offsets there, the plugin
# loads, and the threaded tests run on an emulator that executes aarch64 atomics and
# barriers. What it cannot show: weak-memory reordering, because qemu-user runs the guest's
# threads on the x86 host's cores (FifoLitmus* run anyway; see docs/DESIGN-notes.md).
#
# Also tests/e2e's scenarios on the userspace fabric (tests/fabric/arm64.cmake), where the
# emulator is named in the command. Left out: tests that start an aarch64 binary from a
# shell or cmake script (tool checks, admin loading, e2e self-tests), since that exec needs
# binfmt_misc, and fuzz (libFuzzer is the host clang's).
if(NOT CMAKE_CROSSCOMPILING_EMULATOR)
  message(WARNING "cross build without qemu-aarch64: the arm64 tier has no tests "
                  "(install qemu-user-static; scripts/setup.sh does)")
endif()
# mesh_unit_tests is defined in CMakeLists.txt, for both trees.
if(CMAKE_CROSSCOMPILING_EMULATOR)
  # One process for the whole unit binary: hundreds of emulator start-ups (one per test, as
  # gtest_discover_tests registers them) would cost more than the tests themselves.
  add_test(NAME arm64_unit COMMAND mesh_unit_tests --gtest_brief=1)
  set_tests_properties(arm64_unit PROPERTIES LABELS arm64 TIMEOUT 600)
endif()

add_subdirectory(abi)
add_subdirectory(abi_versions)
# Each of those relabels its own tests arm64 in a cross build (set_tests_properties only
# reaches tests of its own directory before CMake 3.28).

# --- lab-arm64: the aarch64 lab (scripts/vmesh --arch arm64) ---------------------------------
# aarch64 TCG guests with Debian's arm64 kernel and Soft-RoCE run the cross-built plugin
# through tests/e2e's driver, as the x86 lab does. Label lab-arm64, never part of the
# arm64 tier: run with `ctest --test-dir build-arm64 -L lab-arm64` (docs/tests.md: times).
file(GLOB MESH_E2E_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/e2e/*.cpp)
add_executable(mesh_e2e ${MESH_E2E_SOURCES})
# probes.cpp reads the userspace fabric's stats header (tests/fabric/include).
target_include_directories(mesh_e2e PRIVATE ${PROJECT_SOURCE_DIR}/nccl ${CMAKE_CURRENT_SOURCE_DIR}/abi_versions
                                            ${CMAKE_CURRENT_SOURCE_DIR}/fabric/include)
target_link_libraries(mesh_e2e PRIVATE Threads::Threads ${CMAKE_DL_LIBS})
add_dependencies(mesh_e2e nccl-net-mesh)

# The userspace fabric's drop-in for aarch64 and the scenarios on it (tests/fabric/arm64.cmake).
add_subdirectory(fabric)

set(VMESH_ARM64 ${PROJECT_SOURCE_DIR}/scripts/vmesh)
set(MESH_E2E_ARM64 env LD_LIBRARY_PATH=$<TARGET_FILE_DIR:nccl-net-mesh> $<TARGET_FILE:mesh_e2e>)
# The arm64 kernel, the arm64 userland (apt-get download, once) and the initramfs.
add_test(NAME lab_arm64_prepare
         COMMAND ${VMESH_ARM64} prepare --arch arm64 --build ${CMAKE_BINARY_DIR})
set_tests_properties(lab_arm64_prepare PROPERTIES
  LABELS lab-arm64 TIMEOUT 600 RUN_SERIAL TRUE FIXTURES_SETUP vmesh_arm64_image)

# lab_arm64_test(NAME NODES VMESH_ARGS... -- CMD...): one aarch64 mesh per test.
function(lab_arm64_test name nodes)
  add_test(NAME ${name}
           COMMAND ${VMESH_ARM64} run --arch arm64 --build ${CMAKE_BINARY_DIR} --nodes ${nodes}
                   --timeout 400 ${ARGN})
  set_tests_properties(${name} PROPERTIES
    LABELS lab-arm64 TIMEOUT 500 RUN_SERIAL TRUE FIXTURES_REQUIRED vmesh_arm64_image
    FAIL_REGULAR_EXPRESSION "FAIL [a-z-]+ rank=")
endfunction()

# rxe on the arm64 kernel: ACTIVE ports, MTU 4096, RoCE v2 GIDs, ibv_rc_pingpong both ways.
lab_arm64_test(lab_arm64_mesh2 2 -- ${CMAKE_CURRENT_SOURCE_DIR}/lab/lab_guest.sh devices pingpong mgmt)
# pair: sizes, 32 outstanding, grouped receives of 8, short sends, one big message.
lab_arm64_test(lab_arm64_e2e_pair 2 -- ${MESH_E2E_ARM64} pair --deadline 300)
# contract: grouped receives whose sends arrive in any order, absent tags, truncation.
lab_arm64_test(lab_arm64_e2e_grouped 2 -- ${MESH_E2E_ARM64} contract --deadline 300)
# 4-node ring: neighbours connect, the diagonal fails fast; then a ring allreduce.
lab_arm64_test(lab_arm64_e2e_ring_diagonal 4 --topology ring -- ${MESH_E2E_ARM64} ring-diagonal --deadline 300)
lab_arm64_test(lab_arm64_e2e_ring_allreduce 4 --topology ring -- ${MESH_E2E_ARM64} allreduce --pairs 4 --deadline 300)
