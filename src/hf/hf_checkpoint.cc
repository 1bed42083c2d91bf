#include "hf/hf_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "hf/torch_hf_format.h"

namespace dcp::hf {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A name the metadata can carry: a plain file name inside the directory.
bool IsPlainFileName(std::string_view n) {
  return !n.empty() && n[0] != '.' && n.find('/') == std::string_view::npos;
}

// The chunk offsets of the file's tensors (zeros without sharding info).
Status ReadShardingInfo(const std::string& path, ShardFile& shard) {
  auto it = shard.header.metadata.find(std::string(kShardingInfoKey));
  if (it == shard.header.metadata.end()) {
    shard.offsets.clear();
    for (const HeaderTensor& t : shard.header.tensors) {
      shard.offsets.push_back(Shape::Zeros(t.shape.rank()));
    }
    return OkStatus();
  }
  DCP_ASSIGN_OR_RETURN(shard.offsets, ParseShardingInfo(it->second, shard.header.tensors, path));
  return OkStatus();
}

Status ReadShard(storage::FileSystem& fs, const std::string& dir, ShardFile& shard) {
  const std::string path = storage::JoinPath(dir, shard.name);
  DCP_ASSIGN_OR_RETURN(shard.size, fs.FileSize(path));
  DCP_ASSIGN_OR_RETURN(shard.header, ReadSafetensorsHeader(fs, path));
  return ReadShardingInfo(path, shard);
}

bool Sharded(const ShardFile& f) {
  return f.header.metadata.count(std::string(kShardingInfoKey)) > 0;
}

// The shard names of an index, checking its shape: {"weight_map": {name: file, ...}, ...}.
Result<std::map<std::string, std::string>> ReadIndex(storage::FileSystem& fs,
                                                     const std::string& path) {
  DCP_ASSIGN_OR_RETURN(std::string text, storage::ReadWholeFile(fs, path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLoss("index " + path + " is not valid JSON");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return DataLoss("index " + path + " has no \"weight_map\" object");
  }
  std::map<std::string, std::string> map;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) {
      return DataLoss("index " + path + ": weight_map entry '" + name + "' is not a file name");
    }
    map[name] = file.get<std::string>();
  }
  return map;
}

}  // namespace

SourceKind DetectSource(storage::FileSystem& fs, const std::string& path) {
  auto names = fs.List(path);
  if (names.ok()) {
    bool single = false, torch_files = false;
    for (const std::string& n : *names) {
      if (n == kIndexFileName) return SourceKind::kIndexedDir;
      single = single || n == kSingleFileName;
      torch_files = torch_files || IsTorchHfFileName(n);
    }
    return single        ? SourceKind::kSingleFileDir
           : torch_files ? SourceKind::kTorchFilesDir
                         : SourceKind::kNone;
  }
  if (EndsWith(path, ".safetensors") && fs.FileSize(path).ok()) return SourceKind::kFile;
  return SourceKind::kNone;
}

