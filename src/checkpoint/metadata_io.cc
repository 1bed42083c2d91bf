#include "checkpoint/metadata_io.h"

#include "checkpoint/names.h"
#include "metadata/codec.h"

namespace dcp::checkpoint {

Result<std::string> ReadMetadataBytes(storage::FileSystem& fs, const std::string& dir) {
  const std::string path = storage::JoinPath(dir, std::string(kMetadataName));
  auto data = storage::ReadWholeFile(fs, path);
  if (!data.ok()) {
    if (data.status().code() == StatusCode::kNotFound) {
      return FailedPrecondition("checkpoint " + dir + " has no committed metadata (" +
                                std::string(kMetadataName) +
                                " is missing): not a checkpoint, or its save did not finish");
    }
    return data.status().Annotate("checkpoint " + dir + ": ");
  }
  return data;
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

Status CommitMetadata(storage::FileSystem& fs, const std::string& dir,
                      const metadata::Metadata& md) {
  return storage::WriteFileAtomic(fs, storage::JoinPath(dir, std::string(kMetadataName)),
                                  metadata::Encode(md),
                                  std::string(kTmpSuffixPrefix) + SaveIdHex(md.save_id));
}

}  // namespace dcp::checkpoint
