// Reading and committing the global metadata of a checkpoint directory.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dcp/checkpoint.h"
#include "metadata/metadata.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

// The committed metadata of `dir` (the merged per-rank files of the newest complete rank set
// -- see RankSet -- or else the global file; an incomplete newer rank set, a save without
// collectives that did not finish on every rank, is ignored; or,
// when `dir` is a HuggingFace source -- a .safetensors file, a directory with
// model.safetensors or model.safetensors.index.json -- metadata built from its headers, file
// names relative to DataDirOf(dir), has_checksums false). Errors name the directory:
// kNotFound when `dir` does not exist, kFailedPrecondition when no metadata was committed (not a
// checkpoint, or a save that never finished), kDataLoss when it is corrupt or foreign,
// kFailedPrecondition for an unsupported version.
Result<metadata::Metadata> ReadMetadata(storage::FileSystem& fs, const std::string& dir);
// Decodes metadata bytes read from `dir` (for ranks that received them by broadcast).
Result<metadata::Metadata> DecodeMetadata(std::string_view data, const std::string& dir);
// What ReadMetadata finds, before decoding: the committed file's bytes, or the metadata built
// from per-rank files or HuggingFace headers (never encoded and decoded again on the reader;
// a load encodes it only to broadcast it).
struct MetadataSource {
  std::string encoded;
  std::optional<metadata::Metadata> built;
};
Result<MetadataSource> FindMetadata(storage::FileSystem& fs, const std::string& dir);

// The directory that the metadata's file names are relative to: `source` itself, or the
// parent directory of a single-file HuggingFace source.
std::string DataDirOf(const std::string& source);

// Where a data file of the checkpoint `source` is: in DataDirOf(source), or for a reference
// (FileInfo::base) in that sibling directory of `source`.
std::string DataFilePath(const std::string& source, const metadata::FileInfo& file);

// `md` with opts.strip_prefix / opts.add_prefix applied to its names (metadata/rename.h);
// errors name `dir`.
Result<metadata::Metadata> WithRenamedTensors(metadata::Metadata md, const LoadOptions& opts,
                                              const std::string& dir);

// The commit point of a save: atomically replaces `dir`'s global metadata, or with
// rank >= 0 that rank's own metadata of save `step` (saves without collectives).
Status CommitMetadata(storage::FileSystem& fs, const std::string& dir, const metadata::Metadata& md,
                      int rank = -1, uint64_t step = 0);

// The per-rank metadata files of one save without collectives (one step, or the older
// unstepped names), by rank.
struct RankSet {
  bool legacy = false;  // dcp.metadata.rank<R>: older than every stepped set
  uint64_t step = 0;
  std::map<int, std::string> files;
  bool NewerThan(const RankSet& o) const { return legacy != o.legacy ? o.legacy : step > o.step; }
};
// The rank sets in `dir`, newest first.
Result<std::vector<RankSet>> ListRankSets(storage::FileSystem& fs, const std::string& dir);
// The merged metadata of `set` when it is complete (a file for every rank of the world size
// its files record); nullopt when ranks are missing (a save that did not finish on every
// rank). Errors: unreadable or corrupt files, files that disagree (world size, tensors).
Result<std::optional<metadata::Metadata>> ReadCompleteRankSet(storage::FileSystem& fs,
                                                              const std::string& dir,
                                                              const RankSet& set);

}  // namespace dcp::checkpoint
