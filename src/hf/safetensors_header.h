// Parsing safetensors headers, trusting nothing.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of JSON, then the
// data. The parser checks everything a reader relies on before any tensor byte is touched:
// N capped (kMaxHeaderBytes) and inside the file; the header valid UTF-8 JSON of the
// expected shape (an object of tensor entries plus an optional flat string map
// `__metadata__`), no duplicate keys; every dtype known, at most kMaxDims dimensions;
// `data_offsets` contiguous from 0 with no gap or overlap, each range exactly
// elements x dtype size (overflow-checked, sub-byte dtypes filling whole bytes), and the
// last one ending exactly at the end of the file. Every error is kDataLoss (kInvalidArgument
// for a header too large to be a real one) and names the file and, where one is at fault,
// the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/box.h"
#include "dcp/dtype.h"
#include "dcp/status.h"
#include "storage/file_system.h"

namespace dcp::hf {

// The reference implementation's cap: no real header comes near it, and it bounds what a
// hostile file can make us allocate.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr uint64_t kLengthPrefixBytes = 8;

struct HeaderTensor {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // data_offsets, relative to the first data byte
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t header_length = 0;                   // N: JSON bytes after the 8-byte prefix
  std::vector<HeaderTensor> tensors;            // in data order (by data_offsets)
  std::map<std::string, std::string> metadata;  // `__metadata__`, empty when absent

  // Absolute offset of the first data byte.
  uint64_t data_start() const { return kLengthPrefixBytes + header_length; }
};

// Reads N from the first 8 bytes of a file of `file_size` bytes and checks it: at most
// kMaxHeaderBytes, and 8 + N within the file. `file` names the file in errors.
Result<uint64_t> ParseHeaderLength(std::string_view prefix, uint64_t file_size,
                                   std::string_view file);

// Parses the N JSON bytes of a file of `file_size` bytes (so the data is file_size - 8 - N
// bytes long).
Result<SafetensorsHeader> ParseHeaderJson(std::string_view json, uint64_t file_size,
                                          std::string_view file);

// Both steps over `bytes`, which start at the beginning of a file of `file_size` bytes and
// hold at least its first 8 + N bytes (a whole file in memory qualifies).
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view bytes, uint64_t file_size,
                                                 std::string_view file);

// Reads and parses the header of the file at `path` (only the header is read).
Result<SafetensorsHeader> ReadSafetensorsHeader(storage::FileSystem& fs, const std::string& path);

}  // namespace dcp::hf
