// What a lock file says about its holder, and what this host can tell about that holder.
//
// The file names the holder (kind, id, host, pid, start, process identity) and carries a
// heartbeat time the holder rewrites while it holds the lock. The times are the holder's
// clock: they are shown to people and used to refuse early, never to decide that a lock of
// another host expired (lease_lock.cc judges that by time observed here, or by the store's
// own clock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dcp/status.h"

namespace dcp::storage {

// A lock file is a few lines; anything longer is not one (and is never read whole).
inline constexpr size_t kMaxLockBytes = 4096;

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
  // Whether the holder holds the file's flock too (false: an object store, a file system
  // without flock, DCP_LOCKS_WITHOUT_FLOCK): a free kernel lock then says nothing.
  bool flock = true;
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
// Whole seconds of `ms` (negative: 0), for messages.
inline std::string Seconds(int64_t ms) { return std::to_string(ms > 0 ? ms / 1000 : 0); }

// Whether this process can judge `holder`'s process: same host name, same kernel (boot id) and
// pid namespace. Then GoneHere says why it is gone, or "" while it lives; `kernel_lock`: the
// caller holds the file's flock, so no live process of this kernel holds it by flock (a holder
// that takes none, `flock no`, is still judged by its process).
bool JudgedHere(const LockHolder& holder);
std::string GoneHere(const LockHolder& holder, bool kernel_lock);

}  // namespace dcp::storage
