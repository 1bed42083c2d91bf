// The public entry points: the internal Result-returning calls on the real file system,
// errors thrown as dcp::Error.
#include "checkpoint/load.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/save.h"
#include "checkpoint/verify.h"
#include "dcp/checkpoint.h"

namespace dcp {

SaveResult save(const StateDict& sd, const std::string& dir, const SaveOptions& opts) {
  return ValueOrThrow(checkpoint::Save(sd, dir, opts, storage::PosixFileSystem()));
}

LoadResult load(StateDict& sd, const std::string& dir, const LoadOptions& opts) {
  return ValueOrThrow(checkpoint::Load(sd, dir, opts, storage::PosixFileSystem()));
}

Metadata read_metadata(const std::string& dir) {
  return ValueOrThrow(checkpoint::ReadMetadata(storage::PosixFileSystem(), dir));
}

VerifyResult verify(const std::string& dir) {
  return ValueOrThrow(checkpoint::Verify(storage::PosixFileSystem(), dir));
}

}  // namespace dcp
