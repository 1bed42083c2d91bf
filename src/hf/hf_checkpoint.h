// HuggingFace checkpoints as a source: detecting and opening them, and describing them as dcp
// metadata so the ordinary loader reads them.
//
// A HuggingFace source is one of
//   - a `.safetensors` file;
//   - a directory holding `model.safetensors.index.json` (its `weight_map` maps each tensor
//     name to the shard file holding it), taking precedence;
//   - a directory holding `model.safetensors`;
//   - a directory of the files torch's HuggingFaceStorageWriter writes without an index
//     (`shard-00001-model-00001-of-00002.safetensors`, `model-00001-of-00002.safetensors`):
//     every such file in it is read, as torch's HuggingFaceStorageReader does.
// A file whose `__metadata__` holds `DCP_SHARDING_INFO` (torch_hf_format.h) stores chunks of
// tensors at the offsets it gives; a tensor may then be stored in several files.
// Every header is parsed and checked (safetensors_header.h) when the source is opened.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/status.h"
#include "hf/safetensors_header.h"
#include "metadata/metadata.h"
#include "storage/file_system.h"

namespace dcp::hf {

inline constexpr std::string_view kSingleFileName = "model.safetensors";
inline constexpr std::string_view kIndexFileName = "model.safetensors.index.json";

enum class SourceKind { kNone, kFile, kSingleFileDir, kIndexedDir, kTorchFilesDir };

// What `path` is, from names and file presence only (nothing is parsed).
SourceKind DetectSource(storage::FileSystem& fs, const std::string& path);

// The directory that holds a source's data files: the parent directory of a file source
// ("." when the path has none), else `path` itself. Lexical, plus one stat for paths ending
// in ".safetensors".
std::string DataDirOf(const std::string& path);

struct ShardFile {
  std::string name;  // relative to HfSource::data_dir, no '/'
  uint64_t size = 0;
  SafetensorsHeader header;
  // Per header tensor: where its data sits in the whole tensor (zeros without sharding info).
  std::vector<Shape> offsets;
};

struct HfSource {
  std::string path;      // as given
  std::string data_dir;  // the directory holding `files`
  SourceKind kind = SourceKind::kNone;
  std::vector<ShardFile> files;  // sorted by name

  uint64_t TotalTensorBytes() const;
  uint64_t TotalTensors() const;
};

// Opens and checks a source: kFailedPrecondition when `path` is no HuggingFace source,
// kNotFound for a shard the index names that is missing, kDataLoss for a malformed header,
// index or sharding info, a tensor stored in two files (overlapping chunks, or whole in
// either), chunks of one tensor that disagree on dtype or rank, or an index entry its shard
// does not hold.
Result<HfSource> OpenSource(storage::FileSystem& fs, const std::string& path);

// The source as dcp metadata: one stored chunk per tensor and file (the whole tensor, or the
// chunk its sharding info places; the global shape reaches the farthest chunk), file names
// relative to data_dir, no checksums (has_checksums = false), world_size 1.
metadata::Metadata ToMetadata(const HfSource& src);

}  // namespace dcp::hf
