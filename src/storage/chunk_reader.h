// Reading a stored chunk into destination memory.
//
// A chunk copied whole into a matching destination is read straight into that memory.
// Otherwise it is streamed through a bounded bounce buffer and scattered run by run into
// every destination that needs part of it, so the file is read once however many
// destination chunks it feeds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/copy_runs.h"
#include "storage/file_system.h"

namespace dcp::storage {

struct ChunkTarget {
  const CopyRuns* runs;  // stored chunk -> destination chunk byte runs
  std::byte* dst;        // destination chunk's first byte
};

struct StoredRange {
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  uint64_t xxh3 = 0;
};

// Copies `target`'s runs out of a whole stored chunk already in memory.
void ScatterFromMemory(const ChunkTarget& target, std::span<const std::byte> chunk);

// Reads the whole range into `dst` (range.byte_length bytes), checking the checksum when
// `verify`.
Status ReadRangeInto(ReadableFile& file, const StoredRange& range, bool verify, std::byte* dst,
                     uint64_t* bytes_read);

// With `verify`, reads the whole chunk and fails with kDataLoss on a checksum mismatch
// (destination memory then holds unverified bytes and must not be used). Without it, reads
// only the span the targets need. Adds the bytes read from storage to *bytes_read.
Status ReadStoredChunk(ReadableFile& file, const StoredRange& range, bool verify,
                       std::span<const ChunkTarget> targets, std::vector<std::byte>& bounce,
                       uint64_t* bytes_read);

}  // namespace dcp::storage
