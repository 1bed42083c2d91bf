// The lock of a checkpoint directory (held by a save) or of a manager's root (held for the
// manager's life): one primitive for both, on a file system or an object store.
//
// On a file system the lock file is opened without following a symlink, must be a regular
// file with one link, and is held by flock(): the kernel releases it when its holder dies, so
// a lock left by a dead process of this host is taken over at once (whatever its pid now
// names), and a live holder the kernel sees is never broken. flock is not seen across hosts on
// every shared file system, so the file's content names the holder (kind, id, host, pid,
// start) and carries a heartbeat the holder renews every lease/4 while it holds the lock: a
// lock of another host whose heartbeat is older than the lease is stale, and the next taker
// breaks it with a warning naming the old holder. A takeover writes in place under the flock
// (nothing is renamed aside and back). Release removes the file under the flock; a taker that
// locked a file unlinked meanwhile finds another inode at the path and tries again.
//
// On an object store (no flock) the lock is an object created only if absent (a conditional
// write); a stale one is deleted and created anew, and the heartbeat rewrites it. Two takers
// racing for one stale lock object can both believe they won: Check(), called before a
// commit, tells the loser.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "dcp/status.h"
#include "storage/file_system.h"

namespace dcp::storage {

inline constexpr double kDefaultLockLeaseSeconds = 300;

struct LockHolder {
  std::string kind;  // what holds it: "save", "manager"
  std::string id;    // unique per acquisition
  std::string host;  // HostName() of the holder
  int64_t pid = 0;
  int64_t started_unix_ms = 0;
  int64_t heartbeat_unix_ms = 0;
  // "<boot id> <pid namespace> <start time>" of the holder's process (ProcessIdentity): on
  // its host, what tells its process from a later one with the same pid, or one a pid
  // namespace hides. Empty in locks of earlier versions.
  std::string process;
};

// The identity (LockHolder::process) of process `pid` as this process sees it now; "" when it
// does not exist (or /proc cannot say).
std::string ProcessIdentity(int64_t pid);

std::string EncodeLockHolder(const LockHolder& holder);
// kDataLoss when `text` is not a lock.
Result<LockHolder> DecodeLockHolder(std::string_view text);
// "save 1a2b of process 42 on host h (started 5 s ago, renewed 1 s ago)".
std::string DescribeLockHolder(const LockHolder& holder);
int64_t NowUnixMs();

struct LockOptions {
  // A holder of another host that has not renewed its heartbeat for this long is gone.
  double lease_seconds = kDefaultLockLeaseSeconds;
  // Take the lock from any holder the kernel does not show alive (a person who knows it is
  // gone; `dcp unlock` does the same by hand).
  bool break_lock = false;
};

class LeaseLock {
 public:
  LeaseLock();
  ~LeaseLock();
  LeaseLock(const LeaseLock&) = delete;
  LeaseLock& operator=(const LeaseLock&) = delete;

  // Takes the lock at `path` for `kind`/`id`, breaking a stale one (see above).
  // kFailedPrecondition naming `what` (e.g. "checkpoint directory D"), the holder and how to
  // proceed when someone else holds it.
  Status Acquire(FileSystem& fs, const std::string& path, const std::string& what,
                 const std::string& kind, const std::string& id, const LockOptions& opts = {});
  // OK while the lock is still this holder's; otherwise why not (removed by `dcp unlock`,
  // broken by another job).
  Status Check();
  // Stops the heartbeat and removes the lock file if it is still this holder's.
  void Release();
  bool held() const;
  // The holder this Acquire broke and why; empty when the lock was free.
  const std::string& broke() const { return broke_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::string broke_;
};

// The holder of the lock at `path`; kNotFound when there is none.
Result<LockHolder> ReadLockHolder(FileSystem& fs, const std::string& path);

// `dcp unlock`: removes the lock at `path` whoever holds it, unless the kernel shows its
// holder alive on this host (kFailedPrecondition). Returns the description of the holder it
// removed; kNotFound when there is no lock.
Result<std::string> BreakLock(FileSystem& fs, const std::string& path);

}  // namespace dcp::storage
