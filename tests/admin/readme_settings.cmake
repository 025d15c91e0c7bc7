# SPDX-License-Identifier: Apache-2.0
# The README's settings table is nccl-mesh-info --settings (the code's table, src/config/config.cpp):
# every row the tool prints must be in README.md, word for word.
#   cmake -DINFO=<nccl-mesh-info> -DREADME=<README.md> -P readme_settings.cmake
execute_process(COMMAND ${INFO} --settings OUTPUT_VARIABLE table RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${INFO} --settings exited ${rc}")
endif()
file(READ ${README} readme)
string(REPLACE "\n" ";" lines "${table}")
set(missing 0)
foreach(line IN LISTS lines)
  if(line MATCHES "^\\| `")
    string(FIND "${readme}" "${line}" at)
    if(at EQUAL -1)
      message(SEND_ERROR "README.md lacks this row of nccl-mesh-info --settings (paste the tool's table):\n${line}")
      math(EXPR missing "${missing} + 1")
    endif()
  endif()
endforeach()
if(missing EQUAL 0)
  message(STATUS "README settings table: every row of nccl-mesh-info --settings is there")
endif()
