// Incremental saves (SaveOptions::incremental_base): a stored chunk whose bytes a base
// checkpoint already holds -- same fqn, dtype and box, every block checksum equal -- is not
// written again; the new metadata references the base's file and byte range instead
// (FileInfo::base, docs/format.md). References are resolved at save time: a chunk the base
// itself referenced points at the directory that holds its bytes, never at another reference.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/status.h"
#include "metadata/metadata.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

// OK when `base` may be the base of a save into `dir`: a sibling directory of it (the same
// parent; references name the base by its directory name), not `dir` itself.
Status CheckIncrementalBase(const std::string& dir, const std::string& base);

// A planned chunk left where a base stores it.
struct Reused {
  uint32_t index = 0;       // among the rank's planned chunks, in plan order
  metadata::FileInfo file;  // in the directory `file.base` (empty: the saving directory's own)
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  uint64_t xxh3 = 0;
  std::vector<uint64_t> block_xxh3;
};

// Whether `data` is the bytes `chunk` stores, judged by its checksums: block by block,
// stopping at the first that differs (a changed chunk costs about one block's hashing).
bool SameBytes(const metadata::StoredChunk& chunk, uint64_t block_size,
               std::span<const std::byte> data);

// The committed metadata of `base`, a checkpoint saved with checksums, encoded (rank 0 reads
// it once and broadcasts it); errors name it.
Result<std::string> ReadIncrementalBase(storage::FileSystem& fs, const std::string& base);

class BaseChunks {
 public:
  // `encoded`: what ReadIncrementalBase returned for `base`, a base of a save into `dir`.
  static Result<BaseChunks> Decode(std::string_view encoded, const std::string& dir,
                                   const std::string& base);

  struct Chunk {
    const std::string* fqn;
    DType dtype;
    const Box* box;
    std::span<const std::byte> data;
  };
  // Find for each of `chunks`, on up to `threads` threads (the caller's among them), each
  // checking a contiguous run of about equal bytes: hashing is the cost of an incremental save,
  // and spare cores divide it.
  std::vector<std::optional<Reused>> FindAll(const std::vector<Chunk>& chunks, int threads) const;
  // The base's copy of `recorded`, a stored chunk of tensor `fqn` in a checkpoint with blocks
  // of `block_size`, when their recorded checksums are equal: a copy of a committed checkpoint
  // needs no hashing to know what the base holds (IncrementalCopy).
  std::optional<Reused> FindRecorded(const std::string& fqn, DType dtype,
                                     const metadata::StoredChunk& recorded,
                                     uint64_t block_size) const;

 private:
  // The base's chunk `box` of tensor `fqn`, when its checksums are this format's.
  const metadata::StoredChunk* Locate(const std::string& fqn, DType dtype, const Box& box) const;
  Reused ReferenceTo(const metadata::StoredChunk& c) const;
  // The base's copy of chunk `box` of tensor `fqn` when it holds exactly `data`.
  std::optional<Reused> Find(const std::string& fqn, DType dtype, const Box& box,
                             std::span<const std::byte> data) const;

  metadata::Metadata md_;
  std::string base_name_;  // the base's directory name
  std::string dir_name_;   // the saving directory's name
};

}  // namespace dcp::checkpoint
