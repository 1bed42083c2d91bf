// The global metadata: the contract between a save and every later load.
//
// For every fqn: dtype, global shape and the stored chunks, each with the data file, byte
// range and XXH3-64 checksum where it lives. Plain structs; the codec (codec.h) turns them
// into the on-disk encoding specified in docs/format.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcp/box.h"
#include "dcp/dtype.h"

namespace dcp::metadata {

inline constexpr uint32_t kFormatVersion = 1;

struct FileInfo {
  std::string name;   // relative to the checkpoint directory
  uint64_t size = 0;  // expected size in bytes, checked on load and verify
};

struct StoredChunk {
  Box box;
  uint32_t file = 0;         // index into Metadata::files
  uint64_t byte_offset = 0;  // within the file
  uint64_t byte_length = 0;  // = elements x dtype bits / 8 (checked by the decoder)
  uint64_t xxh3 = 0;
};

struct TensorMeta {
  std::string fqn;
  DType dtype = DType::kF32;
  Shape global_shape;
  std::vector<StoredChunk> chunks;  // disjoint; sorted by box
};

struct BytesMeta {
  std::string fqn;
  uint32_t file = 0;
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  uint64_t xxh3 = 0;
};

struct Metadata {
  uint64_t save_id = 0;     // names this save's data files; new for every save
  uint32_t world_size = 1;  // ranks that wrote it
  // False for sources written without checksums (HuggingFace files): every xxh3 is 0 and
  // loaders check sizes only. Encoded as header flag kFlagNoChecksums.
  bool has_checksums = true;
  std::vector<FileInfo> files;
  std::vector<TensorMeta> tensors;  // sorted by fqn
  std::vector<BytesMeta> bytes;     // sorted by fqn

  uint64_t TotalChunks() const;
  uint64_t TotalDataBytes() const;                           // tensor chunks + bytes entries
  const TensorMeta* FindTensor(std::string_view fqn) const;  // binary search
  const BytesMeta* FindBytes(std::string_view fqn) const;
};

}  // namespace dcp::metadata
