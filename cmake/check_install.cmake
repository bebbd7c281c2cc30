# check_install.cmake — installs the build into a fresh prefix and checks it as a user would find it:
#   MODE=layout        the C library, headers, `ferry`, the CMake package and the pkg-config file are under the
#                      prefix, and nothing else is (the Python extension is pip's to install, not cmake's);
#   MODE=pkgconfig     `pkg-config --cflags --libs ferry` points into the prefix, and examples/transfer.c built
#                      with those flags runs (without a GPU its transfer passes through);
#   MODE=find_package  a CMake project with find_package(ferry) + ferry::ferry finds the prefix's library, builds
#                      examples/transfer.c and runs it.
# cmake -DMODE=... -DBUILD=<build dir> -DSOURCE=<source dir> -DWORK=<scratch dir> -DLIBDIR=<CMAKE_INSTALL_LIBDIR>
#       -DINCLUDEDIR=<CMAKE_INSTALL_INCLUDEDIR> -DBINDIR=<CMAKE_INSTALL_BINDIR> -DTOOLS=ON|OFF -DCC=<C compiler>
#       [-DFLAGS=<compile and link flags, e.g. the sanitizers>] -P check_install.cmake
# A check that cannot run here (no pkg-config) prints "SKIPPED: <why>", which ctest reports as a skip.

cmake_minimum_required(VERSION 3.18)
file(REMOVE_RECURSE "${WORK}")
set(prefix "${WORK}/prefix")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD}" --prefix "${prefix}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install ${BUILD} --prefix ${prefix} failed (${rc}):\n${out}")
endif()
separate_arguments(flags UNIX_COMMAND "${FLAGS}")

# Runs the consumer program and checks that it ran ferry: the example prints one line per tensor.
function(run_consumer exe)
  execute_process(COMMAND ${ARGN} "${exe}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "tensor 0: passed through")
    message(FATAL_ERROR "${exe} exited with ${rc}; stdout:\n${out}\nstderr:\n${err}")
  endif()
endfunction()

# Fails unless `path` lies inside the prefix (after resolving `..` and symbolic links).
function(expect_in_prefix what path)
  get_filename_component(real "${path}" REALPATH)
  get_filename_component(real_prefix "${prefix}" REALPATH)
  string(FIND "${real}/" "${real_prefix}/" at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "${what} is ${path} (${real}), outside the install prefix ${prefix}")
  endif()
endfunction()

if(MODE STREQUAL "layout")
  set(expected "${LIBDIR}/libferry.so" "${LIBDIR}/libferry.a" "${INCLUDEDIR}/ferry.h"
    "${LIBDIR}/cmake/ferry/ferryConfig.cmake" "${LIBDIR}/cmake/ferry/ferryConfigVersion.cmake"
    "${LIBDIR}/cmake/ferry/ferryTargets.cmake" "${LIBDIR}/pkgconfig/ferry.pc")
  if(TOOLS)
    list(APPEND expected "${BINDIR}/ferry")
  endif()
  foreach(f ${expected})
    if(NOT EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "cmake --install did not install ${f}")
    endif()
  endforeach()
  # Top-level entries other than the GNU install directories: a Python package dropped at <prefix>/ferry, say.
  file(GLOB top RELATIVE "${prefix}" "${prefix}/*")
  string(REGEX REPLACE "/.*" "" lib_top "${LIBDIR}")
  string(REGEX REPLACE "/.*" "" include_top "${INCLUDEDIR}")
  string(REGEX REPLACE "/.*" "" bin_top "${BINDIR}")
  list(REMOVE_ITEM top "${lib_top}" "${include_top}" "${bin_top}")
  if(top)
    message(FATAL_ERROR "cmake --install put ${top} at the top of the prefix; the Python package is installed by "
                        "pip (pyproject.toml), not by cmake --install")
  endif()
  file(GLOB_RECURSE extensions "${prefix}/*_ferry*.so")
  if(extensions)
    message(FATAL_ERROR "cmake --install installed the Python extension: ${extensions}")
  endif()
  message(STATUS "install layout: ${expected}")

elseif(MODE STREQUAL "pkgconfig")
  find_program(pkg_config NAMES pkg-config pkgconf)
  if(NOT pkg_config)
    message(STATUS "SKIPPED: no pkg-config on this machine")
    return()
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env "PKG_CONFIG_PATH=${prefix}/${LIBDIR}/pkgconfig"
                          ${pkg_config} --cflags --libs ferry
    RESULT_VARIABLE rc OUTPUT_VARIABLE pc_flags ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config --cflags --libs ferry failed: ${err}")
  endif()
  separate_arguments(pc_list UNIX_COMMAND "${pc_flags}")
  set(dirs 0)
  foreach(f ${pc_list})
    if(f MATCHES "^-[IL](.+)")
      expect_in_prefix("pkg-config's ${f}" "${CMAKE_MATCH_1}")
      math(EXPR dirs "${dirs} + 1")
    endif()
  endforeach()
  if(NOT dirs EQUAL 2)
    message(FATAL_ERROR "pkg-config --cflags --libs ferry gave '${pc_flags}': expected one -I and one -L")
  endif()
  execute_process(COMMAND "${CC}" ${flags} "${SOURCE}/examples/transfer.c" ${pc_list} -o "${WORK}/consumer"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "building examples/transfer.c with '${pc_flags}' failed:\n${out}")
  endif()
  run_consumer("${WORK}/consumer" ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${prefix}/${LIBDIR}")
  message(STATUS "pkg-config: ${pc_flags}")

elseif(MODE STREQUAL "find_package")
  file(WRITE "${WORK}/consumer/CMakeLists.txt" "cmake_minimum_required(VERSION 3.18)
project(ferry_consumer C)
find_package(ferry 0.1 REQUIRED)
add_executable(consumer \"${SOURCE}/examples/transfer.c\")
target_link_libraries(consumer PRIVATE ferry::ferry)
get_target_property(location ferry::ferry LOCATION)
file(WRITE \"\${CMAKE_BINARY_DIR}/ferry_location.txt\" \"\${location}\")
")
  execute_process(COMMAND ${CMAKE_COMMAND} -S "${WORK}/consumer" -B "${WORK}/consumer/build"
                          "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_C_COMPILER=${CC}" "-DCMAKE_C_FLAGS=${FLAGS}"
                          "-DCMAKE_EXE_LINKER_FLAGS=${FLAGS}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configuring a find_package(ferry) project failed:\n${out}")
  endif()
  file(READ "${WORK}/consumer/build/ferry_location.txt" location)
  expect_in_prefix("ferry::ferry's library" "${location}")
  execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK}/consumer/build"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "building against ferry::ferry failed:\n${out}")
  endif()
  run_consumer("${WORK}/consumer/build/consumer")
  message(STATUS "find_package(ferry): ${location}")

else()
  message(FATAL_ERROR "MODE must be layout, pkgconfig or find_package, not '${MODE}'")
endif()
