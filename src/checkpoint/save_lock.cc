#include "checkpoint/save_lock.h"

#include <chrono>
#include <random>

#include "checkpoint/names.h"

namespace dcp::checkpoint {

uint64_t RandomSaveId() {
  std::random_device rd;
  uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  id ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return id == 0 ? 1 : id;
}

Status LockForSave(storage::LeaseLock& lock, storage::FileSystem& fs, const std::string& dir,
                   uint64_t save_id, const storage::LockOptions& opts) {
  const std::string path = storage::JoinPath(dir, std::string(kLockName));
  Status s =
      lock.Acquire(fs, path, "checkpoint directory " + dir, "save", SaveIdHex(save_id), opts);
  if (s.code() == StatusCode::kFailedPrecondition) {
    return FailedPrecondition(s.message() +
                              ". Two saves into one directory would destroy each other's files.");
  }
  return s;
}

Status CheckSeesLock(storage::FileSystem& fs, const std::string& dir, uint64_t save_id) {
  const std::string path = storage::JoinPath(dir, std::string(kLockName));
  auto holder = storage::ReadLockHolder(fs, path);
  if (!holder.ok()) {
    return FailedPrecondition(path + " is missing or unreadable here (" +
                              holder.status().message() + ")");
  }
  if (holder->id != SaveIdHex(save_id)) {
    return FailedPrecondition(path + " here belongs to " + holder->kind + " " + holder->id +
                              ", not to this save " + SaveIdHex(save_id));
  }
  return OkStatus();
}

}  // namespace dcp::checkpoint
