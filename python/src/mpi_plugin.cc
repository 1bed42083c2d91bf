// hyperdcp/_dcp_mpi.so: the MPI backend as a plugin of the extension (see mpi_plugin.h).
#include "mpi_plugin.h"

#include <cstdio>
#include <exception>
#include <memory>

#include "dcp/mpi_comm.h"
#include "dcp/status.h"

extern "C" __attribute__((visibility("default"))) int hyperdcp_mpi_comm_v1(int64_t fortran_handle,
                                                                           void** out, char* error,
                                                                           size_t error_size) {
  try {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      throw dcp::Error(dcp::FailedPrecondition(
          "mpi_comm: MPI is not initialized in this process (import mpi4py.MPI first)"));
    }
    std::shared_ptr<dcp::Comm> comm =
        dcp::MpiComm(MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle)));
    *out = new std::shared_ptr<dcp::Comm>(std::move(comm));
    return 0;
  } catch (const dcp::Error& e) {
    std::snprintf(error, error_size, "%s", e.what());
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::snprintf(error, error_size, "%s", e.what());
    return static_cast<int>(dcp::StatusCode::kInternal);
  }
}
