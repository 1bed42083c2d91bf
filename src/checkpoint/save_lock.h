// Ownership of a checkpoint directory during a save (with collectives).
//
// Rank 0 takes `dcp.lock` in the directory (storage::LeaseLock, kind "save", the save's id)
// before any rank writes. Every other rank reads it back after the first exchange: a rank that
// does not find this save's id there does not see the directory rank 0 writes to, and the save
// fails before anything is written or deleted. The lock is removed when the save has committed
// (and cleaned up) or failed. While it is held no other save writes into the directory, so
// every data file that the committed metadata does not name belongs to a dead save and may be
// removed.
#pragma once

#include <cstdint>
#include <string>

#include "dcp/status.h"
#include "storage/file_system.h"
#include "storage/lease_lock.h"

namespace dcp::checkpoint {

inline constexpr std::string_view kLockName = "dcp.lock";

// A fresh nonzero id for a save.
uint64_t RandomSaveId();

// Rank 0: takes `dir`/dcp.lock for save `save_id`.
Status LockForSave(storage::LeaseLock& lock, storage::FileSystem& fs, const std::string& dir,
                   uint64_t save_id, const storage::LockOptions& opts);

// On a rank other than 0: OK when `dir`/dcp.lock records `save_id`; otherwise an error
// saying what this rank sees at that path.
Status CheckSeesLock(storage::FileSystem& fs, const std::string& dir, uint64_t save_id);

}  // namespace dcp::checkpoint
