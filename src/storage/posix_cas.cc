#include "storage/posix_cas.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace dcp::storage {
namespace {

constexpr size_t kMaxCompared = size_t{1} << 20;
// A claim this process has seen unchanged this long by its own clock belongs to a writer that
// died or stalled mid-change: a change takes milliseconds, and a writer gives up half this long
// after its claim. File times are not trusted for it: Lustre sets them from each client's clock.
constexpr int64_t kStaleClaimSeconds = 10;
// A claim this old by the file system's clock (no plausible skew between hosts) is stale at
// once, so a claim left long ago costs no wait.
constexpr int64_t kAncientClaimSeconds = 600;
// Successive stale claims passed over before giving up (each one a writer that died).
constexpr int kMaxStaleClaims = 16;

// "Exists" (the one kFailedPrecondition of this file: the caller then looks again); every
// other failure keeps its cause and a code that is not mistaken for contention.
Status Exists(const std::string& path) { return FailedPrecondition(path + " exists"); }
Status Failed(std::string_view op, const std::string& path, int err) {
  if (err == ENOENT) return NotFound(ErrnoStatus(op, path, err).message());
  return Status(StatusCode::kUnavailable, ErrnoStatus(op, path, err).message());
}

// A name beside `path` no other caller picks (renamed and linked files must stay on the same
// file system).
std::string UniqueSibling(const std::string& path, const char* what) {
  static const uint64_t seed = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  static std::atomic<uint64_t> counter{0};
  return path + "." + what + "." + std::to_string(::getpid()) + "-" +
         std::to_string(seed ^ counter.fetch_add(1));
}

// A new file at `path` holding `data`, on disk; *mtime_s: its modification time, the file
// system's clock now; *ino: its inode.
Status WriteNew(const std::string& path, std::string_view data, int64_t* mtime_s = nullptr,
                ino_t* ino = nullptr) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return errno == EEXIST ? Exists(path) : Failed("create", path, errno);
  const ssize_t n = ::write(fd, data.data(), data.size());
  int err = n < 0 ? errno : EIO;  // a short write sets no errno
  bool ok = n == static_cast<ssize_t>(data.size());
  if (ok && ::fsync(fd) != 0) ok = false, err = errno;
  struct stat st;
  if (ok && (mtime_s || ino)) {
    const bool known = ::fstat(fd, &st) == 0;
    if (mtime_s) *mtime_s = known ? st.st_mtim.tv_sec : 0;
    if (ino) *ino = known ? st.st_ino : 0;
  }
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    return Failed("write", path, err);
  }
  return OkStatus();
}

// Whether `from` and `to` name one file: a link whose reply was lost, retransmitted by an NFS
// client, answers EEXIST although it was made.
bool SameFile(const std::string& from, const std::string& to) {
  struct stat a, b;
  return ::stat(from.c_str(), &a) == 0 && ::stat(to.c_str(), &b) == 0 && a.st_ino == b.st_ino &&
         a.st_dev == b.st_dev;
}

// Gives `from` the name `to` unless `to` exists: renameat2's NOREPLACE or, where the file
// system lacks it, a hard link (which never replaces either).
Status PlaceNoReplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
    return OkStatus();
  }
  if (errno == EEXIST) return Exists(to);
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
    return Failed("rename " + from + " to", to, errno);
  }
  if (::link(from.c_str(), to.c_str()) != 0) {
    const int err = errno;  // before SameFile's stat calls
    if (err != EEXIST) return Failed("link " + from + " to", to, err);
    if (!SameFile(from, to)) return Exists(to);
  }
  ::unlink(from.c_str());
  return OkStatus();
}

