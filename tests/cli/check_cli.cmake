# check_cli.cmake — runs the `ferry` program once and checks its exit status and what it printed.
# cmake -DCLI=<ferry> -DWORK=<scratch dir> -DARGS=<arguments, a ;-list> -DRC=<expected status>
#       -DSTREAM=stdout|stderr -DMATCH=<regex the stream must match> [-DABSENT=<path that must not exist after>]
#       -P check_cli.cmake
# In ARGS and ABSENT, %WORK% is the scratch directory and %FILE% a regular file in it (to name as a directory).
# The program runs with CUDA_VISIBLE_DEVICES=-1, so that on a GPU machine too it finds no device.
cmake_minimum_required(VERSION 3.18)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
file(WRITE "${WORK}/a_file" "")
string(REPLACE "%WORK%" "${WORK}" args "${ARGS}")
string(REPLACE "%FILE%" "${WORK}/a_file" args "${args}")
execute_process(COMMAND ${CMAKE_COMMAND} -E env CUDA_VISIBLE_DEVICES=-1 "${CLI}" ${args} WORKING_DIRECTORY "${WORK}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
string(REPLACE ";" " " shown "${args}")
set(report "ferry ${shown}\nexit status ${rc}\nstdout:\n${stdout}\nstderr:\n${stderr}")
if(NOT rc STREQUAL RC)
  message(FATAL_ERROR "expected exit status ${RC}\n${report}")
endif()
if(NOT ${STREAM} MATCHES "${MATCH}")
  message(FATAL_ERROR "expected ${STREAM} to match '${MATCH}'\n${report}")
endif()
if(STREAM STREQUAL "stderr" AND NOT RC STREQUAL "0" AND NOT stderr MATCHES "^ferry(_[a-z_]+)?: |^usage: ferry")
  message(FATAL_ERROR "an error message must start with the program's name, 'ferry: ' or 'ferry_...: '\n${report}")
endif()
if(ABSENT)
  string(REPLACE "%WORK%" "${WORK}" absent "${ABSENT}")
  if(EXISTS "${absent}")
    message(FATAL_ERROR "${absent} exists after the run\n${report}")
  endif()
endif()
message(STATUS "${report}")
