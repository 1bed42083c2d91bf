// The lock of a checkpoint directory (held by a save) or of a manager's root (held for the
// manager's life): one primitive for both, on a file system or an object store.
//
// On a file system the lock file is opened without following a symlink, must be a regular
// file with one link, and is held by flock(): the kernel releases it when its holder dies, so
// a lock left by a dead process of this host is taken over at once (whatever its pid now
// names), and a live holder the kernel sees is never broken. flock is not seen across hosts on
// every shared file system, so the file's content names the holder (kind, id, host, pid,
// process identity) and carries a heartbeat the holder rewrites every lease/4 while it holds
// the lock. A lock of another host expires when it went a whole lease without a write: on an
// object store by the store's own clock (Date minus Last-Modified of one reply), on a file
// system by watching it here for a lease -- never by comparing the holder's clock with this
// host's. The next taker then breaks it with a warning naming the old holder. A takeover
// writes in place under the flock (nothing is renamed aside and back). Release removes the
// file under the flock; a taker that locked a file unlinked meanwhile finds another inode at
// the path and tries again. A holder that could not rewrite its lock for a lease no longer
// counts it as its own (Check fails).
//
// On an object store, on a file system whose flock fails (ENOLCK: some NFS, FUSE) and where
// DCP_LOCKS_WITHOUT_FLOCK=1 says flock does not reach other hosts (FileSystem::Flocks), every
// change is a compare-and-swap on the version seen (FileSystem::WriteIfVersion; If-None-Match /
// If-Match on S3; an exclusive claim and a rename on POSIX): the lock is created only if
// absent, renewed only over the version its holder wrote, taken over only over the stale
// version judged, removed only while it is the holder's. A lock is its holder's iff it carries
// the holder's id: a write whose reply was lost (the retry is refused) reads back as its own.
// There an empty lock file (left by a taker's open before its flock failed) holds nothing, and
// the lock says `flock no`: a taker of the same host that gets the flock still judges the
// holder by its process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "dcp/status.h"
#include "storage/file_system.h"
#include "storage/lock_holder.h"

namespace dcp::storage {

inline constexpr double kDefaultLockLeaseSeconds = 300;

struct LockOptions {
  // A holder of another host whose lock went this long without a write is gone.
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
