// Which backend a path selects.
#include "storage/file_system.h"
#include "storage/s3/s3_config.h"
#include "storage/s3/s3_file_system.h"

namespace dcp::storage {

bool IsObjectStorePath(const std::string& path) { return s3::IsS3Path(path); }

Result<FileSystem*> FileSystemFor(const std::string& path) {
  if (s3::IsS3Path(path)) {
    DCP_RETURN_IF_ERROR(s3::ParseS3Path(path).status());
    return s3::DefaultS3FileSystem();
  }
  return &PosixFileSystem();
}

}  // namespace dcp::storage
