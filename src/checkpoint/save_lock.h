// Ownership of a checkpoint directory during a save (with collectives).
//
// Rank 0 creates `dcp.lock` in the directory with O_EXCL before any rank writes; it records
// the host, pid, save id and creation time. Every other rank reads it back after the first
// exchange: a rank that does not find this save's id there does not see the directory rank 0
// writes to, and the save fails before anything is written or deleted. The lock is removed
// when the save has committed (and cleaned up) or failed.
//
// A lock of a dead process on this host (its pid is gone, or, in this process, its save has
// returned) is stale and taken over; a lock of a live process, or of another host (whose
// processes cannot be checked from here), makes the save fail with kFailedPrecondition
// naming the directory, the holder and the lock's age. While the lock is held no other
// save writes into the directory, so every data file that the committed metadata does not
// name belongs to a dead save and may be removed.
#pragma once

#include <cstdint>
#include <string>

#include "dcp/status.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

inline constexpr std::string_view kLockName = "dcp.lock";

struct LockInfo {
  std::string host;
  int64_t pid = 0;
  uint64_t save_id = 0;
  int64_t created_unix_s = 0;
};

std::string EncodeLockInfo(const LockInfo& info);
// Fails with kDataLoss on a malformed lock file.
Result<LockInfo> DecodeLockInfo(std::string_view text);
// This host's name as the lock records it.
std::string LockHostName();
// A fresh nonzero id for a save (or any holder of a SaveLock).
uint64_t RandomSaveId();

// The lock of one save, held by rank 0; released (the file removed, if it is still ours)
// on destruction.
class SaveLock {
 public:
  SaveLock() = default;
  ~SaveLock() { Release(); }
  SaveLock(const SaveLock&) = delete;
  SaveLock& operator=(const SaveLock&) = delete;

  // Creates `dir`/dcp.lock for `save_id`, taking over a stale one.
  Status Acquire(storage::FileSystem& fs, const std::string& dir, uint64_t save_id);
  void Release();
  bool held() const { return fs_ != nullptr; }

 private:
  storage::FileSystem* fs_ = nullptr;
  std::string path_;
  uint64_t save_id_ = 0;
};

// On a rank other than 0: OK when `dir`/dcp.lock records `save_id`; otherwise an error
// saying what this rank sees at that path.
Status CheckSeesLock(storage::FileSystem& fs, const std::string& dir, uint64_t save_id);

}  // namespace dcp::checkpoint
