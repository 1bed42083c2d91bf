// The MPI comm backend (Open MPI): the real multi-process, multi-node engine. Available when
// dcp is built with MPI (DCP_WITH_MPI).
//
// MPI's blocking collectives cannot time out, so every collective is issued in its
// non-blocking form and polled until it completes or `timeout()` passes. The timeout error names
// the ranks that did not arrive: the rank that timed out asks every other rank which call it
// waits in (ranks answer while they wait for a collective of this communicator; a rank
// stopped, busy outside dcp, or waiting elsewhere stays silent), and names those that do not
// answer.
//
// MPI cannot cancel a collective: after a timeout the communicator refuses further calls
// (kFailedPrecondition) and the job must end. Buffers of a timed-out operation stay allocated
// until exit, since MPI may still write into them. Two consequences:
// - Broadcasts into the caller's memory (IBroadcast, used by load for single-shard broadcasts):
//   if any MPI communicator fails while one is in flight, the process prints the error and
//   aborts the job (MPI_Abort) instead of returning, because MPI could write into that memory
//   after load returned. So no MPI write into caller memory ever happens after load returns.
// - At exit, MPI initialized by EnsureMpiInitialized is finalized only when nothing dcp
//   abandoned is still pending; otherwise MPI_Finalize could wait forever for a stopped peer,
//   and the job is aborted (MPI_Abort) so that mpirun returns. A caller that initialized MPI
//   itself should do the same: after a dcp timeout, call MPI_Abort rather than MPI_Finalize.
#pragma once

// The MPI-2 C++ bindings (removed in MPI-3) only add warnings; dcp uses the C API.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <memory>

#include "dcp/comm.h"

namespace dcp {

// A Comm over a duplicate of `comm` (MPI_Comm_dup), so dcp's messages never match the
// caller's; the duplicate is freed on destruction, MPI itself is left to its owner. MPI must be
// initialized (see EnsureMpiInitialized); throws dcp::Error otherwise or if MPI_Comm_dup fails.
// Use one thread at a time per Comm; with MPI_THREAD_MULTIPLE, different Comms may be used by
// different threads.
std::shared_ptr<Comm> MpiComm(MPI_Comm comm = MPI_COMM_WORLD);

// Initializes MPI asking for MPI_THREAD_MULTIPLE (async save needs it: its persisting thread
// runs collectives while the caller runs its own) unless it already is; in that case it also
// finalizes MPI at exit. MPI initialized by the caller is never finalized by dcp; an async save
// over MPI initialized below MPI_THREAD_MULTIPLE fails with a clear error (Comm::
// CheckConcurrentUse). Throws dcp::Error if MPI was already finalized or cannot be initialized.
void EnsureMpiInitialized(int* argc, char*** argv);

}  // namespace dcp
