// The public entry points: the internal Result-returning calls on the real file system,
// errors thrown as dcp::Error.
#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "dcp/checkpoint.h"

namespace dcp {

SaveResult save(const StateDict& sd, const std::string& dir, const SaveOptions& opts) {
  return ValueOrThrow(checkpoint::Save(sd, dir, opts, storage::PosixFileSystem()));
}

LoadResult load(StateDict& sd, const std::string& dir, const LoadOptions& opts) {
  return ValueOrThrow(checkpoint::Load(sd, dir, opts, storage::PosixFileSystem()));
}

}  // namespace dcp
