# SPDX-License-Identifier: Apache-2.0
# What `cmake --install` puts where, and the packages `cpack` builds from it (included by
# CMakeLists.txt once the plugin and tool targets exist).
#
#   <prefix>/lib/libnccl-net-mesh.so           stripped; debug info in lib/.debug/
#   <prefix>/bin/nccl-mesh-info, nccl-mesh-perf stripped; debug info in bin/.debug/
#   <prefix>/share/doc/nccl-mesh/               README.md, CHANGELOG.md, LICENSE, docs/*.md
#   <prefix>/share/nccl-mesh/plot-perf.py       optional PNG plot of nccl-mesh-perf's CSV
#
# cpack (run in the build tree) writes nccl-mesh_<version>_<arch>.deb (files under /usr)
# and nccl-mesh-<version>-Linux.tar.gz (a relocatable tree: unpack anywhere).

install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/CHANGELOG.md
              ${PROJECT_SOURCE_DIR}/LICENSE
        DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/nccl-mesh)
# The README links into docs/ (the DGX Spark guide, the relay in full, ...): beside it, so the
# links hold in the installed tree too.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/nccl-mesh/docs
        FILES_MATCHING PATTERN "*.md")
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/plot-perf.py
        DESTINATION ${CMAKE_INSTALL_DATADIR}/nccl-mesh)

# --- stripped binaries, debug info split out (gdb finds it through .gnu_debuglink) ------
option(MESH_SPLIT_DEBUG "Install stripped binaries with their debug info in .debug/ beside them" ON)
if(MESH_SPLIT_DEBUG AND NOT CMAKE_OBJCOPY)
  message(WARNING "objcopy not found (binutils): installing unstripped binaries")
endif()
if(MESH_SPLIT_DEBUG AND CMAKE_OBJCOPY)
  set(mesh_split_files ${CMAKE_INSTALL_LIBDIR}/$<TARGET_FILE_NAME:nccl-net-mesh>)
  foreach(tool ${MESH_TOOLS})
    list(APPEND mesh_split_files ${CMAKE_INSTALL_BINDIR}/$<TARGET_FILE_NAME:${tool}>)
  endforeach()
  install(CODE "set(MESH_OBJCOPY \"${CMAKE_OBJCOPY}\")
set(MESH_SPLIT_FILES \"${mesh_split_files}\")
include(\"${PROJECT_SOURCE_DIR}/cmake/split_debug.cmake\")")
endif()

# --- cpack: a .deb and a .tar.gz ------------------------------------------------------------
set(CPACK_PACKAGE_NAME nccl-mesh)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "The nccl-mesh authors")
set(CPACK_PACKAGE_CONTACT "The nccl-mesh authors")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "NCCL network plugin for switchless RoCEv2 meshes (every cable its own subnet)")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_GENERATOR "DEB;TGZ")
set(CPACK_STRIP_FILES OFF)  # done above, keeping the debug info
# The tarball names its machine (nccl-mesh-0.1.0-Linux-x86_64.tar.gz, -Linux-aarch64): with
# CPack's default (-Linux) an x86-64 and an aarch64 tarball had one name, and one unpacked on
# the other machine makes NCCL's dlopen fail ("wrong ELF class") and NCCL quietly fall back.
set(CPACK_SYSTEM_NAME Linux-${CMAKE_SYSTEM_PROCESSOR})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
# CPack asks `dpkg --print-architecture`, which names the build machine: a cross build for
# aarch64 (cmake/toolchain-aarch64-linux-gnu.cmake) must say arm64 itself.
if(CMAKE_CROSSCOMPILING AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$")
  set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE arm64)
endif()
# The plugin dlopen()s libibverbs at run time (no link-time dependency); without it the
# plugin reports zero devices, so it is recommended rather than required.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libibverbs1, ibverbs-providers")
# Dependencies from the binaries (dpkg-shlibdeps, which CPack runs through `file`); without
# those tools, the same packages unversioned.
find_program(MESH_DPKG_SHLIBDEPS dpkg-shlibdeps)
find_program(MESH_FILE_TOOL file)
if(MESH_DPKG_SHLIBDEPS AND MESH_FILE_TOOL)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
else()
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6, libstdc++6, libgcc-s1")
endif()
set(CPACK_SOURCE_IGNORE_FILES "/build[^/]*/;/\\\\.git/")
include(CPack)
