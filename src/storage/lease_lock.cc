#include "storage/lease_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>

#include "core/host_name.h"

namespace dcp::storage {
namespace {

// A lock as read: its text, a version that changes with every write (the object's ETag; the
// text itself on a file), and its age by the store's clock when the store tells it.
using Seen = FileSystem::Versioned;

// The lock at `path` through `fs`, refused when longer than a lock can be.
Result<Seen> ReadLock(FileSystem& fs, const std::string& path) {
  auto v = fs.ReadVersioned(path, kMaxLockBytes);
  if (!v.ok() && v.status().code() == StatusCode::kDataLoss) {
    return DataLoss(path + " is not a dcp lock (too large)");
  }
  return v;
}

// The holder in `text`; a file that is no lock is judged by its modification time.
LockHolder HolderOf(std::string_view text, int64_t mtime_ms) {
  auto h = DecodeLockHolder(text);
  if (h.ok()) return *h;
  LockHolder unknown;
  unknown.kind = "unreadable lock";
  unknown.started_unix_ms = unknown.heartbeat_unix_ms = mtime_ms;
  return unknown;
}

using ReadSeen = std::function<Result<Seen>()>;

std::string LeaseText(const LockOptions& opts) {
  return Seconds(static_cast<int64_t>(opts.lease_seconds * 1000));
}

// Why `h`, holding the lock `seen`, no longer does, or "" when it may. `kernel_lock`: this
// taker holds the file's flock, so no live process of this kernel does. A holder of another
// host (or one this process cannot judge) has expired when the lock went a whole lease
// without a write: by the store's clock when it says (age_seconds), else watched from here
// through `read` -- never by comparing the holder's clock with this one's, which may differ
// by more than a lease. A heartbeat recent by this clock refuses at once without watching
// (that only ever refuses). *changed: the lock changed while watched (look again).
std::string StaleReason(const LockHolder& h, const Seen& seen, bool kernel_lock,
                        const LockOptions& opts, const ReadSeen& read, bool* changed) {
  *changed = false;
  if (JudgedHere(h)) return GoneHere(h, kernel_lock);
  if (opts.break_lock) return "break_lock was given";
  const double lease = opts.lease_seconds;
  if (seen.age_seconds >= 0) {
    if (seen.age_seconds <= lease) return "";
    return "its lease of " + LeaseText(opts) + " s expired (not renewed for " +
           std::to_string(static_cast<int64_t>(seen.age_seconds)) + " s by the store's clock)";
  }
  if (NowUnixMs() - h.heartbeat_unix_ms <= static_cast<int64_t>(lease * 1000)) return "";
  const auto every = std::chrono::duration<double>(std::clamp(lease / 8, 0.05, 2.0));
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(lease);
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(every);
    auto now = read();
    if (!now.ok() || now->version != seen.version) {
      *changed = true;
      return "";
    }
  }
  return "its lease of " + LeaseText(opts) + " s expired (unchanged for " + LeaseText(opts) +
         " s as watched from host " + HostName() + ")";
}

Status HeldBy(const std::string& what, const std::string& path, const LockHolder& h,
              const LockOptions& opts, bool kernel_says_alive) {
  std::string how = kernel_says_alive
                        ? "the holder is alive (it holds the file's kernel lock); stop it first"
                        : "a holder on another host renews it every " +
                              Seconds(static_cast<int64_t>(opts.lease_seconds * 250)) +
                              " s and it is broken once not renewed for " + LeaseText(opts) +
                              " s; if that job is gone, `dcp unlock " + path +
                              "` or break_lock takes it now";
  return FailedPrecondition(what + " is in use by " + DescribeLockHolder(h) + " (" + path + "); " +
                            how);
}

struct Stat {
  dev_t dev = 0;
  ino_t ino = 0;
};

}  // namespace

// ---- The held lock and its heartbeat --------------------------------------------------------

