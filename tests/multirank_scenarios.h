// Multi-rank save/load scenarios, written once and run two ways: ranks as threads
// (multirank_test.cc, fast) and ranks as real processes under mpirun (mpi/save_mpi_test.cc).
// Every rank of `comm` calls the same scenario with the same `dir`; assertions are gtest's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dcp/comm.h"

namespace dcp::testing {

// Saves the small Qwen3-shaped model under `save_layout` (its world size must equal the
// comm's), checks dedup (metadata bytes = unique bytes, each rank's bytes_written sums to
// it), writer balance, the plan cache hit on a second save, then loads it under every
// layout of `load_layouts` on the first W ranks (W = that layout's world size, through a
// subgroup) and checks every byte.
void SaveThenReshard(const std::shared_ptr<Comm>& comm, const std::string& dir,
                     const std::string& save_layout, const std::vector<std::string>& load_layouts);

// An uneven layout: tensors whose split leaves an empty last shard, replicated over 2.
void SaveUnevenTensors(const std::shared_ptr<Comm>& comm, const std::string& dir);

// Rank `failing` cannot write: every rank's save fails naming that rank, no metadata is
// committed, and the previous checkpoint in `dir` stays the one that loads.
void OneRankFailsToWrite(const std::shared_ptr<Comm>& comm, const std::string& dir, int failing);

// Saving through the shared-filesystem coordinator gives the same checkpoint (chunks,
// writers, checksums) as saving through `comm`.
void FileCoordinatorMatches(const std::shared_ptr<Comm>& comm, const std::string& dir);

// Without collectives each rank writes its own metadata; load merges them.
// Issue 11 item 2: each rank is given its own directory `dir`/n<rank>/ckpt (as with
// node-local disks, or one relative path from different working directories): every rank
// fails with one error naming ranks 1.. and their paths, and no data file is written.
void RanksSeeDifferentDirectories(const std::shared_ptr<Comm>& comm, const std::string& dir);

void SaveWithoutCollectives(const std::shared_ptr<Comm>& comm, const std::string& dir);

}  // namespace dcp::testing

namespace dcp::testing {

// Async save while training: three consecutive async saves through one AsyncSaver; right
// after each Save returns the caller overwrites its tensors and bytes entries and runs
// training-like steps with its own AllGather and Broadcast on `comm` while the save persists.
// Every checkpoint loads and holds the values of staging time; the staging pool is allocated
// by the first save only.
void AsyncSaveWhileTraining(const std::shared_ptr<Comm>& comm, const std::string& dir);

// An async save whose writes fail on rank `failing` reports the error, naming that rank, on
// every rank's handle; no metadata is committed and the previous checkpoint still loads. A
// staging failure on that rank (its saver's memory cap too small) reaches every rank too, and
// the saver keeps working afterwards.
void AsyncSaveOneRankFails(const std::shared_ptr<Comm>& comm, const std::string& dir, int failing);

// Async save coordinated through the shared filesystem (FileComm) gives a loadable checkpoint.
void AsyncSaveThroughFileCoordinator(const std::shared_ptr<Comm>& comm, const std::string& dir);

}  // namespace dcp::testing

namespace dcp::testing {

// Read-once broadcast: saves under `save_layout`, loads under `load_layout` (same world
// size) with broadcast off and on, checks every byte both times, that broadcast never reads
// more from storage, and (same layout, pure replication) that storage bytes read across all
// ranks equal the unique bytes exactly. A second load reuses the group communicators.
void BroadcastLoad(const std::shared_ptr<Comm>& comm, const std::string& dir,
                   const std::string& save_layout, const std::string& load_layout);

// More shards than the in-flight limit, with batching off and with tiny batches.
void BroadcastManyInFlight(const std::shared_ptr<Comm>& comm, const std::string& dir);

// Shared shards cut into slabs (a small LoadOptions::broadcast_slab_bytes), each read by
// one member and broadcast: saved tp<N>, loaded dp<N>, with checksums on (slabs end only
// between stored chunks) and off (anywhere):
// every byte checked, storage bytes read job-wide equal the unique bytes, and the largest
// reader is within 1.2x the mean and no larger than without slabs.
void BroadcastSlabs(const std::shared_ptr<Comm>& comm, const std::string& dir);

// A corrupted stored chunk read by a broadcast reader fails the load on every rank, naming
// the file and the fqn, without a hang.
void BroadcastReadFailure(const std::shared_ptr<Comm>& comm, const std::string& dir);

}  // namespace dcp::testing

namespace dcp::testing {

// A HuggingFace directory (written by `dcp convert --to hf` from the small model) loaded
// straight into a TP layout on every rank, broadcast off and on: every byte checked, and
// with broadcast on the storage bytes read across ranks equal the unique bytes.
void HuggingFaceDirectLoad(const std::shared_ptr<Comm>& comm, const std::string& dir);

}  // namespace dcp::testing

namespace dcp::testing {

// Under mpirun -np 4 with DCP_HOST_ID making ranks {0,1} and {2,3} two hosts: replicas within
// a host read through the page cache (no broadcast), replicas across hosts are broadcast.
void HostAwareBroadcast(const std::shared_ptr<Comm>& comm, const std::string& dir);

// Across `hosts` real hosts (ctest mpi.hosts: each rank's gethostname, no DCP_HOST_ID), the
// same number of ranks R on each, placed host by host. Saved and loaded as dp<hosts>,tp<R>
// (every piece replicated across hosts): each stored byte is read once from storage, by all
// ranks together, and broadcast to the other hosts. Saved and loaded as tp<hosts>,dp<R>
// (replicas within a host): only the tensors every rank holds cross hosts. Rank 0 prints the
// host of every rank and the bytes read, unique, sent and received.
void RealHostsBroadcast(const std::shared_ptr<Comm>& comm, const std::string& dir, int hosts);

}  // namespace dcp::testing

namespace dcp::testing {

// Incremental saves: step_1 full; step_2 with step_1 as base after half the tensors changed;
// step_3 with step_2 as base after a quarter changed again. The ranks together write exactly
// the changed chunks (and the bytes entries), references resolve to the directory holding the
// bytes (tensors unchanged since step_1 point at step_1, not at step_2), every step loads with
// the values of its time under another layout, verify passes, and a flipped byte in a base
// file fails verify of the referring step naming the base's file.
void IncrementalSaves(const std::shared_ptr<Comm>& comm, const std::string& dir,
                      const std::string& save_layout, const std::string& load_layout);

}  // namespace dcp::testing