// The claim at `name` as the server has it now: opened, so an NFS client revalidates what it
// cached (close-to-open), then fstat'ed. False when there is none.
bool StatClaim(const std::string& name, struct stat* st) {
  int fd = ::open(name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  const bool ok = ::fstat(fd, st) == 0;
  ::close(fd);
  return ok;
}

std::chrono::milliseconds ObservationPeriod() {
  return ClaimObservationForTest().count() > 0 ? ClaimObservationForTest()
                                               : std::chrono::seconds(kStaleClaimSeconds);
}

// Whether the claim `name` (inode and change time in `st`) has been seen unchanged by this
// thread for the observation period of its own clock. Per thread (no lock a fork could leave
// held); forgotten after an hour.
bool SeenHeldTooLong(const std::string& name, const struct stat& st) {
  using Clock = std::chrono::steady_clock;
  using Key = std::tuple<std::string, ino_t, int64_t>;
  thread_local std::map<Key, Clock::time_point> first_seen;
  const Clock::time_point now = Clock::now();
  std::erase_if(first_seen, [&](const auto& e) { return now - e.second > std::chrono::hours(1); });
  const int64_t ctime_ns = int64_t{st.st_ctim.tv_sec} * 1'000'000'000 + st.st_ctim.tv_nsec;
  const auto it = first_seen.emplace(Key{name, st.st_ino, ctime_ns}, now).first;
  return now - it->second >= ObservationPeriod();
}

// A claim found at `name` (`st`; `now`: the file system's clock) that may belong to a writer
// that died: stale when kAncientClaimSeconds old by the file system's clock; when its time is
// kStaleClaimSeconds or more off either way (a live claim is younger, unless clocks differ),
// watched until this thread has seen it unchanged for the observation period, or it goes or
// changes (*st updated, false). A younger claim is a writer at work: false at once.
bool Stale(const std::string& name, int64_t now, struct stat* st) {
  const int64_t age = now - st->st_mtim.tv_sec;
  if (age >= kAncientClaimSeconds) return true;
  if (age < kStaleClaimSeconds && age > -kStaleClaimSeconds) return false;
  const auto deadline = std::chrono::steady_clock::now() + ObservationPeriod() * 2;
  while (!SeenHeldTooLong(name, *st)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::min(ObservationPeriod() / 20, std::chrono::milliseconds(500)));
    struct stat again;
    if (!StatClaim(name, &again) || again.st_ino != st->st_ino ||
        again.st_ctim.tv_sec != st->st_ctim.tv_sec ||
        again.st_ctim.tv_nsec != st->st_ctim.tv_nsec) {
      return false;
    }
  }
  return true;
}

// The version of the file at `path`, or "" for one no caller compares with (too large).
Result<std::string> VersionOf(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    return errno == ENOENT ? NotFound(path + " is gone") : Failed("open", path, errno);
  }
  // Sized by the file (a lock is a few hundred bytes; renewals come every lease/4).
  struct stat st;
  const size_t size = ::fstat(fd, &st) == 0 ? static_cast<size_t>(st.st_size) : 0;
  std::string text(std::min(size, kMaxCompared) + 1, '\0');
  ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  const int err = errno;
  ::close(fd);
  if (n < 0) return Failed("read", path, err);
  // Too large, or grown since its size was taken: no version it was compared with.
  if (static_cast<size_t>(n) > kMaxCompared || static_cast<size_t>(n) == text.size()) {
    return std::string();
  }
  text.resize(static_cast<size_t>(n));
  return ContentVersion(text);
}

// What a change made beside the file: its claim, the stale claims it passed over (another
// writer's, removed once the change is done: nobody could take them meanwhile), its scratch
// file. Whatever is still named here goes when the change ends.
struct Claimed {
  std::string mine;
  ino_t mine_ino = 0;  // its inode: the claim at that name is still this one
  std::chrono::steady_clock::time_point claimed_at;
  std::vector<std::string> passed;
  std::string fresh;
  ~Claimed() {
    // The stale ones first: while `mine` stands nobody takes a claim on the version anew.
    for (const std::string& p : passed) ::unlink(p.c_str());
    if (!mine.empty()) ::unlink(mine.c_str());
    if (!fresh.empty()) ::unlink(fresh.c_str());
  }
};

std::string Successor(const std::string& path, const std::string& version, ino_t stale) {
  return path + ".claim." + version + ".after." + std::to_string(stale);
}

// Takes the claim on version `version` of `path`: only its holder changes the file from that
// version. A claim is a file created under a name the version gives, so of two callers that
// saw one version one gets it; it is then checked: the file must still hold that version.
// A claim this process has seen unchanged for kStaleClaimSeconds, or one kAncientClaimSeconds
// old by the file system's clock (the caller's scratch file, just written, tells the time
// there), is passed over, never removed: its successor is a claim named after the stale one's
// inode, taken the same way, so of two callers that found it stale one goes on.
// kFailedPrecondition: the file changed, or another caller holds the claim; kNotFound: the file is
// gone.
Status Claim(const std::string& path, const std::string& version, Claimed* claimed) {
  const std::string token = UniqueSibling(path, "cas-claim");
  std::string name = path + ".claim." + version;
  std::vector<std::string> passed;  // claimed->passed only once a claim is this caller's
  for (int hops = 0;; ++hops) {
    int64_t now = 0;
    claimed->claimed_at = std::chrono::steady_clock::now();
    DCP_RETURN_IF_ERROR(WriteNew(token, "", &now, &claimed->mine_ino));
    Status placed = PlaceNoReplace(token, name);
    if (placed.ok()) break;
    ::unlink(token.c_str());
    if (placed.code() != StatusCode::kFailedPrecondition) return placed;
    struct stat st;
    const bool there = StatClaim(name, &st);
    if (hops == kMaxStaleClaims || (there && !Stale(name, now, &st))) {
      if (there && !StatClaim(name, &st) && hops < kMaxStaleClaims) continue;  // gone: again
      return FailedPrecondition(path + " is being changed by another writer");
    }
    if (!there) continue;  // released meanwhile: try again
    passed.push_back(name);
    name = Successor(path, version, st.st_ino);
  }
  claimed->mine = name;
  claimed->passed = std::move(passed);
  auto seen = VersionOf(path);
  if (!seen.ok()) {
    claimed->passed.clear();  // left as they are
    return seen.status();
  }
  // Changed: nobody can change the file from `version` any more, its claims are litter.
  if (*seen != version) return FailedPrecondition(path + " changed meanwhile");
  return OkStatus();
}

