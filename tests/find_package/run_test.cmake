# Installs the dcp build tree into a scratch prefix, then configures, builds and runs the
# consumer project in this directory against it.
#
#   cmake -DDCP_BUILD_DIR=<build> -DCONSUMER_SOURCE_DIR=<this dir> -DWORK_DIR=<scratch>
#         [-DCMAKE_CXX_COMPILER=<c++>] [-DCMAKE_BUILD_TYPE=<type>] -P run_test.cmake
foreach(var DCP_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_test.cmake: ${var} is not set")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
set(consumer "${WORK_DIR}/consumer")

function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "find_package test: ${step} failed (${rc})")
  endif()
endfunction()

run(install "${CMAKE_COMMAND}" --install "${DCP_BUILD_DIR}" --prefix "${prefix}")

# The installed library holds the library layers only: no tooling (bench, simulate, workload,
# test file systems) -- src/layers.txt, kind "tool".
file(GLOB_RECURSE archives "${prefix}/*/libdcp.a")
if(NOT archives)
  message(FATAL_ERROR "find_package test: no libdcp.a installed under ${prefix}")
endif()
# Defined and undefined alike: a library object that only references tooling fails too.
execute_process(COMMAND nm -C ${archives} OUTPUT_VARIABLE symbols
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "find_package test: nm failed on ${archives}")
endif()
string(REGEX MATCHALL "[^\n]*dcp::(bench|simulate|workload|testfs)::[^\n]*" tooling "${symbols}")
if(tooling)
  list(GET tooling 0 first)
  list(LENGTH tooling n)
  message(FATAL_ERROR "find_package test: the installed libdcp.a holds ${n} tooling symbols, "
                      "e.g. ${first}")
endif()

set(configure_args -S "${CONSUMER_SOURCE_DIR}" -B "${consumer}" "-DCMAKE_PREFIX_PATH=${prefix}")
if(DEFINED CMAKE_CXX_COMPILER AND NOT CMAKE_CXX_COMPILER STREQUAL "")
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}")
endif()
if(DEFINED CMAKE_BUILD_TYPE AND NOT CMAKE_BUILD_TYPE STREQUAL "")
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}")
endif()
run(configure "${CMAKE_COMMAND}" ${configure_args})
run(build "${CMAKE_COMMAND}" --build "${consumer}")
run(consumer "${consumer}/consumer")
file(REMOVE_RECURSE "${WORK_DIR}")
