// The comm conformance suite, written once and run two ways: every in-process backend (local,
// threads, file) at several world sizes with ranks as threads (src/comm/comm_test.cc), and the
// MPI backend with real processes under mpirun (mpi/comm_mpi_test.cc).
//
// Each check is what ONE rank does: every rank of `c` calls the same check, in the same order
// as the other checks. Assertions are gtest's; a rank that fails an ASSERT returns early and
// the others then fail at their next collective after `c.timeout()`, never hang.
//
// Checks marked "needs size >= 2" are skipped by the runners in a world of one. Checks marked
// "one rank absent" leave rank size-1 out of a collective: call them on a fresh communicator
// with a short timeout and use it for nothing else afterwards (MPI cannot cancel a collective).
#pragma once

#include <string>
#include <string_view>

#include "dcp/comm.h"

#define DCP_ASSERT_OK(expr)                                  \
  do {                                                       \
    const ::dcp::Status dcp_test_s_ = (expr);                \
    ASSERT_TRUE(dcp_test_s_.ok()) << dcp_test_s_.ToString(); \
  } while (0)

namespace dcp::testing {

// A payload whose bytes depend on position and seed, so misplaced chunks are caught.
std::string Pattern(size_t size, int seed);

// rank() and size() agree with the other ranks (ranks 0..size-1, each once), size() is
// `expected_size` and backend() is `expected_backend`.
void CheckRankAndSize(Comm& c, int expected_size, std::string_view expected_backend);

// AllGather returns every rank's contribution (of different lengths) in rank order.
void CheckAllGatherIsInRankOrder(Comm& c);

// Gather to the last rank: it receives all contributions in rank order, the others nothing.
void CheckGatherToNonZeroRoot(Comm& c);

// A root outside [0, size) is kInvalidArgument, for Gather and Broadcast.
void CheckGatherRejectsBadRoot(Comm& c);

// Broadcast of an empty string over stale data, then of 3 MiB over a short string.
void CheckBroadcastEmptyAndLarge(Comm& c);

// Two IBroadcasts in flight from different roots, one waited for and one polled with Test();
// Wait() again after completion; a zero-length IBroadcast.
void CheckIBroadcastPipelined(Comm& c);

// IAllGatherV of scattered ranges of different sizes per rank (empty, packed, large, a rank
// sending nothing), in flight with an IBroadcast and polled with Test(); a wrong number of
// lists is kInvalidArgument.
void CheckIAllGatherVScattered(Comm& c);

// IScatterV from the last rank of one buffer's scattered, overlapping ranges: each member
// receives its own part (empty for one member, over Comm::kInPlaceBytes for another) into
// ranges of other sizes than the root's, polled with Test(); the root's own ranges are not
// touched; a part list of the wrong length is kInvalidArgument.
void CheckIScatterVParts(Comm& c);

// Five rounds of: leave a mark in `shared_dir` (a directory every rank sees, e.g. one host's
// /tmp), Barrier, see every rank's mark of this round and none of the next, Barrier.
void CheckBarrierSeparatesPhases(Comm& c, const std::string& shared_dir);

// `rounds` AllGather, Gather, Broadcast and Barrier calls in turn, roots rotating: each returns
// its own call's data.
void CheckManyConsecutiveCollectivesDoNotMix(Comm& c, int rounds = 300);

// Groups of ranks of equal parity ((0,2) and (1,3) at size 4) used interleaved with `c`; the
// same member list again gives an independent communicator; the world as a group; member lists
// that are out of range or lack the caller are kInvalidArgument.
void CheckCreateGroupInterleaved(Comm& c);

// AgreeOnStatus: OK when all are OK; one failing rank's status reaches every rank, prefixed
// with its rank (unless size is 1).
void CheckAgreeOnStatusSpreadsOneFailure(Comm& c);

// One rank absent, needs size >= 2: the others' Barrier fails with kDeadlineExceeded naming
// the operation, after about c.timeout() (not before, and not hanging).
void CheckBarrierTimesOutWhenOneRankIsAbsent(Comm& c);

// One rank absent, needs size >= 2: it is the root of a Broadcast the others wait for; they fail
// with kDeadlineExceeded naming the operation.
void CheckBroadcastTimesOutWhenRootIsAbsent(Comm& c);

// One rank absent, needs size >= 2: the others' AllGather times out naming the operation and
// the absent rank. Not for MPI here (the absent rank could not join the abandoned AllGather
// later); mpi.hangs checks MPI's naming with a stopped process.
void CheckTimeoutNamesOperationAndMissingRank(Comm& c);

// Needs size >= 2, a short timeout and a fresh communicator: rank 0 calls AllGather while the
// others call Barrier; every rank fails (mismatch or timeout) naming the other operation,
// instead of mixing data or hanging. Not for MPI, where mismatched collectives are undefined.
void CheckMismatchedCollectivesFail(Comm& c);

}  // namespace dcp::testing
