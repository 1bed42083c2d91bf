// Reading a stored chunk into destination memory.
//
// A load reads a stored chunk once for all the destination chunks of the rank that need
// part of it. When one destination takes the whole chunk as one contiguous run, the chunk
// is read straight into that memory and the other destinations copy from there. Otherwise
// only the blocks the destinations need are streamed through a bounded bounce buffer and
// scattered run by run, each block verified: with block checksums (format version 3) the
// blocks a destination touches, without them (versions 1 and 2) the whole chunk, which its
// one checksum covers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
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
  // Block checksums (one per block_size bytes); empty: xxh3 covers the whole range.
  uint64_t block_size = 0;
  std::span<const uint64_t> block_xxh3;
};

// Copies `target`'s runs out of a whole stored chunk already in memory.
void ScatterFromMemory(const ChunkTarget& target, std::span<const std::byte> chunk);

// Reads the whole range into `dst` (range.byte_length bytes), checking its checksums when
// `verify`.
Status ReadRangeInto(ReadableFile& file, const StoredRange& range, bool verify, std::byte* dst,
                     uint64_t* bytes_read);

// Reads the whole range through `bounce` (bounded) and checks every checksum.
Status VerifyRange(ReadableFile& file, const StoredRange& range, std::vector<std::byte>& bounce,
                   uint64_t* bytes_read);

// The span of the stored chunk (offsets within it) ReadStoredChunk reads for one target with
// `runs`: from the first to the last block it needs (the whole chunk when one checksum covers
// it), or from the first to the last needed byte when not verifying; blocks in between that it
// skips are included. Empty for no runs.
ByteRange BytesReadFor(const StoredRange& range, bool verify, const CopyRuns& runs);

// Fills every target from the stored chunk, reading each needed byte from storage once (see
// the top of this file). Fails with kDataLoss on a checksum mismatch (destination memory
// then holds unverified bytes and must not be used). Without `verify`, reads only the blocks
// (1 MiB pieces without block checksums) the targets need, clipped to their first and last
// byte. Adds the bytes read from storage to *bytes_read.
Status ReadStoredChunk(ReadableFile& file, const StoredRange& range, bool verify,
                       std::span<const ChunkTarget> targets, std::vector<std::byte>& bounce,
                       uint64_t* bytes_read);

// Checks the stored ranges of one file against their checksums as the file's bytes stream by,
// in ascending offsets (pieces may skip bytes no range covers): a copy verified as it is
// received, without reading it back. `path` names the file in errors.
class StreamVerifier {
 public:
  // `ranges`: sorted by offset, disjoint, each to be seen whole; their checksum spans must
  // outlive this object.
  StreamVerifier(std::vector<StoredRange> ranges, std::string path);
  ~StreamVerifier();
  StreamVerifier(StreamVerifier&&) noexcept;

  // The bytes at file offset `offset`: kDataLoss on a checksum mismatch, or when a range's
  // bytes were skipped; kInternal for bytes before those already added.
  Status Add(uint64_t offset, std::span<const std::byte> data);
  // Every range was seen whole (else kDataLoss).
  Status Finish();

 private:
  class RangeState;  // the hash of the range being seen
  Status Missing() const;

  std::vector<StoredRange> ranges_;
  std::string path_;
  size_t next_ = 0;    // the first range not yet checked
  uint64_t seen_ = 0;  // of its bytes
  uint64_t end_ = 0;   // of the bytes added so far
  std::unique_ptr<RangeState> open_;
};

}  // namespace dcp::storage
