// Reading and committing the global metadata of a checkpoint directory.
#pragma once

#include <string>

#include "metadata/metadata.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

// The committed metadata of `dir` (the global file, or else the merged per-rank files). Errors name the directory: kFailedPrecondition when no
// metadata was committed (not a checkpoint, or a save that never finished), kDataLoss when
// it is corrupt or foreign, kFailedPrecondition for an unsupported version.
Result<metadata::Metadata> ReadMetadata(storage::FileSystem& fs, const std::string& dir);
// Decodes metadata bytes read from `dir` (for ranks that received them by broadcast).
Result<metadata::Metadata> DecodeMetadata(std::string_view data, const std::string& dir);
Result<std::string> ReadMetadataBytes(storage::FileSystem& fs, const std::string& dir);

// The commit point of a save: atomically replaces `dir`'s global metadata, or with
// rank >= 0 that rank's own metadata (saves without collectives).
Status CommitMetadata(storage::FileSystem& fs, const std::string& dir,
                      const metadata::Metadata& md, int rank = -1);

}  // namespace dcp::checkpoint
