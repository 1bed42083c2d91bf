#include "bench/physical.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>

namespace dcp::bench {

Status WriteSequential(storage::FileSystem& fs, const std::string& path, uint64_t bytes) {
  // Pseudo-random content like a checkpoint's, and no 4 KiB block written twice (each
  // write stamps a counter into every block), so no layer below can compress or dedup it.
  std::vector<uint64_t> block(std::min(bytes, kIoBlockBytes) / 8 + 1);
  uint64_t x = std::hash<std::string>{}(path) | 1;
  for (uint64_t& w : block) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
    w = x;
  }
  DCP_ASSIGN_OR_RETURN(auto file, fs.NewWritableFile(path));
  uint64_t stamp = 0;
  for (uint64_t left = bytes; left > 0;) {
    const size_t n = std::min<uint64_t>(left, kIoBlockBytes);
    for (size_t w = 0; w < block.size(); w += 4096 / 8) block[w] = ++stamp;
    DCP_RETURN_IF_ERROR(file->Append(std::as_bytes(std::span(block)).first(n)));
    left -= n;
  }
  DCP_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

Status ReadSequential(storage::FileSystem& fs, const std::string& path, uint64_t* bytes_read) {
  DCP_ASSIGN_OR_RETURN(auto file, fs.OpenReadable(path));
  // An object store then fetches the whole object ahead, in parallel ranged GETs. (A file
  // system's own read-ahead of 16 MiB reads is the reference: no advice there.)
  const storage::ByteRange whole{0, file->size()};
  if (fs.IsObjectStore()) file->WillRead({&whole, 1});
  std::vector<std::byte> block;
  return ReadInPieces(*file, 0, file->size(), block, bytes_read);
}

Status ReadInPieces(storage::ReadableFile& file, uint64_t offset, uint64_t length,
                    std::vector<std::byte>& block, uint64_t* bytes_read) {
  if (block.size() < std::min(length, kIoBlockBytes)) block.resize(std::min(length, kIoBlockBytes));
  for (uint64_t done = 0; done < length;) {
    const uint64_t n = std::min(length - done, kIoBlockBytes);
    DCP_RETURN_IF_ERROR(file.ReadAt(offset + done, std::span(block.data(), n)));
    done += n;
    *bytes_read += n;
  }
  return OkStatus();
}

Status DropFromPageCache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open", path, errno);
  Status st;
  if (::fsync(fd) != 0) {
    st = ErrnoStatus("fsync", path, errno);
  } else if (int err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); err != 0) {
    st = ErrnoStatus("posix_fadvise(DONTNEED)", path, err);
  }
  ::close(fd);
  return st;
}

Result<Residency> MeasureResidency(const std::vector<std::string>& paths) {
  Residency r;
  for (const std::string& path : paths) {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) return ErrnoStatus("stat", path, ec.value());
    r.total_bytes += size;
    if (size == 0) continue;
    const storage::ByteRange all{0, size};
    const std::optional<double> cached =
        storage::PosixFileSystem().CachedFraction(path, std::span(&all, 1));
    if (!cached) return Internal("bench: cannot tell how much of " + path + " is cached");
    r.resident_bytes += static_cast<uint64_t>(*cached * static_cast<double>(size) + 0.5);
  }
  return r;
}

Result<std::vector<std::string>> FilesIn(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_regular_file()) out.push_back(e.path().string());
  }
  if (ec) return Unavailable("list " + dir + ": " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

double ProcessCpuSeconds() {
  struct rusage u {};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return 0;
  auto sec = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

double MemcpyGiBps(uint64_t bytes, int reps) {
  auto src = std::make_unique<std::byte[]>(bytes);
  auto dst = std::make_unique<std::byte[]>(bytes);
  std::memset(src.get(), 0x5a, bytes);
  std::memcpy(dst.get(), src.get(), bytes);  // fault the destination in
  double best = 0;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.get(), src.get(), bytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Keep the copy observable so it is not optimised away.
    asm volatile("" : : "r"(dst.get()) : "memory");
    if (s > 0) best = std::max(best, bytes / s / double(uint64_t{1} << 30));
  }
  return best;
}

Result<bool> InMemoryFileSystem(const std::string& dir) {
  struct statfs st;
  if (::statfs(dir.c_str(), &st) != 0) return ErrnoStatus("statfs", dir, errno);
  constexpr decltype(st.f_type) kTmpfs = 0x01021994, kRamfs = 0x858458f6;  // linux/magic.h
  return st.f_type == kTmpfs || st.f_type == kRamfs;
}

}  // namespace dcp::bench