struct LeaseLock::State {
  FileSystem* fs = nullptr;
  std::string path;
  LockHolder me;
  LockOptions opts;
  int fd = -1;  // file systems: the locked descriptor
  Stat inode;

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::string lost;     // why the lock is no longer ours, once found out
  std::string version;  // object stores: the version of the lock as this holder last wrote it
  // When this holder last wrote its lock (steady clock): past one lease without a write, a
  // taker may have found it expired, so the lock is no longer proven ours.
  std::atomic<std::chrono::steady_clock::rep> written{Steady()};
  // Serialises the heartbeat's reads and writes with Check()'s (both update `version`).
  std::mutex io;
  std::thread heartbeat;

  static std::chrono::steady_clock::rep Steady() {
    return std::chrono::steady_clock::now().time_since_epoch().count();
  }

  ~State() {
    if (fd >= 0) ::close(fd);
  }

  // The lock as it is now (the descriptor's, or the object), at most kMaxLockBytes of it.
  Result<Seen> Read() {
    if (fd >= 0) {
      std::string buf(kMaxLockBytes + 1, '\0');
      ssize_t n = ::pread(fd, buf.data(), buf.size(), 0);
      if (n < 0) return ErrnoStatus("read lock", path, errno);
      buf.resize(static_cast<size_t>(n));
      return Seen{buf, buf, -1};
    }
    return ReadLock(*fs, path);
  }

  // Writes this holder's lock over the version it last wrote (object stores: a conditional
  // write, so a lock taken meanwhile is never overwritten), or in place under the flock.
  Status Write() {
    const std::string text = EncodeLockHolder(me);
    if (fd < 0) {
      auto v = fs->WriteIfVersion(path, text, version);
      if (!v.ok()) return v.status();
      version = *v;
    } else if (::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()) ||
               ::ftruncate(fd, static_cast<off_t>(text.size())) != 0 || ::fdatasync(fd) != 0) {
      return ErrnoStatus("write lock", path, errno);
    }
    written = Steady();
    return OkStatus();
  }

  std::string NotWrittenFor() const {
    const double since = std::chrono::duration<double>(
                             std::chrono::steady_clock::duration(Steady() - written.load()))
                             .count();
    if (since <= opts.lease_seconds) return "";
    return "it could not be renewed for " + std::to_string(static_cast<int64_t>(since)) +
           " s, past its lease of " + LeaseText(opts) + " s (another job may have taken it)";
  }

  // Why the lock is no longer ours, or "" -- or, when `unreadable` is given and the lock
  // cannot be read now (an outage), "" with *unreadable set.
  std::string WhyLost(bool* unreadable = nullptr) {
    if (fd >= 0) {
      struct stat by_fd, by_path;
      if (::fstat(fd, &by_fd) != 0 || by_fd.st_nlink == 0) return "its lock file was removed";
      if (::stat(path.c_str(), &by_path) != 0 || by_path.st_ino != inode.ino ||
          by_path.st_dev != inode.dev) {
        return "its lock file was replaced";
      }
      return "";
    }
    auto seen = Read();
    if (!seen.ok()) {
      if (seen.status().code() == StatusCode::kNotFound) return "its lock was removed";
      // An outage, not a loss (only another holder's lock is one): the caller reads again.
      if (unreadable) *unreadable = true;
      return unreadable ? "" : "its lock cannot be read (" + seen.status().message() + ")";
    }
    auto h = DecodeLockHolder(seen->text);
    if (!h.ok() || h->id != me.id) {
      return "its lock was taken by " + (h.ok() ? DescribeLockHolder(*h) : "another holder");
    }
    // Ours, written by a write whose reply was lost: that is the version to write over.
    version = seen->version;
    return "";
  }

  void Renew() {
    std::unique_lock lock(mu);
    const auto every =
        std::chrono::duration<double>(std::clamp(opts.lease_seconds / 4, 0.05, 30.0));
    while (!cv.wait_for(lock, every, [&] { return stopping; })) {
      if (!lost.empty()) continue;
      lock.unlock();
      std::string why = RenewOnce();
      lock.lock();
      if (!why.empty()) lost = why;
    }
  }

  // One beat: the lock rewritten with a new heartbeat; why it is lost, or "".
  std::string RenewOnce() {
    std::lock_guard guard(io);
    bool unreadable = false;
    if (fd >= 0) {
      std::string why = WhyLost(&unreadable);
      if (!why.empty()) return why;
    }
    me.heartbeat_unix_ms = NowUnixMs();
    Status s = Write();
    if (!s.ok() && fd < 0 &&
        (s.code() == StatusCode::kFailedPrecondition || s.code() == StatusCode::kNotFound)) {
      // Changed since this holder's last write: taken or removed -- or written by our own
      // renewal whose reply was lost (then WhyLost adopts its version, written next beat).
      std::string why = WhyLost(&unreadable);
      if (!why.empty()) return why;
    }
    // Failed writes and reads are retried at the next beat (the lease allows three misses);
    // a lock never read is never renewed blind, which could overwrite one taken meanwhile.
    if (unreadable) {
      std::fprintf(stderr, "dcp: could not read %s to renew it; trying at the next beat\n",
                   path.c_str());
    } else if (!s.ok()) {
      std::fprintf(stderr, "dcp: could not renew %s: %s\n", path.c_str(), s.message().c_str());
    }
    return NotWrittenFor();
  }
};

