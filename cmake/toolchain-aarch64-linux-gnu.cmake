# SPDX-License-Identifier: Apache-2.0
# Cross toolchain for aarch64 (DGX Spark's GB10 / Grace cores) on a Debian/Ubuntu x86_64
# host with arm64 multiarch packages (scripts/setup.sh installs them):
#   g++-aarch64-linux-gnu, libibverbs-dev:arm64, libgtest-dev:arm64, libstdc++6:arm64,
#   qemu-user-static.
# No sysroot: multiarch puts the arm64 headers and libraries under /usr, next to the
# host's, so CMAKE_LIBRARY_ARCHITECTURE is what keeps the two apart.
#
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64-linux-gnu.cmake \
#         -DMESH_BUILD_TESTS=ON
#   ctest --test-dir build-arm64 -L arm64     (runs the binaries under qemu-aarch64)
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(MESH_CROSS_TRIPLE aarch64-linux-gnu)

set(CMAKE_C_COMPILER ${MESH_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${MESH_CROSS_TRIPLE}-g++)
set(CMAKE_LIBRARY_ARCHITECTURE ${MESH_CROSS_TRIPLE})

# Only arm64 libraries and packages: never let find_library or find_package fall back to
# the host's x86_64 copies in /usr/lib/x86_64-linux-gnu.
set(CMAKE_FIND_ROOT_PATH /usr/${MESH_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu
                      /usr/lib/x86_64-linux-gnu/cmake)

# ctest runs every target binary through user-mode QEMU, with the host's own root as the
# aarch64 root: the multiarch packages (libc6:arm64, libstdc++6:arm64, libibverbs1:arm64 and
# its rxe provider) put /lib/ld-linux-aarch64.so.1 and the arm64 libraries there.
# Not `-L /usr/aarch64-linux-gnu`: that takes ld.so from the cross toolchain's libc6-arm64-cross
# while libc.so.6 still resolves to libc6:arm64, and when the two glibc builds differ (Debian
# 12: 2.36-8cross1 and 2.36-9+deb12u14) the first pthread_create spins forever.
find_program(MESH_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(MESH_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${MESH_QEMU_AARCH64} -L /)
endif()
