// Checksums of stored bytes (docs/format.md, section 3): XXH3-64 (seed 0) of a chunk, or,
// for a chunk with block checksums, of each fixed-size block, and a digest of those.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace dcp {

uint64_t Xxh3(std::span<const std::byte> data);

// XXH3-64 of `block_xxh3` laid out as little-endian u64s: the checksum of a chunk that has
// block checksums.
uint64_t BlockDigest(std::span<const uint64_t> block_xxh3);

// Hashes a stream of bytes: one XXH3-64 over all of it or, with a block size, one per
// `block_size` bytes (the last block may be short).
class StreamHasher {
 public:
  // block_size 0: one checksum.
  explicit StreamHasher(uint64_t block_size = 0);
  ~StreamHasher();
  StreamHasher(const StreamHasher&) = delete;
  StreamHasher& operator=(const StreamHasher&) = delete;

  void Update(std::span<const std::byte> data);
  // The checksum of everything seen; with more than one block, BlockDigest of
  // *blocks (which then holds one checksum per block; left empty otherwise).
  uint64_t Finish(std::vector<uint64_t>* blocks);
  // With a block size: the checksum of every block seen, the last possibly short (none for
  // no bytes).
  std::vector<uint64_t> FinishBlocks();

 private:
  struct State;
  std::unique_ptr<State> st_;
  uint64_t block_size_;
  uint64_t in_block_ = 0;  // bytes of the current block seen
  uint64_t total_ = 0;
  std::vector<uint64_t> blocks_;
};

}  // namespace dcp
