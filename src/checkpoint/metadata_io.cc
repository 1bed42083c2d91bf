#include "checkpoint/metadata_io.h"

#include <algorithm>

#include "checkpoint/names.h"
#include "hf/hf_checkpoint.h"
#include "metadata/codec.h"
#include "metadata/merge.h"
#include "metadata/rename.h"

namespace dcp::checkpoint {

namespace {

// Without a global metadata file, the per-rank files of a save without collectives,
// merged and re-encoded; kNotFound when there are none either.
Result<std::string> ReadRankMetadata(storage::FileSystem& fs, const std::string& dir) {
  auto names = fs.List(dir);
  if (!names.ok()) return names.status();
  std::vector<int> ranks;
  for (const std::string& n : *names) {
    if (int r = ParseRankMetadataName(n); r >= 0) ranks.push_back(r);
  }
  if (ranks.empty()) return NotFound("no metadata");
  std::sort(ranks.begin(), ranks.end());
  std::vector<metadata::Metadata> parts;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] != static_cast<int>(i)) {
      return FailedPrecondition("checkpoint " + dir + " has per-rank metadata but " +
                                RankMetadataName(static_cast<int>(i)) + " is missing");
    }
    const std::string name = RankMetadataName(ranks[i]);
    DCP_ASSIGN_OR_RETURN(std::string data,
                         storage::ReadWholeFile(fs, storage::JoinPath(dir, name)));
    auto md = metadata::Decode(data);
    if (!md.ok()) return md.status().Annotate("checkpoint " + dir + ": " + name + ": ");
    parts.push_back(std::move(md).value());
  }
  auto merged = metadata::MergeRankMetadata(parts);
  if (!merged.ok()) return merged.status().Annotate("checkpoint " + dir + ": ");
  return metadata::Encode(*merged);
}

// A HuggingFace source has no dcp metadata: it is built from the safetensors headers.
Result<std::string> ReadHfMetadata(storage::FileSystem& fs, const std::string& source) {
  DCP_ASSIGN_OR_RETURN(hf::HfSource src, hf::OpenSource(fs, source));
  return metadata::Encode(hf::ToMetadata(src));
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::string DataDirOf(const std::string& source) { return hf::DataDirOf(source); }

Result<metadata::Metadata> WithRenamedTensors(metadata::Metadata md, const LoadOptions& opts,
                                              const std::string& dir) {
  Status s = metadata::RenameTensors(md, opts.strip_prefix, opts.add_prefix);
  if (!s.ok()) return s.Annotate("checkpoint " + dir + ": ");
  return md;
}

Result<std::string> ReadMetadataBytes(storage::FileSystem& fs, const std::string& dir) {
  if (EndsWith(dir, ".safetensors") && hf::DetectSource(fs, dir) == hf::SourceKind::kFile) {
    return ReadHfMetadata(fs, dir);
  }
  const std::string path = storage::JoinPath(dir, std::string(kMetadataName));
  auto data = storage::ReadWholeFile(fs, path);
  if (data.ok()) return data;
  if (data.status().code() != StatusCode::kNotFound) {
    return data.status().Annotate("checkpoint " + dir + ": ");
  }
  auto ranks = ReadRankMetadata(fs, dir);
  if (ranks.ok() || ranks.status().code() != StatusCode::kNotFound) return ranks;
  if (hf::DetectSource(fs, dir) != hf::SourceKind::kNone) return ReadHfMetadata(fs, dir);
  if (auto listed = fs.List(dir); !listed.ok() && listed.status().code() == StatusCode::kNotFound) {
    return NotFound("checkpoint directory " + dir + " does not exist");
  }
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
  DCP_ASSIGN_OR_RETURN(std::string data, ReadMetadataBytes(fs, dir));
  return DecodeMetadata(data, dir);
}

Status CommitMetadata(storage::FileSystem& fs, const std::string& dir, const metadata::Metadata& md,
                      int rank) {
  const std::string name = rank < 0 ? std::string(kMetadataName) : RankMetadataName(rank);
  return storage::WriteFileAtomic(fs, storage::JoinPath(dir, name), metadata::Encode(md),
                                  std::string(kTmpSuffixPrefix) + SaveIdHex(md.save_id));
}

}  // namespace dcp::checkpoint
