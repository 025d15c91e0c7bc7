# SPDX-License-Identifier: Apache-2.0
# Install step: strips each installed binary and keeps its debug info beside it, in the
# place gdb looks without configuration (the .debug subdirectory of the binary's directory,
# found through the .gnu_debuglink section and its CRC):
#   lib/libnccl-net-mesh.so          stripped (symbols needed for dynamic linking only)
#   lib/.debug/libnccl-net-mesh.so.debug
# Runs with MESH_OBJCOPY and MESH_SPLIT_FILES (paths relative to the install prefix) set by
# the install(CODE) line in cmake/install.cmake. The prefix may be a staging directory
# (DESTDIR, CPack): nothing here depends on where the files finally live.
set(prefix "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}")
foreach(rel ${MESH_SPLIT_FILES})
  set(file "${prefix}/${rel}")
  get_filename_component(dir "${file}" DIRECTORY)
  get_filename_component(name "${file}" NAME)
  set(debug "${dir}/.debug/${name}.debug")
  file(MAKE_DIRECTORY "${dir}/.debug")
  foreach(args "--only-keep-debug;${file};${debug}"
               "--strip-unneeded;${file}"
               "--add-gnu-debuglink=${debug};${file}")
    execute_process(COMMAND ${MESH_OBJCOPY} ${args} RESULT_VARIABLE rc ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "objcopy ${args} failed (${rc}): ${err}")
    endif()
  endforeach()
  message(STATUS "Stripped: ${file} (debug info: ${debug})")
endforeach()
