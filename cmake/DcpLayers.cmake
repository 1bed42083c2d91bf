# One target per layer of src/layers.txt, each seeing only the headers it may include.
#
# The compiler is the enforcer: a layer is compiled against a directory of its own under the
# build tree, holding links to its folder, to the folders of the layers it may include and to
# the public headers (include/dcp/) those layers own -- nothing else. An include across a
# forbidden arrow then fails to compile ("No such file"), and scripts/check_layers.py reports
# the same table without compiling.
#
# Defines, per layer L: an OBJECT library dcp_L (lib layers) or dcp_tool_L (tool layers),
# and DCP_LIB_LAYERS / DCP_TOOL_LAYERS / DCP_CLI_DEPS in the caller's scope.

function(_dcp_link link target)
  file(CREATE_LINK "${target}" "${link}" SYMBOLIC)
endfunction()

# A directory holding `layers` (folders under src/) and, under dcp/, the public headers
# `headers`: the only include root of a target that may use exactly these.
function(dcp_include_view out_dir name layers headers)
  set(dir "${PROJECT_BINARY_DIR}/layer_views/${name}")
  file(REMOVE_RECURSE "${dir}")
  file(MAKE_DIRECTORY "${dir}/dcp")
  foreach(l IN LISTS layers)
    _dcp_link("${dir}/${l}" "${PROJECT_SOURCE_DIR}/src/${l}")
  endforeach()
  foreach(h IN LISTS headers)
    _dcp_link("${dir}/dcp/${h}" "${PROJECT_SOURCE_DIR}/include/dcp/${h}")
  endforeach()
  set(${out_dir} "${dir}" PARENT_SCOPE)
endfunction()

function(dcp_read_layers)
  # Reconfigure when the table changes: the include views are made from it.
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
               "${PROJECT_SOURCE_DIR}/src/layers.txt")
  file(STRINGS "${PROJECT_SOURCE_DIR}/src/layers.txt" lines)
  set(lib_layers "")
  set(tool_layers "")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "#.*" "" line "${line}")  # comments, as scripts/check_layers.py
    if(line MATCHES "^[ \t]*$")
      continue()
    endif()
    string(REGEX MATCHALL "[^ \t]+" words "${line}")
    list(POP_FRONT words name kind)
    # After name and kind: the layers it may include, then the public headers it owns
    # (words ending in .h); "-" stands for none.
    set(deps "")
    set(headers "")
    foreach(w IN LISTS words)
      if(w STREQUAL "-")
        continue()
      elseif(w MATCHES "\\.h$")
        list(APPEND headers "${w}")
      else()
        list(APPEND deps "${w}")
      endif()
    endforeach()
    set(DCP_LAYER_${name}_KIND "${kind}" PARENT_SCOPE)
    set(DCP_LAYER_${name}_DEPS "${deps}" PARENT_SCOPE)
    set(DCP_LAYER_${name}_HEADERS "${headers}" PARENT_SCOPE)
    if(kind STREQUAL "lib")
      list(APPEND lib_layers "${name}")
    elseif(kind STREQUAL "tool")
      list(APPEND tool_layers "${name}")
    elseif(kind STREQUAL "cli" AND name STREQUAL "tools")
      set(DCP_CLI_DEPS "${deps}" PARENT_SCOPE)
    endif()
  endforeach()
  set(DCP_LIB_LAYERS "${lib_layers}" PARENT_SCOPE)
  set(DCP_TOOL_LAYERS "${tool_layers}" PARENT_SCOPE)
endfunction()

# `layers` and every layer they may include, transitively.
function(dcp_layer_closure out layers)
  set(closure "")
  set(todo ${layers})
  while(todo)
    list(POP_FRONT todo l)
    if(NOT l IN_LIST closure)
      list(APPEND closure ${l})
      list(APPEND todo ${DCP_LAYER_${l}_DEPS})
    endif()
  endwhile()
  set(${out} "${closure}" PARENT_SCOPE)
endfunction()

# The public headers a target using `layers` sees: those of the layers and of everything they
# may include, since a public header may include the public headers of the layers below it.
function(dcp_headers_of out layers)
  dcp_layer_closure(closure "${layers}")
  set(headers "")
  foreach(l IN LISTS closure)
    list(APPEND headers ${DCP_LAYER_${l}_HEADERS})
  endforeach()
  set(${out} "${headers}" PARENT_SCOPE)
endfunction()

# OBJECT library `target` from src/<layer>/ (tests and, without MPI, comm/mpi excluded).
function(dcp_add_layer target layer)
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/${layer}/*.cc")
  list(FILTER sources EXCLUDE REGEX "_test\\.cc$")
  if(NOT DCP_WITH_MPI)
    list(FILTER sources EXCLUDE REGEX "/comm/mpi/")
  endif()
  set(visible ${layer} ${DCP_LAYER_${layer}_DEPS})
  dcp_headers_of(headers "${visible}")
  dcp_include_view(view ${layer} "${visible}" "${headers}")
  add_library(${target} OBJECT ${sources})
  target_include_directories(${target} PRIVATE "${view}")
  target_link_libraries(${target} PRIVATE Threads::Threads nlohmann_json::nlohmann_json
                        PkgConfig::XXHASH)
  if(layer STREQUAL "storage")
    target_link_libraries(${target} PRIVATE ${DCP_S3_LIBS})
  endif()
  if(DCP_WITH_MPI)
    target_link_libraries(${target} PRIVATE MPI::MPI_CXX)
    target_compile_definitions(${target} PRIVATE DCP_WITH_MPI=1)
  endif()
endfunction()