// Whether a later caller passed over this caller's claim as stale (this one stalled past
// kStaleClaimSeconds between its claim and its change): then it changes nothing.
// Also when it took so long that a claim this old could be passed over before its change
// lands: it gives up then, leaving its claim for a successor to pass over.
bool Overtaken(const std::string& path, const std::string& version, Claimed* claimed) {
  struct stat st;
  const bool mine = StatClaim(claimed->mine, &st) && st.st_ino == claimed->mine_ino;
  const bool late = std::chrono::steady_clock::now() - claimed->claimed_at >
                    std::chrono::seconds(kStaleClaimSeconds / 2);
  struct stat successor;
  if (!mine || late || StatClaim(Successor(path, version, st.st_ino), &successor)) {
    claimed->mine.clear();
    claimed->passed.clear();  // the successor's holder removes them
    return true;
  }
  return false;
}

}  // namespace

// Listed before the version is read, so a claim taken on a newer version after that read is
// not among them.
void SweepClaims(const std::string& path) {
  const std::filesystem::path file(path);
  const std::filesystem::path dir = file.has_parent_path() ? file.parent_path() : ".";
  const std::string prefix = file.filename().string() + ".claim.";
  std::vector<std::string> claims;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) claims.push_back(std::move(name));
  }
  if (ec || claims.empty()) return;
  auto current = VersionOf(path);
  if (!current.ok() && current.status().code() != StatusCode::kNotFound) return;
  if (current.ok() && current->empty()) return;  // a file no version names: nothing to compare
  const std::string now = current.ok() ? *current : std::string();
  for (const std::string& name : claims) {
    const std::string of =
        name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size());
    if (of != now) ::unlink((dir / name).c_str());
  }
}

std::chrono::milliseconds& ClaimObservationForTest() {
  static std::chrono::milliseconds period{0};
  return period;
}

std::string ContentVersion(std::string_view text) {
  return "h" + std::to_string(std::hash<std::string_view>{}(text)) + "-" +
         std::to_string(text.size());
}

Result<std::string> PosixWriteIfVersion(const std::string& path, std::string_view data,
                                        const std::string& version) {
  {
    Claimed claimed;
    claimed.fresh = UniqueSibling(path, "cas-new");
    DCP_RETURN_IF_ERROR(WriteNew(claimed.fresh, data));
    if (version.empty()) {
      DCP_RETURN_IF_ERROR(PlaceNoReplace(claimed.fresh, path));
      claimed.fresh.clear();
      return ContentVersion(data);
    }
    DCP_RETURN_IF_ERROR(Claim(path, version, &claimed));
    if (Overtaken(path, version, &claimed)) {
      return FailedPrecondition(path + " is being changed by another writer");
    }
    // The file is replaced, never absent: a reader sees the old version or the new one.
    if (::rename(claimed.fresh.c_str(), path.c_str()) != 0) return Failed("replace", path, errno);
    claimed.fresh.clear();
  }
  SweepClaims(path);
  return ContentVersion(data);
}

Status PosixRemoveIfVersion(const std::string& path, const std::string& version) {
  {
    Claimed claimed;
    Status held = Claim(path, version, &claimed);
    if (held.code() == StatusCode::kNotFound) return OkStatus();
    DCP_RETURN_IF_ERROR(held);
    if (Overtaken(path, version, &claimed)) {
      return FailedPrecondition(path + " is being changed by another writer");
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Failed("remove", path, errno);
  }
  SweepClaims(path);
  return OkStatus();
}

}  // namespace dcp::storage
