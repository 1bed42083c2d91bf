#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>

#include "storage/file_system.h"
#include "storage/posix_cas.h"
#include "storage/remove_tree.h"

namespace dcp::storage {
namespace {

// Data and metadata files must be regular files: a FIFO would block a reader forever, a
// device would read without end.
Status NotRegular(const std::string& path, mode_t mode) {
  const char* kind = S_ISFIFO(mode)   ? "a FIFO"
                     : S_ISDIR(mode)  ? "a directory"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                                      : "a special file";
  return FailedPrecondition("cannot read " + path + ": it is " + std::string(kind) +
                            ", not a regular file");
}

class PosixWritableFile final : public WritableFile {
 public:
  // `reused`: an existing file overwritten in place, cut to the bytes written at Sync().
  PosixWritableFile(int fd, std::string path, bool reused = false)
      : fd_(fd), path_(std::move(path)), reused_(reused) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Append(std::span<const std::byte> data) override {
    const std::byte* p = data.data();
    size_t left = data.size();
    while (left > 0) {
      // Linux writes at most ~2 GiB per call; loop on short writes.
      ssize_t n = ::write(fd_, p, std::min<size_t>(left, size_t{1} << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus("write", path_, errno);
      }
      p += n;
      left -= static_cast<size_t>(n);
      written_ += static_cast<uint64_t>(n);
    }
    return OkStatus();
  }
  void WillWrite(uint64_t total_bytes) override {
    if (reused_ || written_ > 0 || total_bytes == 0) return;
    if (::ftruncate(fd_, static_cast<off_t>(total_bytes)) == 0) sized_ = total_bytes;
  }
  Status Sync() override {
    // A recycled file may be longer than what was written: its old tail goes before the sync,
    // so the durable file holds only this save's bytes (so does one sized ahead, if less came).
    const bool cut = reused_ || (sized_ > 0 && sized_ != written_);
    if (cut && ::ftruncate(fd_, static_cast<off_t>(written_)) != 0) {
      return ErrnoStatus("truncate", path_, errno);
    }
    if (::fdatasync(fd_) != 0) return ErrnoStatus("fdatasync", path_, errno);
    return OkStatus();
  }
  Status Close() override {
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return ErrnoStatus("close", path_, errno);
    return OkStatus();
  }
  const std::string& path() const override { return path_; }

 private:
  int fd_;
  std::string path_;
  bool reused_;
  uint64_t written_ = 0;
  uint64_t sized_ = 0;  // WillWrite's size, once the file took it
};

// Announced ranges (WillRead) are asked of the kernel ahead of the reads (POSIX_FADV_WILLNEED),
// in file order, at most kAheadBytes of them not yet matched by bytes read: the slabs a
// broadcast load reads are a few rows of a tensor each, the next rows another rank's, so the
// kernel's own read-ahead, which follows sequential reads, keeps about one small request in
// flight where the disk serves many at once. The pace is the bytes read, not where they are,
// so reads that alternate between regions (a rank in several groups) skip nothing. Nothing
// happens on tmpfs, whose pages are in memory already.
class PosixReadableFile final : public ReadableFile {
 public:
  static constexpr uint64_t kAheadBytes = uint64_t{8} << 20;
  static constexpr uint64_t kMergeGap = uint64_t{64} << 10;  // closer announced ranges: one

  PosixReadableFile(int fd, uint64_t size, std::string path)
      : fd_(fd), size_(size), path_(std::move(path)) {}
  ~PosixReadableFile() override { ::close(fd_); }
  void WillRead(std::span<const ByteRange> ranges) override {
    std::lock_guard lock(mu_);
    pending_.insert(pending_.end(), ranges.begin(), ranges.end());
    pending_ = MergeRanges(std::move(pending_), kMergeGap);
    Advise();
  }
  Status ReadAt(uint64_t offset, std::span<std::byte> dst) override {
    {
      std::lock_guard lock(mu_);
      if (!pending_.empty()) {
        ahead_ -= std::min<uint64_t>(ahead_, dst.size());
        Advise();
      }
    }
    std::byte* p = dst.data();
    size_t left = dst.size();
    while (left > 0) {
      ssize_t n =
          ::pread(fd_, p, std::min<size_t>(left, size_t{1} << 30), static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus("read", path_, errno);
      }
      if (n == 0) {
        return DataLoss("file " + path_ + " is truncated: needed bytes up to " +
                        std::to_string(offset + left) + ", it ends at " + std::to_string(offset));
      }
      p += n;
      offset += static_cast<uint64_t>(n);
      left -= static_cast<size_t>(n);
    }
    return OkStatus();
  }
  uint64_t size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  // Once fewer than half a window of advised bytes are ahead of the reads, advises the next
  // pending ones up to a window. Advice is a hint: its failure changes nothing.
  void Advise() {
    if (ahead_ >= kAheadBytes / 2) return;
    size_t done = 0;
    for (; done < pending_.size() && ahead_ < kAheadBytes; ++done) {
      ByteRange& r = pending_[done];
      const uint64_t n = std::min(r.length, kAheadBytes - ahead_);
      (void)::posix_fadvise(fd_, static_cast<off_t>(r.offset), static_cast<off_t>(n),
                            POSIX_FADV_WILLNEED);
      ahead_ += n;
      if (n < r.length) {  // its rest with the next window
        r.offset += n;
        r.length -= n;
        break;
      }
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(done));
  }

