#include "checkpoint/metadata_io.h"

#include <algorithm>

#include "checkpoint/names.h"
#include "checkpoint/torch_probe.h"
#include "hf/hf_checkpoint.h"
#include "metadata/codec.h"
#include "metadata/merge.h"
#include "metadata/rename.h"

namespace dcp::checkpoint {

namespace {

// A HuggingFace source has no dcp metadata: it is built from the safetensors headers.
Result<MetadataSource> ReadHfMetadata(storage::FileSystem& fs, const std::string& source) {
  DCP_ASSIGN_OR_RETURN(hf::HfSource src, hf::OpenSource(fs, source));
  return MetadataSource{.built = hf::ToMetadata(src)};
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

Result<std::vector<RankSet>> ListRankSets(storage::FileSystem& fs, const std::string& dir) {
  auto names = fs.List(dir);
  if (!names.ok()) return names.status();
  std::map<std::pair<bool, uint64_t>, RankSet> sets;  // (stepped, step)
  for (const std::string& n : *names) {
    uint64_t step = 0;
    bool legacy = false;
    const int r = ParseRankMetadataName(n, &step, &legacy);
    if (r < 0) continue;
    RankSet& set = sets[{!legacy, step}];
    set.legacy = legacy;
    set.step = step;
    set.files[r] = n;
  }
  std::vector<RankSet> out;
  for (auto it = sets.rbegin(); it != sets.rend(); ++it) out.push_back(std::move(it->second));
  return out;
}

Result<std::optional<metadata::Metadata>> ReadCompleteRankSet(storage::FileSystem& fs,
                                                              const std::string& dir,
                                                              const RankSet& set) {
  std::vector<metadata::Metadata> parts;
  // Rank 0's file first: its world size tells, before reading the others, whether the set can
  // be complete.
  if (!set.files.count(0)) return std::optional<metadata::Metadata>();
  for (const auto& [rank, name] : set.files) {
    auto data = storage::ReadWholeFile(fs, storage::JoinPath(dir, name));
    if (!data.ok() && data.status().code() == StatusCode::kNotFound) continue;  // removed since
    if (!data.ok()) return data.status().Annotate("checkpoint " + dir + ": ");
    auto md = metadata::Decode(*data);
    if (!md.ok()) return md.status().Annotate("checkpoint " + dir + ": " + name + ": ");
    const uint32_t world = md->world_size;
    if (rank >= static_cast<int>(world)) {
      return FailedPrecondition("checkpoint " + dir + ": " + name + " is rank " +
                                std::to_string(rank) + " of a job of " + std::to_string(world) +
                                " ranks (files of different saves with the same step?)");
    }
    if (static_cast<int>(parts.size()) != rank) return std::optional<metadata::Metadata>();
    parts.push_back(std::move(md).value());
    if (set.files.size() < parts[0].world_size) return std::optional<metadata::Metadata>();
  }
  if (parts.empty() || parts.size() < parts[0].world_size) {
    return std::optional<metadata::Metadata>();
  }
  // One set holds one step's files (the step is in their names): never two saves' files.
  auto merged = metadata::MergeRankMetadata(parts);
  if (!merged.ok()) return merged.status().Annotate("checkpoint " + dir + ": ");
  return std::optional<metadata::Metadata>(std::move(merged).value());
}

std::string DataDirOf(const std::string& source) { return hf::DataDirOf(source); }

std::string DataFilePath(const std::string& source, const metadata::FileInfo& file) {
  if (file.base.empty()) return storage::JoinPath(DataDirOf(source), file.name);
  const std::string parent = storage::ParentPath(storage::NormalPath(source));
  // A bucket has no siblings (a normal local path always has a parent): a path no file system
  // resolves.
  if (parent.empty()) return "<no sibling of " + source + ">";
  return storage::JoinPath(storage::JoinPath(parent, file.base), file.name);
}

Result<metadata::Metadata> WithRenamedTensors(metadata::Metadata md, const LoadOptions& opts,
                                              const std::string& dir) {
  Status s = metadata::RenameTensors(md, opts.strip_prefix, opts.add_prefix);
  if (!s.ok()) return s.Annotate("checkpoint " + dir + ": ");
  return md;
}

Result<MetadataSource> FindMetadata(storage::FileSystem& fs, const std::string& dir) {
  if (EndsWith(dir, ".safetensors") && hf::DetectSource(fs, dir) == hf::SourceKind::kFile) {
    return ReadHfMetadata(fs, dir);
  }
  // Saves without collectives: the newest complete rank set wins (a save with collectives
  // removes rank sets once it has committed the global file).
  auto sets = ListRankSets(fs, dir);
  if (!sets.ok() && sets.status().code() == StatusCode::kNotFound) {
    return NotFound("checkpoint directory " + dir + " does not exist");
  }
  if (!sets.ok()) return sets.status().Annotate("checkpoint " + dir + ": ");
  std::string incomplete;
  for (const RankSet& set : *sets) {
    DCP_ASSIGN_OR_RETURN(std::optional<metadata::Metadata> md, ReadCompleteRankSet(fs, dir, set));
    if (md) return MetadataSource{.built = std::move(md)};
    if (incomplete.empty()) incomplete = set.files.begin()->second;
  }
  const std::string path = storage::JoinPath(dir, std::string(kMetadataName));
  auto data = storage::ReadWholeFile(fs, path);
  if (data.ok()) return MetadataSource{.encoded = std::move(data).value()};
  if (data.status().code() != StatusCode::kNotFound) {
    return data.status().Annotate("checkpoint " + dir + ": ");
  }
  if (!incomplete.empty()) {
    return FailedPrecondition("checkpoint " + dir + " has per-rank metadata (" + incomplete +
                              ") but no save wrote it on every rank, and no " +
                              std::string(kMetadataName));
  }
  if (hf::DetectSource(fs, dir) != hf::SourceKind::kNone) return ReadHfMetadata(fs, dir);
  return FailedPrecondition("checkpoint " + dir + " has no committed metadata (" +
                            std::string(kMetadataName) +
                            " is missing): not a checkpoint, or its save did not finish");
}

Result<metadata::Metadata> DecodeMetadata(std::string_view data, const std::string& dir) {
  auto md = metadata::Decode(data);
  if (!md.ok()) {
    return md.status().Annotate("checkpoint " + dir + ": " + std::string(kMetadataName) + ": ");
  }
  return md;
}

Result<metadata::Metadata> ReadMetadata(storage::FileSystem& fs, const std::string& dir) {
  DCP_ASSIGN_OR_RETURN(MetadataSource found, FindMetadata(fs, dir));
  if (found.built) return std::move(*found.built);
  return DecodeMetadata(found.encoded, dir);
}

Status CommitMetadata(storage::FileSystem& fs, const std::string& dir, const metadata::Metadata& md,
                      int rank, uint64_t step) {
  const std::string name = rank < 0 ? std::string(kMetadataName) : RankMetadataName(step, rank);
  const std::string tmp = std::string(kTmpSuffixPrefix) + SaveIdHex(md.save_id);
  DCP_RETURN_IF_ERROR(fs.WriteAtomic(storage::JoinPath(dir, name), metadata::Encode(md), tmp));
  // After a global commit (a rank's own metadata is no checkpoint yet): a probe never
  // announces a checkpoint that is not there. Best effort: the checkpoint is committed.
  if (rank < 0) PublishTorchProbe(fs, dir, tmp);
  return OkStatus();
}

}  // namespace dcp::checkpoint
