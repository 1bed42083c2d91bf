#include "storage/lease_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/host_name.h"

namespace dcp::storage {
namespace {

// A lock file is a few lines; anything longer is not one (and is never read whole).
constexpr size_t kMaxLockBytes = 4096;

std::string Seconds(int64_t ms) { return std::to_string(std::max<int64_t>(0, ms) / 1000); }

// For holders whose kernel lock cannot be seen (no flock here): is `pid` of this host alive?
// A zombie (killed, not yet reaped) holds nothing.
bool ProcessAlive(int64_t pid) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');  // "pid (comm) S ...": comm may hold ')'
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  return line[close + 2] != 'Z' && line[close + 2] != 'X';
}

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The start time of `pid` (clock ticks since boot, /proc/<pid>/stat's 22nd field), "" if gone.
std::string StartTime(int64_t pid) {
  const std::string line = FirstLine("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = line.rfind(')');  // "pid (comm) S ...": comm may hold ')'
  if (close == std::string::npos) return "";
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) return field;
  }
  return "";
}

// The pid namespace this process sees pids in ("pid:[4026531836]"), "" where /proc cannot say.
std::string PidNamespace() {
  char buf[64];
  const ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// The text of the lock at `path` through `fs`, refused when longer than a lock can be.
Result<std::string> ReadLockText(FileSystem& fs, const std::string& path) {
  // One open and one read: the size is the opened file's, not a second look at the name.
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> f, fs.OpenReadable(path));
  if (f->size() > kMaxLockBytes) return DataLoss(path + " is not a dcp lock (too large)");
  std::string text(f->size(), '\0');
  DCP_RETURN_IF_ERROR(f->ReadAt(0, std::as_writable_bytes(std::span(text.data(), text.size()))));
  return text;
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

// Why `h` no longer holds the lock, or "" when it may. `kernel_lock`: this taker holds the
// file's flock, so no live process of this kernel does.
std::string StaleReason(const LockHolder& h, bool kernel_lock, const LockOptions& opts) {
  // Same host name: its process can be judged here -- unless it ran under another kernel
  // (a restarted container or machine keeping its name) or in a pid namespace this process
  // cannot see: then its lease decides, as for another host.
  bool judged_here = h.host == HostName() && !h.host.empty();
  std::string boot, ns, start;
  if (judged_here && !h.process.empty()) {
    std::istringstream parts(h.process);
    parts >> boot >> ns >> start;
    const std::string mine = ProcessIdentity(::getpid());
    judged_here = mine.rfind(boot + " " + ns + " ", 0) == 0;
  }
  if (judged_here) {
    if (kernel_lock) return "its process is gone (the kernel released its lock)";
    if (!ProcessAlive(h.pid)) return "process " + std::to_string(h.pid) + " is gone";
    if (!start.empty() && StartTime(h.pid) != start) {
      return "process " + std::to_string(h.pid) + " is gone (the pid is another process's now)";
    }
    return "";
  }
  const int64_t age_ms = NowUnixMs() - h.heartbeat_unix_ms;
  if (age_ms > static_cast<int64_t>(opts.lease_seconds * 1000)) {
    return "its lease of " + Seconds(static_cast<int64_t>(opts.lease_seconds * 1000)) +
           " s expired (last renewed " + Seconds(age_ms) + " s ago)";
  }
  if (opts.break_lock) return "break_lock was given";
  return "";
}

Status HeldBy(const std::string& what, const std::string& path, const LockHolder& h,
              const LockOptions& opts, bool kernel_says_alive) {
  std::string how = kernel_says_alive
                        ? "the holder is alive (it holds the file's kernel lock); stop it first"
                        : "a holder on another host renews it every " +
                              Seconds(static_cast<int64_t>(opts.lease_seconds * 250)) +
                              " s and it is broken once not renewed for " +
                              Seconds(static_cast<int64_t>(opts.lease_seconds * 1000)) +
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

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string ProcessIdentity(int64_t pid) {
  const std::string start = StartTime(pid);
  std::string boot = FirstLine("/proc/sys/kernel/random/boot_id");
  std::string ns = PidNamespace();
  if (start.empty() || boot.empty() || ns.empty()) return "";
  for (std::string* s : {&boot, &ns}) {
    for (char& c : *s) {
      if (c == ' ' || c == '\n') c = '_';
    }
  }
  return boot + " " + ns + " " + start;
}

std::string EncodeLockHolder(const LockHolder& h) {
  // Fixed-width times: a renewal rewrites the file in place, never shorter or longer.
  char times[64];
  std::snprintf(times, sizeof(times), "started %015lld\nrenewed %015lld\n",
                static_cast<long long>(h.started_unix_ms),
                static_cast<long long>(h.heartbeat_unix_ms));
  return "dcp lock\nkind " + h.kind + "\nid " + h.id + "\nhost " + h.host + "\npid " +
         std::to_string(h.pid) + "\n" + times +
         (h.process.empty() ? "" : "process " + h.process + "\n");
}

Result<LockHolder> DecodeLockHolder(std::string_view text) {
  if (text.size() > kMaxLockBytes || text.substr(0, 9) != "dcp lock\n") {
    return DataLoss("not a dcp lock");
  }
  LockHolder h;
  int fields = 0;
  size_t pos = 9;
  while (pos < text.size()) {
    size_t end = std::min(text.find('\n', pos), text.size());
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) continue;
    const std::string key(line.substr(0, sp)), value(line.substr(sp + 1));
    const long long n = std::strtoll(value.c_str(), nullptr, 10);
    if (key == "kind") h.kind = value, ++fields;
    if (key == "id") h.id = value, ++fields;
    if (key == "host") h.host = value, ++fields;
    if (key == "pid") h.pid = n, ++fields;
    if (key == "started") h.started_unix_ms = n, ++fields;
    if (key == "renewed") h.heartbeat_unix_ms = n, ++fields;
    if (key == "process") h.process = value;  // optional: earlier versions wrote none
  }
  if (fields != 6) return DataLoss("incomplete dcp lock");
  return h;
}

std::string DescribeLockHolder(const LockHolder& h) {
  const int64_t now = NowUnixMs();
  if (h.host.empty()) {
    return "an " + h.kind + " (written " + Seconds(now - h.heartbeat_unix_ms) + " s ago)";
  }
  return h.kind + " " + h.id + " of process " + std::to_string(h.pid) + " on host " + h.host +
         " (started " + Seconds(now - h.started_unix_ms) + " s ago, renewed " +
         Seconds(now - h.heartbeat_unix_ms) + " s ago)";
}

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
  std::string lost;  // why the lock is no longer ours, once found out
  std::thread heartbeat;

  ~State() {
    if (fd >= 0) ::close(fd);
  }

  // Reads at most kMaxLockBytes of the lock (the descriptor's, or the object).
  Result<std::string> ReadContent() {
    if (fd >= 0) {
      std::string buf(kMaxLockBytes + 1, '\0');
      ssize_t n = ::pread(fd, buf.data(), buf.size(), 0);
      if (n < 0) return ErrnoStatus("read lock", path, errno);
      buf.resize(static_cast<size_t>(n));
      return buf;
    }
    return ReadLockText(*fs, path);
  }

  Status WriteContent() {
    const std::string text = EncodeLockHolder(me);
    if (fd < 0) return fs->WriteAtomic(path, text, ".renew");
    if (::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()) ||
        ::ftruncate(fd, static_cast<off_t>(text.size())) != 0 || ::fdatasync(fd) != 0) {
      return ErrnoStatus("write lock", path, errno);
    }
    return OkStatus();
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
    auto text = ReadContent();
    if (!text.ok()) {
      if (text.status().code() == StatusCode::kNotFound) return "its lock was removed";
      // An outage, not a loss (only another holder's lock is one): the caller reads again.
      if (unreadable) *unreadable = true;
      return unreadable ? "" : "its lock cannot be read (" + text.status().message() + ")";
    }
    auto h = DecodeLockHolder(*text);
    if (!h.ok() || h->id != me.id) {
      return "its lock was taken by " + (h.ok() ? DescribeLockHolder(*h) : "another holder");
    }
    return "";
  }

  void Renew() {
    std::unique_lock lock(mu);
    const auto every =
        std::chrono::duration<double>(std::clamp(opts.lease_seconds / 4, 0.05, 30.0));
    while (!cv.wait_for(lock, every, [&] { return stopping; })) {
      if (!lost.empty()) continue;
      lock.unlock();
      bool unreadable = false;
      std::string why = WhyLost(&unreadable);
      if (unreadable) {  // not renewed blind: that could overwrite a lock taken meanwhile
        std::fprintf(stderr, "dcp: could not read %s to renew it; trying at the next beat\n",
                     path.c_str());
      } else if (why.empty()) {
        me.heartbeat_unix_ms = NowUnixMs();
        Status s = WriteContent();
        // A failed renewal is retried at the next beat; the lease allows three misses.
        if (!s.ok())
          std::fprintf(stderr, "dcp: could not renew %s: %s\n", path.c_str(), s.message().c_str());
      }
      lock.lock();
      if (!why.empty()) lost = why;
    }
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

  bool got = false;
  for (int attempt = 0; attempt < 5 && !got; ++attempt) {
    bool kernel_lock = false;
    std::string text;
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
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
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
        auto content = st->ReadContent();
        const LockHolder h = HolderOf(content.ok() ? *content : "", mtime_ms);
        return HeldBy(what, path, h, opts, /*kernel_says_alive=*/true);
      }  // else no flock on this file system (ENOLCK, ENOTSUP): the content decides
      DCP_ASSIGN_OR_RETURN(text, st->ReadContent());
    } else {
      auto file = fs.NewExclusiveFile(path);
      if (file.ok()) {
        const std::string mine = EncodeLockHolder(st->me);
        Status w = (*file)->Append(std::as_bytes(std::span(mine.data(), mine.size())));
        if (w.ok()) w = (*file)->Sync();
        Status c = (*file)->Close();
        if (w.ok()) w = c;
        if (w.ok()) {
          got = true;
          break;
        }
        // kFailedPrecondition: another taker won the conditional write; not ours to remove.
        if (w.code() != StatusCode::kFailedPrecondition) {
          (void)fs.Remove(path);
          return w.Annotate("cannot lock " + what + ": ");
        }
      } else if (file.status().code() != StatusCode::kFailedPrecondition) {
        return file.status().Annotate("cannot lock " + what + ": ");
      }
      auto content = st->ReadContent();
      if (!content.ok() && content.status().code() == StatusCode::kNotFound) continue;
      DCP_RETURN_IF_ERROR(content.status());
      text = *content;
    }

    if (text.empty() && fs.IsObjectStore()) {
      // An object is written whole: an empty one is no lock being written, and holds nothing.
      std::fprintf(stderr, "dcp: warning: removing the empty lock object %s\n", path.c_str());
      (void)fs.Remove(path);
      continue;
    }
    if (!text.empty()) {
      const LockHolder h = HolderOf(text, mtime_ms);
      // A lock is mine iff its id is: a conditional PUT whose reply was lost is retried and
      // refused (412), yet what it wrote is there, with this attempt's id.
      if (fs.IsObjectStore() && h.id == st->me.id) {
        got = true;
        break;
      }
      const std::string why = StaleReason(h, kernel_lock, opts);
      if (why.empty()) {
        if (st->fd >= 0) ::close(st->fd), st->fd = -1;
        return HeldBy(what, path, h, opts, /*kernel_says_alive=*/false);
      }
      broke_ = DescribeLockHolder(h) + ": " + why;
      std::fprintf(stderr, "dcp: warning: breaking the lock of %s held by %s\n", what.c_str(),
                   broke_.c_str());
      if (fs.IsObjectStore()) {
        (void)fs.Remove(path);  // then created anew, only if still absent
        continue;
      }
    }
    if (!fs.IsObjectStore()) {
      Status w = st->WriteContent();
      if (!w.ok()) return w.Annotate("cannot lock " + what + ": ");
      if (!kernel_lock) {
        // No flock to make the takeover atomic: at least see a taker that wrote after us.
        auto back = st->ReadContent();
        auto h = back.ok() ? DecodeLockHolder(*back) : Result<LockHolder>(back.status());
        if (!h.ok() || h->id != id) {
          return FailedPrecondition(what + " is contended: another job took its lock " + path +
                                    " at the same time");
        }
      }
    }
    got = true;
  }
  if (!got) {
    return FailedPrecondition(what + " is contended: its lock " + path +
                              " was taken and released by others meanwhile; try again");
  }
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
    why = state_->WhyLost(attempt < 3 ? &unreadable : nullptr);
    if (!unreadable) break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
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
  // Removed only while still ours (a lock broken meanwhile belongs to its new holder); on a
  // file system under the flock, so a taker that opened it meanwhile sees the inode is gone.
  if (state_->WhyLost().empty()) (void)state_->fs->Remove(state_->path);
  state_.reset();  // closes the descriptor: the kernel lock goes last
}

Result<LockHolder> ReadLockHolder(FileSystem& fs, const std::string& path) {
  DCP_ASSIGN_OR_RETURN(std::string text, ReadLockText(fs, path));
  auto h = DecodeLockHolder(text);
  if (!h.ok()) return DataLoss(path + " is not a dcp lock");
  return h;
}

Result<std::string> BreakLock(FileSystem& fs, const std::string& path) {
  DCP_ASSIGN_OR_RETURN(uint64_t size, fs.FileSize(path));
  std::string who = "an unreadable lock of " + std::to_string(size) + " bytes";
  if (auto h = ReadLockHolder(fs, path); h.ok()) who = DescribeLockHolder(*h);
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
  DCP_RETURN_IF_ERROR(fs.Remove(path));
  return who;
}

}  // namespace dcp::storage
