#include "manager/root_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>

#include "checkpoint/save_lock.h"
#include "manager/manager.h"
#include "storage/file_system.h"

namespace dcp::manager {

Status RootLock::Acquire(const std::string& root) {
  path_ = storage::JoinPath(root, kLockName);
  // Never through a symlink (whose target the lock text and the release's truncate would
  // overwrite), and only a regular file.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd_ < 0 && errno == ELOOP) {
    return FailedPrecondition("lock file " + path_ + " is a symlink: refusing to use it; " +
                              "remove it if nothing else put it there");
  }
  if (fd_ < 0) return ErrnoStatus("open lock file", path_, errno);
  struct stat st;
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    return FailedPrecondition("lock file " + path_ + " is not a regular file");
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    const Holder h = Parse(ReadRaw());
    const std::string holder =
        h.host.empty() ? std::string()
                       : "held by process " + std::to_string(h.pid) + " on host " + h.host;
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) return ErrnoStatus("lock", path_, err);
    return FailedPrecondition("checkpoint root " + root + " is in use by another manager (" +
                              (holder.empty() ? std::string("lock file ") + path_ : holder) +
                              "); one manager per root");
  }
  const std::string me = checkpoint::LockHostName();
  if (const Holder h = Parse(ReadRaw()); !h.host.empty()) {
    if (h.host != me) {
      ::close(fd_);
      fd_ = -1;
      return FailedPrecondition("checkpoint root " + root + " is locked by process " +
                                std::to_string(h.pid) + " on host " + h.host + " (" + path_ +
                                "); if that job is gone, remove the lock file");
    }
    // Same host and the flock was free: its holder is dead (a live manager holds the flock).
  }
  std::string content = me + " " + std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, content.data(), content.size(), 0) != static_cast<ssize_t>(content.size()) ||
      ::fsync(fd_) != 0) {
    Status s = ErrnoStatus("write lock file", path_, errno);
    Release();
    return s;
  }
  return OkStatus();
}

void RootLock::Release() {
  if (fd_ < 0) return;
  // The file stays (empty = free): unlinking a locked file races with a process that opened
  // it just before.
  (void)::ftruncate(fd_, 0);
  ::close(fd_);
  fd_ = -1;
}

std::string RootLock::ReadRaw() {
  char buf[512] = {};
  ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
  std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

RootLock::Holder RootLock::Parse(const std::string& raw) {
  Holder h;
  std::istringstream in(raw);
  in >> h.host >> h.pid;
  return h;
}

}  // namespace dcp::manager
