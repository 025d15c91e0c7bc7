# The arm64 tier (ctest -L arm64), registered only in a cross build tree
# (cmake/toolchain-aarch64-linux-gnu.cmake; scripts/test.sh --tier arm64 uses build-arm64/).
# The unit and abi tests, built for aarch64 and run under user-mode QEMU through
# CMAKE_CROSSCOMPILING_EMULATOR. What it shows: the code compiles for aarch64 (LP64,
# unsigned char, no x86 intrinsics), the ABI structs keep their offsets there, the plugin
# loads, and the threaded tests run on an emulator that executes aarch64 atomics and
# barriers. What it cannot show: weak-memory reordering, because qemu-user runs the guest's
# threads on the x86 host's cores (FifoLitmus* run anyway; see docs/DESIGN-notes.md).
#
# Left out: tests that start an aarch64 binary from a shell or cmake script (tool checks,
# admin loading, e2e self-tests, the fabric tier), since that exec needs binfmt_misc,
# and fuzz (libFuzzer is the host clang's).
if(NOT CMAKE_CROSSCOMPILING_EMULATOR)
  message(WARNING "cross build without qemu-aarch64: the arm64 tier has no tests "
                  "(install qemu-user-static; scripts/setup.sh does)")
endif()
find_package(GTest REQUIRED)
include(GoogleTest)

file(GLOB MESH_UNIT_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/unit/*_test.cpp)
set(MESH_UNIT_SUPPORT ${CMAKE_CURRENT_SOURCE_DIR}/unit/fake_rdma.cpp ${CMAKE_CURRENT_SOURCE_DIR}/unit/fifo_pair.cpp)
add_executable(mesh_unit_tests ${MESH_UNIT_TESTS} ${MESH_UNIT_SUPPORT})
target_link_libraries(mesh_unit_tests PRIVATE mesh_core GTest::gtest GTest::gtest_main)
target_compile_definitions(mesh_unit_tests PRIVATE MESH_TESTS_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
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
