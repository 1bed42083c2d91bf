// What a checkpoint holds, without loading it: the global metadata (`dcp::read_metadata`,
// declared in dcp/checkpoint.h, returns it).
//
// For every fqn: dtype, global shape and the stored chunks, each with the data file, byte
// range and XXH3-64 checksum where it lives; and the bytes entries. Plain values, owned by the
// caller. The on-disk encoding is specified in docs/format.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/box.h"
#include "dcp/dtype.h"

namespace dcp {

struct FileInfo {
  std::string name;   // the file's name in its directory
  uint64_t size = 0;  // expected size in bytes, checked on load and verify
  // Empty: the file is in the checkpoint's own directory. Otherwise the name of a sibling
  // directory (same parent) holding it: an incremental save's reference to bytes a base
  // checkpoint stored (SaveOptions::incremental_base; format version 4).
  std::string base;
};

struct StoredChunk {
  Box box;
  uint32_t file = 0;         // index into Metadata::files
  uint64_t byte_offset = 0;  // within the file
  uint64_t byte_length = 0;  // = elements x dtype bits / 8
  // XXH3-64 of the chunk's bytes; for a chunk with block checksums, of those checksums
  // (each a little-endian u64, in order).
  uint64_t xxh3 = 0;
  // One XXH3-64 per Metadata::block_size bytes of the chunk (the last block may be short),
  // when the chunk spans more than one block; empty otherwise. They let a load read and
  // verify only the blocks it needs.
  std::vector<uint64_t> block_xxh3;
};

struct TensorMeta {
  std::string fqn;
  DType dtype = DType::kF32;
  Shape global_shape;
  std::vector<StoredChunk> chunks;  // disjoint; sorted by box
  std::string path;                 // the saver's nesting path (StateEntry::path); may be empty
};

struct BytesMeta {
  std::string fqn;
  uint32_t file = 0;
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  uint64_t xxh3 = 0;
  std::string path;  // as TensorMeta::path
};

struct Metadata {
  uint64_t save_id = 0;     // names this save's data files; new for every save
  uint32_t world_size = 1;  // ranks that wrote it
  // False for sources written without checksums (HuggingFace files): every xxh3 is 0 and
  // loaders check sizes only.
  bool has_checksums = true;
  // Bytes per checksum block of tensor chunks (format version 3); 0: every chunk has one
  // checksum (versions 1 and 2, HuggingFace sources), so a partial read verifies the whole
  // chunk.
  uint64_t block_size = 0;
  std::vector<FileInfo> files;
  std::vector<TensorMeta> tensors;  // sorted by fqn
  std::vector<BytesMeta> bytes;     // sorted by fqn

  uint64_t TotalChunks() const;
  uint64_t TotalDataBytes() const;                           // tensor chunks + bytes entries
  const TensorMeta* FindTensor(std::string_view fqn) const;  // binary search; null if absent
  const BytesMeta* FindBytes(std::string_view fqn) const;
  // Blocks a chunk of `byte_length` bytes has block checksums for (0: one checksum).
  uint64_t NumBlocks(uint64_t byte_length) const;
};

// Blocks a chunk of `byte_length` bytes has checksums for with blocks of `block_size`
// (0: one checksum for the chunk).
inline uint64_t NumBlocks(uint64_t block_size, uint64_t byte_length) {
  return block_size == 0 || byte_length <= block_size ? 0 : (byte_length - 1) / block_size + 1;
}
inline uint64_t Metadata::NumBlocks(uint64_t byte_length) const {
  return dcp::NumBlocks(block_size, byte_length);
}

// The `dcp inspect --json` document (schema in docs/format.md; scripts may rely on its keys):
// files, every tensor with its chunks, bytes entries and totals.
std::string MetadataToJson(const Metadata& md, int indent = 2);

// For people (may change): one line per tensor and bytes entry, then totals; with
// `list_chunks`, each tensor's chunks follow it.
std::string MetadataSummary(const Metadata& md, bool list_chunks = false);

}  // namespace dcp
