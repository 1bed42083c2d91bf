// Whole files moved between ranks over the job's communicator: the memory tier's replication
// after a save, and its restore's fetches of files a host lacks.
//
// Each transfer travels over a communicator of its two ranks (Comm::CreateGroup, created once
// and kept), in pieces broadcast from sender to receiver. Every rank walks the same transfer
// list in one global order (piece number, transfer) with a bounded window of pieces in flight,
// so the oldest unfinished piece always has both ends posted: no cycle of waits, whatever the
// pattern. Memory: the window's pieces per rank. The receiver writes `<file>.part`, checking
// each piece as it arrives (the caller's `check`: the format's block checksums), and renames
// it into place; a read or write failure on one rank does not stop the protocol (peers wait on
// its pieces: a sender that cannot read its file sends zeros), it is returned once every piece
// was exchanged.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dcp/comm.h"
#include "storage/chunk_reader.h"
#include "storage/file_system.h"
#include "tier/tier_plan.h"

namespace dcp::tier {

// The two-rank communicators of a world communicator, created collectively by their members
// in the order the transfer lists name them; every rank sees the same lists, so the members of
// a pair always agree on whether it exists.
class PairGroups {
 public:
  explicit PairGroups(std::shared_ptr<Comm> world) : world_(std::move(world)) {}
  Comm& world() { return *world_; }
  // Creates the groups of `transfers` this rank belongs to that it has not created yet.
  Status Ensure(const std::vector<Transfer>& transfers);
  // The group of ranks a and b (created by Ensure).
  Comm& Of(int a, int b);

 private:
  std::shared_ptr<Comm> world_;
  std::map<std::pair<int, int>, std::shared_ptr<Comm>> groups_;
};

struct TransferOptions {
  uint64_t piece_bytes = uint64_t{8} << 20;
  int window = 4;  // pieces in flight per rank
  // Sending pace per rank, bytes per second; 0: as fast as the link goes.
  uint64_t max_bytes_per_second = 0;
};

struct TransferStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;  // by the network
  uint64_t bytes_copied_from_storage = 0;
  uint64_t files_received = 0;  // from peers and from storage
  uint64_t files_from_storage = 0;
  // This rank's first storage failure (reading a file it sends, writing or checking one it
  // receives), and the transfers it could not receive.
  Status local_failure;
  struct Failed {
    Transfer transfer;
    // The sender's copy is bad: bytes that arrived and failed their checksums, or a file the
    // sender could not read. Otherwise the receiver failed (its disk), which condemns no copy.
    bool damaged = false;
  };
  std::vector<Failed> failed;
  // Sparse copies received (Transfer::spans), by name: for one load, removed after it.
  std::vector<std::string> sparse_files;
};

// Beside a sparse copy `file`: the marker saying it is not a copy of the file.
std::string SparseMarkerName(const std::string& file);

// What checks a transfer's bytes as they arrive (in file order, before the file takes its name,
// without reading it back), or why it cannot be received at all.
using CheckReceived = std::function<Result<storage::StreamVerifier>(const Transfer&)>;

// Where this rank reads and writes the files of one transfer list.
struct TransferDirs {
  storage::FileSystem* local_fs = nullptr;
  std::string local_dir;  // this rank's host directory of the step: read when sending, written
                          // when receiving
  storage::FileSystem* storage_fs = nullptr;
  std::string storage_dir;  // the durable step directory (kFromStorage transfers)
};

// Moves every transfer of `transfers` (the same list on every rank of groups.world()) that
// involves this rank (its spans only, when it has some: the receiver writes a sparse copy);
// every received file with bytes to move is checked by `check` before it takes its name. Returns
// a communication failure (the job's communicator is then unusable); storage failures are in
// stats->local_failure and stats->failed (on the receiver and, for a file it could not read, on
// the sender), naming the file and the peer.
Status TransferFiles(PairGroups& groups, const std::vector<Transfer>& transfers,
                     const TransferDirs& dirs, const TransferOptions& opts,
                     const CheckReceived& check, TransferStats* stats);

// Copies `from` (on from_fs) to `to` (on to_fs) in bounded pieces, durable on return; with
// `verify`, every piece read passes through it first (a mismatch fails the copy).
Status CopyFile(storage::FileSystem& from_fs, const std::string& from, storage::FileSystem& to_fs,
                const std::string& to, uint64_t piece_bytes = uint64_t{8} << 20,
                storage::StreamVerifier* verify = nullptr);

}  // namespace dcp::tier