LeaseLock::LeaseLock() = default;
LeaseLock::~LeaseLock() { Release(); }

bool LeaseLock::held() const { return state_ != nullptr; }

Status LeaseLock::Acquire(FileSystem& fs, const std::string& path, const std::string& what,
                          const std::string& kind, const std::string& id, const LockOptions& opts) {
  Release();
  broke_.clear();
  if (!(opts.lease_seconds > 0)) {
    return InvalidArgument("the lease of the lock of " + what + " must be positive, not " +
                           std::to_string(opts.lease_seconds) + " s");
  }
  auto st = std::make_unique<State>();
  st->fs = &fs;
  st->path = path;
  st->opts = opts;
  st->me = {kind,
            id,
            HostName(),
            static_cast<int64_t>(::getpid()),
            NowUnixMs(),
            NowUnixMs(),
            ProcessIdentity(::getpid())};
  st->me.flock = fs.Flocks();
  const ReadSeen read = [raw = st.get()] { return raw->Read(); };

  bool got = false;
  for (int attempt = 0; attempt < 8 && !got; ++attempt) {
    bool kernel_lock = false;
    // Every change a compare-and-swap on the version seen: object stores, and file systems
    // without flock.
    bool versioned = !fs.Flocks();
    Seen seen;
    int64_t mtime_ms = NowUnixMs();
    if (!fs.IsObjectStore()) {
      // Never through a symlink (its target would get the lock text), never a FIFO's wait.
      int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
      if (fd < 0 && errno == ELOOP) {
        return FailedPrecondition("lock file " + path + " is a symlink: refusing to use it; " +
                                  "remove it if nothing else put it there");
      }
      if (fd < 0) return ErrnoStatus("open lock file", path, errno);
      st->fd = fd;
      struct stat s;
      if (::fstat(fd, &s) != 0 || !S_ISREG(s.st_mode) || s.st_nlink != 1) {
        ::close(fd);
        st->fd = -1;
        return FailedPrecondition("lock file " + path +
                                  " is not a regular file with one link: refusing to use it");
      }
      st->inode = {s.st_dev, s.st_ino};
      mtime_ms = static_cast<int64_t>(s.st_mtim.tv_sec) * 1000 + s.st_mtim.tv_nsec / 1000000;
      if (versioned) {
        ::close(fd);
        st->fd = -1;
      } else if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
        kernel_lock = true;
        // Released and removed between our open and flock: that inode is no lock any more.
        struct stat by_path;
        if (::stat(path.c_str(), &by_path) != 0 || by_path.st_ino != s.st_ino ||
            by_path.st_dev != s.st_dev) {
          ::close(fd);
          st->fd = -1;
          continue;
        }
      } else if (errno == EWOULDBLOCK) {
        auto content = st->Read();
        const LockHolder h = HolderOf(content.ok() ? content->text : "", mtime_ms);
        return HeldBy(what, path, h, opts, /*kernel_says_alive=*/true);
      } else {
        // No flock on this file system (ENOLCK, ENOTSUP): the content decides, and each write
        // replaces the file only if it still holds what was judged.
        ::close(fd);
        st->fd = -1;
        versioned = true;
      }
      auto now = st->Read();
      if (!now.ok() && now.status().code() == StatusCode::kNotFound) continue;
      DCP_RETURN_IF_ERROR(now.status());
      seen = std::move(*now);
      if (kernel_lock) {
        // Written by a holder that takes no flock: its lock changes only by compare-and-swap
        // (an in-place write could cross a versioned taker's rename).
        auto h = DecodeLockHolder(seen.text);
        if (h.ok() && !h->flock) {
          ::close(st->fd);
          st->fd = -1;
          kernel_lock = false;
          versioned = true;
          auto again = st->Read();
          if (!again.ok() && again.status().code() == StatusCode::kNotFound) continue;
          DCP_RETURN_IF_ERROR(again.status());
          seen = std::move(*again);
        }
      }
    } else {
      // Created only if absent; a lost reply's retry is refused, but reads back as ours.
      auto created = fs.WriteIfVersion(path, EncodeLockHolder(st->me), "");
      if (created.ok()) {
        st->version = *created;
        got = true;
        break;
      }
      if (created.status().code() != StatusCode::kFailedPrecondition) {
        return created.status().Annotate("cannot lock " + what + ": ");
      }
      auto now = st->Read();
      if (!now.ok() && now.status().code() == StatusCode::kNotFound) continue;
      DCP_RETURN_IF_ERROR(now.status());
      seen = std::move(*now);
    }

    if (seen.text.empty() && fs.IsObjectStore()) {
      // An object is written whole: an empty one is no lock being written, and holds nothing.
      std::fprintf(stderr, "dcp: warning: removing the empty lock object %s\n", path.c_str());
      (void)fs.RemoveIfVersion(path, seen.version);
      continue;
    }
    if (!seen.text.empty()) {
      const LockHolder h = HolderOf(seen.text, mtime_ms);
      // A lock is mine iff its id is: a conditional write whose reply was lost is retried and
      // refused (412), yet what it wrote is there, with this attempt's id.
      if (versioned && h.id == st->me.id) {
        st->version = seen.version;
        got = true;
        break;
      }
      bool changed = false;
      const std::string why = StaleReason(h, seen, kernel_lock, opts, read, &changed);
      if (changed) {
        if (st->fd >= 0) ::close(st->fd), st->fd = -1;
        continue;  // renewed, taken or released while watched: look again
      }
      if (why.empty()) {
        if (st->fd >= 0) ::close(st->fd), st->fd = -1;
        return HeldBy(what, path, h, opts, /*kernel_says_alive=*/false);
      }
      broke_ = DescribeLockHolder(h) + ": " + why;
      std::fprintf(stderr, "dcp: warning: breaking the lock of %s held by %s\n", what.c_str(),
                   broke_.c_str());
    }
    // Taken over only as it was judged: without flock a write conditional on the version seen
    // (an empty file's, too), so of two takers, or a taker and a late renewal, one wins.
    if (versioned) st->version = seen.version;
    st->me.flock = !versioned;
    Status w = st->Write();
    if (!w.ok()) {
      if (versioned &&
          (w.code() == StatusCode::kFailedPrecondition || w.code() == StatusCode::kNotFound)) {
        broke_.clear();
        // It changed since it was judged, or another writer is changing it: judge it again,
        // after a pause that grows (a writer mid-change takes milliseconds).
        std::this_thread::sleep_for(std::chrono::milliseconds(10 << std::min(attempt, 6)));
        continue;
      }
      return w.Annotate("cannot lock " + what + ": ");
    }
    got = true;
  }
  if (!got) {
    return FailedPrecondition(what + " is contended: its lock " + path +
                              " was taken and released by others meanwhile; try again");
  }
  st->written = State::Steady();
  State* raw = st.get();
  st->heartbeat = std::thread([raw] { raw->Renew(); });
  state_ = std::move(st);
  return OkStatus();
}

