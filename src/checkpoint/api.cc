// The public entry points: the internal Result-returning calls on the file system of the
// path (storage::FileSystemFor: POSIX, or S3 for s3:// ids),
// errors thrown as dcp::Error.
#include "checkpoint/load.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/save.h"
#include "checkpoint/verify.h"
#include "dcp/checkpoint.h"
#include "storage/s3/s3_client.h"

namespace dcp {
namespace {

storage::FileSystem& FsFor(const std::string& dir) {
  return *ValueOrThrow(storage::FileSystemFor(dir));
}

}  // namespace

SaveResult save(const StateDict& sd, const std::string& dir, const SaveOptions& opts) {
  return ValueOrThrow(checkpoint::Save(sd, dir, opts, FsFor(dir)));
}

LoadResult load(StateDict& sd, const std::string& dir, const LoadOptions& opts) {
  return ValueOrThrow(checkpoint::Load(sd, dir, opts, FsFor(dir)));
}

Metadata read_metadata(const std::string& dir) {
  return ValueOrThrow(checkpoint::ReadMetadata(FsFor(dir), dir));
}

uint64_t object_store_requests() { return storage::s3::DefaultS3ClientRequests(); }

VerifyResult verify(const std::string& dir) {
  return ValueOrThrow(checkpoint::Verify(FsFor(dir), dir));
}

}  // namespace dcp
