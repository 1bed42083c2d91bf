// Data files: safetensors files of tensor chunks and raw files of bytes entries.
//
// Writers stream straight from caller memory (no staging copy), hash each chunk with
// XXH3-64 on the way, and return only after the file is durable (fdatasync) and closed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dcp/box.h"
#include "dcp/dtype.h"
#include "storage/file_system.h"

namespace dcp::storage {

struct TensorToWrite {
  std::string key;  // the safetensors tensor name
  DType dtype;
  Shape shape;
  std::span<const std::byte> data;
};

struct WrittenRange {
  uint64_t byte_offset = 0;  // absolute, within the file
  uint64_t byte_length = 0;
  uint64_t xxh3 = 0;                 // with block checksums: their digest
  std::vector<uint64_t> block_xxh3;  // one per block when the range spans several
};

struct WrittenFile {
  std::vector<WrittenRange> ranges;  // one per input, same order
  uint64_t size = 0;
};

// The header of a safetensors file: the 8-byte little-endian length, then the JSON (with
// `__metadata__` {"format": "pt"}), padded with spaces so the data starts 8-byte aligned, as the
// safetensors writer does. Built as text, in order, in linear time (an ordered_json object's
// operator[] is a linear search: quadratic in tensors per file); the same bytes as
// ordered_json::dump(). Tensors' data follow one another in the order added.
class SafetensorsHeader {
 public:
  SafetensorsHeader();
  // `__metadata__` holding these entries, in this order.
  explicit SafetensorsHeader(const std::vector<std::pair<std::string, std::string>>& metadata);
  void Add(std::string_view key, DType dtype, const Shape& shape, uint64_t bytes);
  std::string Finish() &&;

 private:
  std::string json_;
  uint64_t pos_ = 0;
};

// Chunks smaller than this are stored together at the front of a data file.
constexpr uint64_t kSmallChunkBytes = uint64_t{1} << 20;

// The order a data file stores chunks of these sizes in: the small ones first, then the rest,
// each in the given order. A load reads a file's small chunks together (a job's replicated
// norms and biases, read by one rank and broadcast): one ranged read, one GET on an object
// store, where plan order would scatter them between large chunks and ask for each alone.
std::vector<size_t> StoredOrder(std::span<const uint64_t> sizes);

// A data file's layout: its header and the order it stores chunks in. Writers and
// `dcp simulate` (checkpoint::LayOutWrites) both take it from here, so a simulated file is
// laid out byte for byte as a written one.
struct ChunkToLayOut {
  std::string_view key;
  DType dtype;
  const Shape* shape;
  uint64_t bytes;
};
struct DataFileLayout {
  std::string header;         // SafetensorsHeader of the chunks in stored order
  std::vector<size_t> order;  // StoredOrder of the chunks given
};
DataFileLayout LayOutDataFile(std::span<const ChunkToLayOut> chunks);

// A valid safetensors file (`__metadata__` {"format": "pt"}) holding `tensors`, stored in
// StoredOrder (its ranges are in the order given). With `block_size`, a tensor longer than one
// block gets one checksum per block (core/checksum.h). With `recycle_from` set and present, that
// file becomes `path` and is overwritten in place (FileSystem::ReuseFile; *recycled says so);
// otherwise a new file.
Result<WrittenFile> WriteSafetensorsFile(FileSystem& fs, const std::string& path,
                                         const std::vector<TensorToWrite>& tensors,
                                         uint64_t block_size = 0,
                                         const std::string& recycle_from = {},
                                         bool* recycled = nullptr);

// The same with a header of the caller's (`header`, as SafetensorsHeader builds it, describing
// `tensors` in order).
Result<WrittenFile> WriteSafetensorsFileWithHeader(FileSystem& fs, const std::string& path,
                                                   const std::string& header,
                                                   const std::vector<TensorToWrite>& tensors);

// The payloads one after another.
Result<WrittenFile> WriteBytesFile(FileSystem& fs, const std::string& path,
                                   const std::vector<std::span<const std::byte>>& payloads);

uint64_t Checksum(std::span<const std::byte> data);

}  // namespace dcp::storage