Status LeaseLock::Check() {
  if (!state_) return FailedPrecondition("lock not held");
  std::string why;
  {
    std::lock_guard lock(state_->mu);
    why = state_->lost;
  }
  // Read again through a short outage; a lock that stays unreadable is not proven ours.
  for (int attempt = 0; why.empty(); ++attempt) {
    bool unreadable = false;
    {
      std::lock_guard guard(state_->io);
      why = state_->WhyLost(attempt < 3 ? &unreadable : nullptr);
    }
    if (!unreadable) break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (why.empty()) why = state_->NotWrittenFor();
  if (why.empty()) return OkStatus();
  return FailedPrecondition("the lock " + state_->path + " is no longer this job's: " + why);
}

void LeaseLock::Release() {
  if (!state_) return;
  {
    std::lock_guard lock(state_->mu);
    state_->stopping = true;
  }
  state_->cv.notify_all();
  if (state_->heartbeat.joinable()) state_->heartbeat.join();
  // Removed only while still ours (a lock broken meanwhile belongs to its new holder): on a
  // file system under the flock, so a taker that opened it meanwhile sees the inode is gone;
  // on an object store only while it holds the version this holder wrote. Read first even
  // there: a store that takes If-Match on DELETE without honouring it would otherwise delete
  // the lock of a save that took this one over.
  if (state_->WhyLost().empty()) {
    if (state_->fd >= 0) {
      (void)state_->fs->Remove(state_->path);
    } else {
      (void)state_->fs->RemoveIfVersion(state_->path, state_->version);
    }
  }
  state_.reset();  // closes the descriptor: the kernel lock goes last
}

Result<LockHolder> ReadLockHolder(FileSystem& fs, const std::string& path) {
  DCP_ASSIGN_OR_RETURN(Seen lock, ReadLock(fs, path));
  auto h = DecodeLockHolder(lock.text);
  if (!h.ok()) return DataLoss(path + " is not a dcp lock");
  return h;
}

Result<std::string> BreakLock(FileSystem& fs, const std::string& path) {
  // One read (size, holder and version); on an object store the removal is conditional on
  // that version, so a lock renewed or taken meanwhile is not removed.
  auto lock = fs.ReadVersioned(path, size_t{1} << 20);
  if (!lock.ok() && lock.status().code() != StatusCode::kDataLoss) return lock.status();
  std::string who = "an unreadable lock";
  if (lock.ok()) {
    who += " of " + std::to_string(lock->text.size()) + " bytes";
    if (auto h = DecodeLockHolder(lock->text); h.ok()) {
      who = DescribeLockHolder(*h);
      // A holder of this host that takes no flock (DCP_LOCKS_WITHOUT_FLOCK): its process.
      if (!h->flock && JudgedHere(*h) && GoneHere(*h, /*kernel_lock=*/false).empty()) {
        return FailedPrecondition(path + " is held by " + who +
                                  ", which is alive on this host: stop it instead of unlocking");
      }
    }
  }
  if (!fs.IsObjectStore()) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd >= 0) {
      const bool alive = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
      ::close(fd);
      if (alive) {
        return FailedPrecondition(path + " is held by " + who +
                                  ", which is alive (it holds the file's kernel lock): stop it "
                                  "instead of unlocking");
      }
    }
  }
  // Only the version read: a lock renewed or taken meanwhile stays (on a file system the
  // comparison and removal are two steps; an object store makes them one).
  if (lock.ok()) {
    Status removed = fs.RemoveIfVersion(path, lock->version);
    if (removed.code() == StatusCode::kFailedPrecondition) {
      return FailedPrecondition(path +
                                " changed while being unlocked (renewed or taken by "
                                "another job); look again");
    }
    DCP_RETURN_IF_ERROR(removed);
  } else {
    DCP_RETURN_IF_ERROR(fs.Remove(path));
  }
  return who;
}

}  // namespace dcp::storage
