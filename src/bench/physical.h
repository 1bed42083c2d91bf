// The physical limits a benchmark is compared with, measured in the same run
// (docs/benchmarks.md): sequential file write and read with large requests, page cache control
// (drop with posix_fadvise, residency with mincore), and one-thread memcpy bandwidth.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcp/status.h"
#include "storage/file_system.h"

namespace dcp::bench {

inline constexpr uint64_t kIoBlockBytes = uint64_t{16} << 20;

// Writes `bytes` of non-zero data into a new file at `path` with kIoBlockBytes writes,
// then fdatasync and close: what a checkpoint writer does at best.
Status WriteSequential(storage::FileSystem& fs, const std::string& path, uint64_t bytes);

// Reads the whole file with kIoBlockBytes reads (announced first: an object store fetches
// ahead in parallel); adds the bytes read to *bytes_read.
Status ReadSequential(storage::FileSystem& fs, const std::string& path, uint64_t* bytes_read);

// Reads bytes [offset, offset + length) of `file` with kIoBlockBytes reads into `block`
// (grown as needed, reused across calls); adds the bytes read to *bytes_read.
Status ReadInPieces(storage::ReadableFile& file, uint64_t offset, uint64_t length,
                    std::vector<std::byte>& block, uint64_t* bytes_read);

// Writes back dirty pages of `path` (fsync), then asks the kernel to drop its cached pages
// (posix_fadvise DONTNEED). Clean pages of an unmapped file go at once.
Status DropFromPageCache(const std::string& path);

struct Residency {
  uint64_t resident_bytes = 0;
  uint64_t total_bytes = 0;
  double Fraction() const {
    return total_bytes ? static_cast<double>(resident_bytes) / total_bytes : 0.0;
  }
};

// Whether `dir` lives on a file system held in memory (tmpfs, ramfs), whose pages cannot be
// dropped: there, a "cold" read is a memory copy.
Result<bool> InMemoryFileSystem(const std::string& dir);

// How much of the files sits in the page cache now (mincore over a read-only mapping,
// which itself faults nothing in).
Result<Residency> MeasureResidency(const std::vector<std::string>& paths);

// The regular files directly inside `dir`, as full paths, sorted.
Result<std::vector<std::string>> FilesIn(const std::string& dir);

// One thread copying a `bytes`-sized buffer `reps` times (after one untimed copy that
// faults the pages in); the best repetition, in GiB/s.
double MemcpyGiBps(uint64_t bytes = uint64_t{256} << 20, int reps = 4);

// CPU time this process has spent so far, user + system, all threads (getrusage).
double ProcessCpuSeconds();

}  // namespace dcp::bench
