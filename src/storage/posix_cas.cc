#include "storage/posix_cas.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <ctime>
#include <functional>
#include <random>

namespace dcp::storage {
namespace {

constexpr size_t kMaxCompared = size_t{1} << 20;

// A name beside `path` no other caller picks (the rename aside and the new file must stay on
// the same file system for rename and link).
std::string UniqueSibling(const std::string& path, const char* what) {
  static const uint64_t seed = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  static std::atomic<uint64_t> counter{0};
  return path + "." + what + "." + std::to_string(::getpid()) + "-" +
         std::to_string(seed ^ counter.fetch_add(1));
}

Status WriteNew(const std::string& path, std::string_view data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST) return FailedPrecondition(path + " exists");
  if (fd < 0) return ErrnoStatus("create", path, errno);
  const bool ok = ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()) &&
                  ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    return ErrnoStatus("write", path, err);
  }
  return OkStatus();
}

// Gives `from` the name `to` unless `to` exists (kFailedPrecondition): renameat2's NOREPLACE,
// or, where the file system lacks it, a hard link (which never replaces either).
Status PlaceNoReplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
    return OkStatus();
  }
  if (errno == EEXIST) return FailedPrecondition(to + " exists");
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
    return ErrnoStatus("rename " + from + " to", to, errno);
  }
  if (::link(from.c_str(), to.c_str()) != 0) {
    if (errno == EEXIST) return FailedPrecondition(to + " exists");
    return ErrnoStatus("link " + from + " to", to, errno);
  }
  ::unlink(from.c_str());
  return OkStatus();
}

// The version of the file at `path`, or "" for one too large to be what was compared with.
Result<std::string> VersionOf(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus("open", path, errno);
  std::string text(kMaxCompared + 1, '\0');
  ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  const int err = errno;
  ::close(fd);
  if (n < 0) return ErrnoStatus("read", path, err);
  if (static_cast<size_t>(n) > kMaxCompared) return std::string();
  text.resize(static_cast<size_t>(n));
  return ContentVersion(text);
}

std::string ReadSmall(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return "";
  char buf[256];
  ssize_t n = ::pread(fd, buf, sizeof(buf), 0);
  ::close(fd);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// A writer that died holding a claim: its claim is broken after this long (a change takes
// milliseconds).
constexpr int kStaleClaimSeconds = 10;

// Removes the claim at `claim` if it is still the one whose token was `token` (it is renamed
// aside first, so a claim made again meanwhile is put back, not removed).
void BreakClaim(const std::string& claim, const std::string& token) {
  const std::string aside = UniqueSibling(claim, "stale");
  if (::rename(claim.c_str(), aside.c_str()) != 0) return;
  if (ReadSmall(aside) == token || !PlaceNoReplace(aside, claim).ok()) ::unlink(aside.c_str());
}

// The claim on version `version` of `path`: only its holder changes the file from that
// version. Made by an exclusive create of a name the version gives (of two callers that saw
// one version, one gets it), then checked: the file must still hold that version. Returns the
// claim's name; kFailedPrecondition when the file changed or another caller holds the claim,
// kNotFound when the file is gone.
Result<std::string> Claim(const std::string& path, const std::string& version) {
  const std::string claim = path + ".claim." + version;
  const std::string token = UniqueSibling("", "token");
  for (int attempt = 0;; ++attempt) {
    Status made = WriteNew(claim, token);
    if (made.ok()) break;
    if (made.code() != StatusCode::kFailedPrecondition || attempt > 0) {
      return made.code() == StatusCode::kFailedPrecondition
                 ? FailedPrecondition(path + " is being changed by another writer")
                 : made;
    }
    struct stat st;
    const std::string held = ReadSmall(claim);
    if (::stat(claim.c_str(), &st) != 0 ||
        ::time(nullptr) - st.st_mtim.tv_sec < kStaleClaimSeconds) {
      return FailedPrecondition(path + " is being changed by another writer");
    }
    BreakClaim(claim, held);
  }
  auto seen = VersionOf(path);
  if (seen.ok() && *seen == version) return claim;
  ::unlink(claim.c_str());
  if (!seen.ok() && seen.status().code() == StatusCode::kNotFound)
    return NotFound(path + " is gone");
  DCP_RETURN_IF_ERROR(seen.status());
  return FailedPrecondition(path + " changed meanwhile");
}

}  // namespace

std::string ContentVersion(std::string_view text) {
  return "h" + std::to_string(std::hash<std::string_view>{}(text)) + "-" +
         std::to_string(text.size());
}

Result<std::string> PosixWriteIfVersion(const std::string& path, std::string_view data,
                                        const std::string& version) {
  const std::string fresh = UniqueSibling(path, "cas-new");
  DCP_RETURN_IF_ERROR(WriteNew(fresh, data));
  if (version.empty()) {
    Status placed = PlaceNoReplace(fresh, path);
    if (!placed.ok()) {
      ::unlink(fresh.c_str());
      return placed;
    }
    return ContentVersion(data);
  }
  auto claim = Claim(path, version);
  if (!claim.ok()) {
    ::unlink(fresh.c_str());
    return claim.status();
  }
  // The file is replaced, never absent: a reader sees the old version or the new one.
  const bool replaced = ::rename(fresh.c_str(), path.c_str()) == 0;
  const int err = errno;
  ::unlink(claim->c_str());
  if (!replaced) {
    ::unlink(fresh.c_str());
    return ErrnoStatus("replace", path, err);
  }
  return ContentVersion(data);
}

Status PosixRemoveIfVersion(const std::string& path, const std::string& version) {
  auto claim = Claim(path, version);
  if (!claim.ok())
    return claim.status().code() == StatusCode::kNotFound ? OkStatus() : claim.status();
  const bool removed = ::unlink(path.c_str()) == 0 || errno == ENOENT;
  const int err = errno;
  ::unlink(claim->c_str());
  return removed ? OkStatus() : ErrnoStatus("remove", path, err);
}

}  // namespace dcp::storage