std::string DataDirOf(const std::string& path) {
  std::error_code ec;
  if (!EndsWith(path, ".safetensors") || !std::filesystem::is_regular_file(path, ec)) {
    return path;
  }
  std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

uint64_t HfSource::TotalTensorBytes() const {
  uint64_t n = 0;
  for (const ShardFile& f : files) {
    for (const HeaderTensor& t : f.header.tensors) n += t.end - t.begin;
  }
  return n;
}

uint64_t HfSource::TotalTensors() const {
  uint64_t n = 0;
  for (const ShardFile& f : files) n += f.header.tensors.size();
  return n;
}

Result<HfSource> OpenSource(storage::FileSystem& fs, const std::string& path) {
  HfSource src;
  src.path = path;
  src.kind = DetectSource(fs, path);
  std::map<std::string, std::string> weight_map;
  switch (src.kind) {
    case SourceKind::kNone:
      return FailedPrecondition(path +
                                " is not a HuggingFace checkpoint (neither a .safetensors "
                                "file nor a directory with " +
                                std::string(kSingleFileName) + " or " +
                                std::string(kIndexFileName) + ")");
    case SourceKind::kFile: {
      src.data_dir = DataDirOf(path);
      std::string name = std::filesystem::path(path).filename().string();
      if (!IsPlainFileName(name)) {
        return InvalidArgument("cannot read " + path + ": a file name starting with '.'");
      }
      src.files.push_back({name, 0, {}});
      break;
    }
    case SourceKind::kSingleFileDir:
      src.data_dir = path;
      src.files.push_back({std::string(kSingleFileName), 0, {}});
      break;
    case SourceKind::kTorchFilesDir: {
      src.data_dir = path;
      DCP_ASSIGN_OR_RETURN(auto names, fs.List(path));
      std::sort(names.begin(), names.end());
      for (const std::string& n : names) {
        if (IsTorchHfFileName(n)) src.files.push_back({n, 0, {}});
      }
      break;
    }
    case SourceKind::kIndexedDir: {
      src.data_dir = path;
      const std::string index = storage::JoinPath(path, std::string(kIndexFileName));
      DCP_ASSIGN_OR_RETURN(weight_map, ReadIndex(fs, index));
      std::vector<std::string> shards;
      for (const auto& [name, file] : weight_map) shards.push_back(file);
      std::sort(shards.begin(), shards.end());
      shards.erase(std::unique(shards.begin(), shards.end()), shards.end());
      for (const std::string& s : shards) {
        if (!IsPlainFileName(s)) {
          return DataLoss("index " + index + " names shard '" + s +
                          "', which is not a file name in " + path);
        }
        if (!fs.FileSize(storage::JoinPath(path, s)).ok()) {
          return NotFound("index " + index + " names shard " + s + ", which is missing from " +
                          path);
        }
        src.files.push_back({s, 0, {}});
      }
      break;
    }
  }
  for (ShardFile& f : src.files) DCP_RETURN_IF_ERROR(ReadShard(fs, src.data_dir, f));

  // Every tensor in exactly one file, or in chunks of sharded files that agree on its dtype and
  // rank and do not overlap; every index entry where the index says.
  std::unordered_map<std::string_view, uint32_t> where;
  std::unordered_map<std::string_view, std::vector<std::pair<uint32_t, size_t>>> chunks;
  for (uint32_t i = 0; i < src.files.size(); ++i) {
    const ShardFile& f = src.files[i];
    for (size_t k = 0; k < f.header.tensors.size(); ++k) {
      const HeaderTensor& t = f.header.tensors[k];
      auto [it, fresh] = where.emplace(t.name, i);
      chunks[t.name].push_back({i, k});
      const ShardFile& first = src.files[it->second];
      if (fresh) continue;
      const HeaderTensor& t0 = first.header.tensors[chunks[t.name].front().second];
      if (!Sharded(first) || !Sharded(f) || t0.dtype != t.dtype ||
          t0.shape.rank() != t.shape.rank()) {
        return DataLoss("HuggingFace checkpoint " + path + ": tensor '" + t.name +
                        "' is stored in both " + first.name + " and " + f.name +
                        (Sharded(first) && Sharded(f) ? " with different dtypes or ranks"
                                                      : " (not as chunks of it)"));
      }
    }
  }
  for (const auto& entry : chunks) {
    // Not a structured binding: lambdas cannot capture those before C++20 compilers catch up.
    const std::string_view name = entry.first;
    const auto& list = entry.second;
    auto box_of = [&](size_t n) {
      const ShardFile& f = src.files[list[n].first];
      return Box{f.offsets[list[n].second], f.header.tensors[list[n].second].shape};
    };
    std::vector<Box> boxes;
    Shape whole = Shape::Zeros(box_of(0).rank());
    for (size_t n = 0; n < list.size(); ++n) {
      boxes.push_back(box_of(n));
      for (int d = 0; d < whole.rank(); ++d) {
        whole[d] = std::max(whole[d], boxes.back().offsets[d] + boxes.back().lengths[d]);
      }
    }
    const DType dtype = src.files[list[0].first].header.tensors[list[0].second].dtype;
    auto elements = whole.NumElements();
    if (!elements || !DTypeBytes(dtype, *elements)) {
      return DataLoss("HuggingFace checkpoint " + path + ": tensor '" + std::string(name) +
                      "' of shape " + whole.ToString() +
                      " (where its chunks reach) is too large or does not fill whole bytes");
    }
    if (list.size() < 2) continue;
    if (auto pair = FindOverlap(boxes)) {
      return DataLoss("HuggingFace checkpoint " + path + ": tensor '" + std::string(name) +
                      "' has overlapping chunks " + boxes[pair->first].ToString() + " in " +
                      src.files[list[pair->first].first].name + " and " +
                      boxes[pair->second].ToString() + " in " +
                      src.files[list[pair->second].first].name);
    }
  }
  for (const auto& [name, file] : weight_map) {
    auto it = where.find(name);
    if (it == where.end() || src.files[it->second].name != file) {
      return DataLoss("index " + storage::JoinPath(path, std::string(kIndexFileName)) +
                      " places tensor '" + name + "' in " + file + ", which does not hold it");
    }
  }
  return src;
}

metadata::Metadata ToMetadata(const HfSource& src) {
  metadata::Metadata md;
  md.world_size = 1;
  md.has_checksums = false;
  std::map<std::string_view, metadata::TensorMeta> tensors;
  for (uint32_t i = 0; i < src.files.size(); ++i) {
    const ShardFile& f = src.files[i];
    md.files.push_back({f.name, f.size});
    for (size_t k = 0; k < f.header.tensors.size(); ++k) {
      const HeaderTensor& t = f.header.tensors[k];
      const Shape& at = f.offsets[k];  // one per tensor (ReadShard)
      metadata::TensorMeta& tm = tensors[t.name];
      if (tm.chunks.empty()) {
        tm.fqn = t.name;
        tm.dtype = t.dtype;
        tm.global_shape = Shape::Zeros(t.shape.rank());
      }
      for (int d = 0; d < t.shape.rank(); ++d) {
        tm.global_shape[d] = std::max(tm.global_shape[d], at[d] + t.shape[d]);
      }
      tm.chunks.push_back(
          {Box{at, t.shape}, i, f.header.data_start() + t.begin, t.end - t.begin, /*xxh3=*/0});
    }
  }
  for (auto& [name, tm] : tensors) {
    std::sort(tm.chunks.begin(), tm.chunks.end(),
              [](const auto& a, const auto& b) { return a.box < b.box; });
    md.tensors.push_back(std::move(tm));
  }
  return md;
}

}  // namespace dcp::hf