  int fd_;
  uint64_t size_;
  std::string path_;
  std::mutex mu_;                   // guards what follows: reads may come from other threads
  std::vector<ByteRange> pending_;  // announced, not advised yet: sorted, merged
  uint64_t ahead_ = 0;              // advised bytes not yet matched by bytes read
};

class Posix final : public FileSystem {
 public:
  bool ConcurrentReads() const override { return true; }  // descriptors are per file object

  std::optional<double> CachedFraction(const std::string& path,
                                       std::span<const ByteRange> ranges) override {
    uint64_t wanted = 0;
    for (const ByteRange& r : ranges) wanted += r.length;
    if (wanted == 0) return 1.0;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0.0;
    struct stat st {};
    const bool sized = ::fstat(fd, &st) == 0 && st.st_size > 0;
    // mincore reports every page resident for a file the caller neither owns nor may write
    // (Linux 5.0+, against side channels): unknown then.
    if (sized && st.st_uid != ::geteuid() &&
        ::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) != 0) {
      ::close(fd);
      return std::nullopt;
    }
    void* m = sized ? ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
    ::close(fd);
    if (m == MAP_FAILED) return sized ? std::optional<double>() : 0.0;
    const auto size = static_cast<uint64_t>(st.st_size);
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    // mincore costs ~50 ns a page: past kExact pages, windows of kWindow pages spread evenly
    // over the ranges stand for them (eviction takes whole regions, not scattered pages).
    constexpr uint64_t kExact = 4096, kWindow = 8;
    uint64_t pages = 0, inside = 0;  // bytes past the end are not cached
    for (const ByteRange& r : ranges) {
      if (r.offset >= size || r.length == 0) continue;
      inside += std::min(size, r.offset + r.length) - r.offset;
      pages += (std::min(size, r.offset + r.length) - r.offset / page * page + page - 1) / page;
    }
    const uint64_t stride = pages <= kExact ? 0 : pages / (kExact / kWindow);
    uint64_t seen = 0, next = 0, sampled = 0, sampled_in = 0;
    std::vector<unsigned char> in;
    bool ok = true;
    for (const ByteRange& r : ranges) {
      if (r.offset >= size || r.length == 0) continue;
      const uint64_t begin = r.offset / page * page, end = std::min(size, r.offset + r.length);
      const uint64_t n = (end - begin + page - 1) / page;
      // Exact: the range's pages; sampled: the windows that start in it.
      for (uint64_t at = stride ? std::max(next, seen) - seen : 0; at < n;
           at += stride ? stride : n) {
        const uint64_t count = stride ? std::min(kWindow, n - at) : n;
        const uint64_t from = begin + at * page, to = std::min(end, from + count * page);
        in.assign(count, 0);
        if (::mincore(static_cast<char*>(m) + from, to - from, in.data()) != 0) {
          ok = false;
          break;
        }
        for (uint64_t i = 0; i < count; ++i) {
          const uint64_t lo = std::max(r.offset, from + i * page);
          const uint64_t hi = std::min(end, from + (i + 1) * page);
          sampled += hi - lo;
          if (in[i] & 1) sampled_in += hi - lo;
        }
        if (stride) next = seen + at + stride;
      }
      if (!ok) break;
      seen += n;
    }
    ::munmap(m, size);
    if (!ok) return std::nullopt;
    if (sampled == 0) return 0.0;
    return static_cast<double>(sampled_in) / static_cast<double>(sampled) *
           static_cast<double>(inside) / static_cast<double>(wanted);
  }
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    // Always a new inode: whatever sat at `path` (a planted symlink, a file hard-linked into a
    // snapshot) loses only its name, never its content.
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus("replace", path, errno);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus("create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path));
  }
  Result<std::unique_ptr<WritableFile>> ReuseFile(const std::string& old_path,
                                                  const std::string& path) override {
    // Only a regular file that nothing else names is overwritten: opened without following
    // a symlink (O_NONBLOCK: a FIFO does not wait for a reader) and checked on the descriptor.
    // A hard-linked file (a `cp -al` / `rsync --link-dest` snapshot shares the inode), a
    // symlink or anything else loses only this name, and the caller writes a new file.
    int fd = ::open(old_path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT) return ErrnoStatus("recycle", old_path, errno);
    struct stat st;
    const bool sole = fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1;
    if (!sole) {
      if (fd >= 0) ::close(fd);
      if (::unlink(old_path.c_str()) != 0 && errno != ENOENT) {
        return ErrnoStatus("remove unrecyclable", old_path, errno);
      }
      return NotFound(old_path + " is not a regular file with one link: not recycled");
    }
    if (::fcntl(fd, F_SETFL, 0) != 0 || ::rename(old_path.c_str(), path.c_str()) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus("recycle " + old_path + " as", path, err);
    }
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path, /*reused=*/true));
  }
  Result<std::unique_ptr<WritableFile>> NewExclusiveFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) return FailedPrecondition(path + " already exists");
    if (fd < 0) return ErrnoStatus("create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path));
  }
  Result<std::unique_ptr<ReadableFile>> OpenReadable(const std::string& path) override {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. The
    // descriptor is then checked to be a regular file (a FIFO, device or directory in place of
    // a data or metadata file is refused), and made blocking again.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return ErrnoStatus("open", path, errno);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus("stat", path, err);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return NotRegular(path, st.st_mode);
    }
    int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus("open", path, err);
    }
    return std::unique_ptr<ReadableFile>(
        new PosixReadableFile(fd, static_cast<uint64_t>(st.st_size), path));
  }
  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoStatus("rename", from, errno);
    return OkStatus();
  }
  Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("open directory", dir, errno);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoStatus("fsync directory", dir, err);
    return OkStatus();
  }
  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) == 0 || errno == ENOENT) return OkStatus();
    const int unlink_err = errno;
    if (unlink_err == EISDIR || unlink_err == EPERM) {  // a directory (EPERM: POSIX allows it)
      if (::rmdir(path.c_str()) == 0 || errno == ENOENT) return OkStatus();
      // Not a directory after all: unlink's own error is the one that says why.
      if (errno != ENOTDIR) return ErrnoStatus("remove", path, errno);
    }
    return ErrnoStatus("remove", path, unlink_err);
  }
  Status RemoveTree(const std::string& path) override { return RemoveTreeNoFollow(path); }
  Status Exchange(const std::string& a, const std::string& b) override {
    if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0) {
      return ErrnoStatus("exchange with " + b, a, errno);
    }
    return OkStatus();
  }
  Status CreateDirs(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Unavailable("create directory " + dir + ": " + ec.message());
    return OkStatus();
  }
  Result<std::vector<std::string>> List(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return ErrnoStatus("list", dir, errno);
    auto names = ReadDirectoryNames(d, dir);
    ::closedir(d);
    return names;
  }
  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("stat", path, errno);
    if (!S_ISREG(st.st_mode)) return NotRegular(path, st.st_mode);
    return static_cast<uint64_t>(st.st_size);
  }  // flock that does not reach other hosts (Lustre's `localflock`) cannot be detected: the
  // user says so, and locks then take the compare-and-swap below.
  bool Flocks() const override {
    const char* v = std::getenv("DCP_LOCKS_WITHOUT_FLOCK");
    return v == nullptr || std::string_view(v) != "1";
  }
  // Atomic without flock (storage/posix_cas.h): the lease lock's writes where flock is missing.
  Result<std::string> WriteIfVersion(const std::string& path, std::string_view data,
                                     const std::string& version) override {
    return PosixWriteIfVersion(path, data, version);
  }
  Status RemoveIfVersion(const std::string& path, const std::string& version) override {
    return PosixRemoveIfVersion(path, version);
  }
};

}  // namespace

