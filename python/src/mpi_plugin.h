// What crosses between the extension hyperdcp._dcp and the MPI plugin hyperdcp/_dcp_mpi.so.
//
// The extension must import on machines without Open MPI, so it links no MPI library; the
// plugin holds the MPI backend (linked against libmpi) and is loaded with dlopen the first
// time an mpi4py communicator is passed. One C entry point crosses: it returns the backend as
// a heap-allocated std::shared_ptr<dcp::Comm>, which the extension adopts. The Comm object is
// used only through its virtual interface (include/dcp/comm.h), the same header and compiler
// on both sides; the plugin is never unloaded, so its code outlives every object it made.
#pragma once

#include <cstddef>
#include <cstdint>

#define HYPERDCP_MPI_PLUGIN_ENTRY "hyperdcp_mpi_comm_v1"

extern "C" {
// On success returns 0 and sets *out to a `new std::shared_ptr<dcp::Comm>` over a duplicate of
// the communicator with Fortran handle `fortran_handle` (mpi4py: comm.py2f()). On failure
// returns the dcp::StatusCode and writes a message into `error` (NUL-terminated).
using HyperdcpMpiCommFn = int (*)(int64_t fortran_handle, void** out, char* error,
                                  size_t error_size);
}
