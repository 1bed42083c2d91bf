// Reading and committing the global metadata of a checkpoint directory.
#pragma once

#include <string>

#include "dcp/checkpoint.h"
#include "metadata/metadata.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

// The committed metadata of `dir` (the global file, or else the merged per-rank files; or,
// when `dir` is a HuggingFace source -- a .safetensors file, a directory with
// model.safetensors or model.safetensors.index.json -- metadata built from its headers, file
// names relative to DataDirOf(dir), has_checksums false). Errors name the directory:
// kNotFound when `dir` does not exist, kFailedPrecondition when no metadata was committed (not a checkpoint, or a save that never
// finished), kDataLoss when it is corrupt or foreign, kFailedPrecondition for an unsupported
// version.
Result<metadata::Metadata> ReadMetadata(storage::FileSystem& fs, const std::string& dir);
// Decodes metadata bytes read from `dir` (for ranks that received them by broadcast).
Result<metadata::Metadata> DecodeMetadata(std::string_view data, const std::string& dir);
Result<std::string> ReadMetadataBytes(storage::FileSystem& fs, const std::string& dir);

// The directory that the metadata's file names are relative to: `source` itself, or the
// parent directory of a single-file HuggingFace source.
std::string DataDirOf(const std::string& source);

// `md` with opts.strip_prefix / opts.add_prefix applied to its names (metadata/rename.h);
// errors name `dir`.
Result<metadata::Metadata> WithRenamedTensors(metadata::Metadata md, const LoadOptions& opts,
                                              const std::string& dir);

// The commit point of a save: atomically replaces `dir`'s global metadata, or with
// rank >= 0 that rank's own metadata (saves without collectives).
Status CommitMetadata(storage::FileSystem& fs, const std::string& dir, const metadata::Metadata& md,
                      int rank = -1);

}  // namespace dcp::checkpoint
