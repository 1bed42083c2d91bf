#include "hf/hf_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

namespace dcp::hf {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A name the metadata can carry: a plain file name inside the directory.
bool IsPlainFileName(std::string_view n) {
  return !n.empty() && n[0] != '.' && n.find('/') == std::string_view::npos;
}

Status ReadShard(storage::FileSystem& fs, const std::string& dir, ShardFile& shard) {
  const std::string path = storage::JoinPath(dir, shard.name);
  DCP_ASSIGN_OR_RETURN(shard.size, fs.FileSize(path));
  DCP_ASSIGN_OR_RETURN(shard.header, ReadSafetensorsHeader(fs, path));
  return OkStatus();
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
    bool single = false;
    for (const std::string& n : *names) {
      if (n == kIndexFileName) return SourceKind::kIndexedDir;
      single = single || n == kSingleFileName;
    }
    return single ? SourceKind::kSingleFileDir : SourceKind::kNone;
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

  // Every tensor in exactly one file; every index entry where the index says.
  std::unordered_map<std::string_view, uint32_t> where;
  for (uint32_t i = 0; i < src.files.size(); ++i) {
    for (const HeaderTensor& t : src.files[i].header.tensors) {
      auto [it, fresh] = where.emplace(t.name, i);
      if (!fresh) {
        return DataLoss("HuggingFace checkpoint " + path + ": tensor '" + t.name +
                        "' is stored in both " + src.files[it->second].name + " and " +
                        src.files[i].name);
      }
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
  for (uint32_t i = 0; i < src.files.size(); ++i) {
    const ShardFile& f = src.files[i];
    md.files.push_back({f.name, f.size});
    for (const HeaderTensor& t : f.header.tensors) {
      metadata::TensorMeta& tm = md.tensors.emplace_back();
      tm.fqn = t.name;
      tm.dtype = t.dtype;
      tm.global_shape = t.shape;
      tm.chunks.push_back(
          {Box::Whole(t.shape), i, f.header.data_start() + t.begin, t.end - t.begin, /*xxh3=*/0});
    }
  }
  std::sort(md.tensors.begin(), md.tensors.end(),
            [](const auto& a, const auto& b) { return a.fqn < b.fqn; });
  return md;
}

}  // namespace dcp::hf