Result<std::unique_ptr<WritableFile>> FileSystem::NewExclusiveFile(const std::string& path) {
  auto size = FileSize(path);
  if (size.ok()) return FailedPrecondition(path + " already exists");
  if (size.status().code() != StatusCode::kNotFound) return size.status();
  return NewWritableFile(path);
}

Result<std::unique_ptr<WritableFile>> FileSystem::ReuseFile(const std::string& old_path,
                                                            const std::string& path) {
  DCP_RETURN_IF_ERROR(Remove(old_path));
  return NewWritableFile(path);
}

FileSystem& PosixFileSystem() {
  static Posix fs;
  return fs;
}

std::vector<ByteRange> MergeRanges(std::vector<ByteRange> ranges, uint64_t gap) {
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
  std::vector<ByteRange> out;
  for (const ByteRange& r : ranges) {
    if (r.length == 0) continue;
    if (!out.empty() && r.offset <= out.back().offset + out.back().length + gap) {
      ByteRange& last = out.back();
      last.length = std::max(last.offset + last.length, r.offset + r.length) - last.offset;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

namespace {
std::string_view TrimSlashes(std::string_view p) {
  while (p.size() > 1 && p.back() == '/') p.remove_suffix(1);
  return p;
}
}  // namespace

std::string ParentPath(const std::string& path) {
  std::string_view p = TrimSlashes(path);
  const size_t slash = p.rfind('/');
  if (slash == std::string_view::npos) return "";
  // "s3://bucket": a bucket has no parent directory.
  if (const size_t scheme = p.find("://");
      scheme != std::string_view::npos && slash <= scheme + 2) {
    return "";
  }
  if (slash == 0) return "/";
  return std::string(TrimSlashes(p.substr(0, slash)));
}

std::string LastComponent(const std::string& path) {
  std::string_view p = TrimSlashes(path);
  if (ParentPath(path).empty() && p.find("://") != std::string_view::npos) return "";
  const size_t slash = p.rfind('/');
  return std::string(slash == std::string_view::npos ? p : p.substr(slash + 1));
}

std::string NormalPath(const std::string& path) {
  // A URL ("s3://bucket/key") is an object store's path, used as given.
  if (path.empty() || path.find("://") != std::string::npos) return path;
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  if (ec) return path;
  std::string out = p.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

Result<std::string> FileSystem::ReadWhole(const std::string& path) {
  DCP_ASSIGN_OR_RETURN(auto file, OpenReadable(path));
  std::string data(file->size(), '\0');
  DCP_RETURN_IF_ERROR(file->ReadAt(0, std::as_writable_bytes(std::span(data.data(), data.size()))));
  return data;
}

Status FileSystem::WriteAtomic(const std::string& path, std::string_view data,
                               const std::string& tmp_suffix) {
  FileSystem& fs = *this;
  const std::string tmp = path + tmp_suffix;
  {
    // Created exclusively (O_CREAT|O_EXCL never follows a symlink): whatever sits at the tmp
    // name (a crashed writer's leftover, a planted symlink) is unlinked first, itself only,
    // and one planted again in between makes the create fail instead of writing through it.
    DCP_RETURN_IF_ERROR(fs.Remove(tmp));
    DCP_ASSIGN_OR_RETURN(auto file, fs.NewExclusiveFile(tmp));
    Status s = file->Append(std::as_bytes(std::span(data.data(), data.size())));
    if (s.ok()) s = file->Sync();
    if (s.ok()) s = file->Close();
    if (!s.ok()) {
      (void)fs.Remove(tmp);
      return s;
    }
  }
  Status s = fs.Rename(tmp, path);
  if (!s.ok()) {
    (void)fs.Remove(tmp);
    return s;
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  return fs.SyncDir(dir.empty() ? "." : dir);
}

Result<FileSystem::Versioned> FileSystem::ReadVersioned(const std::string& path, size_t max_bytes) {
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> f, OpenReadable(path));
  if (f->size() > max_bytes) {
    return DataLoss(path + ": " + std::to_string(f->size()) + " bytes, more than the " +
                    std::to_string(max_bytes) + " expected");
  }
  Versioned v;
  v.text.resize(f->size());
  DCP_RETURN_IF_ERROR(
      f->ReadAt(0, std::as_writable_bytes(std::span(v.text.data(), v.text.size()))));
  v.version = ContentVersion(v.text);
  return v;
}

Result<std::string> FileSystem::WriteIfVersion(const std::string& path, std::string_view data,
                                               const std::string& version) {
  if (version.empty()) {
    DCP_ASSIGN_OR_RETURN(auto file, NewExclusiveFile(path));
    Status s = file->Append(std::as_bytes(std::span(data.data(), data.size())));
    if (s.ok()) s = file->Sync();
    if (s.ok()) s = file->Close();
    if (!s.ok()) return s;
  } else {
    DCP_ASSIGN_OR_RETURN(Versioned now, ReadVersioned(path, data.size() + 4096));
    if (now.version != version) return FailedPrecondition(path + " changed meanwhile");
    DCP_RETURN_IF_ERROR(WriteAtomic(path, data, ".cas"));
  }
  return ContentVersion(std::string(data));
}

Status FileSystem::RemoveIfVersion(const std::string& path, const std::string& version) {
  auto now = ReadVersioned(path, size_t{1} << 20);
  if (!now.ok()) return now.status().code() == StatusCode::kNotFound ? OkStatus() : now.status();
  if (now->version != version) return FailedPrecondition(path + " changed meanwhile");
  return Remove(path);
}

}  // namespace dcp::storage
