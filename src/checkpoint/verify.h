// Offline verification of a checkpoint directory (`dcp verify`).
#pragma once

#include <cstdint>
#include <string>

#include "storage/file_system.h"

namespace dcp::checkpoint {

struct VerifyReport {
  uint64_t files = 0;
  uint64_t tensors = 0;
  uint64_t chunks = 0;
  uint64_t bytes_entries = 0;
  uint64_t bytes_checked = 0;
  double seconds = 0;
};

// Checks the metadata, that every data file is present with its recorded size, and every
// chunk's and bytes entry's checksum. The first problem is returned as an error naming
// the file and the fqn.
Result<VerifyReport> Verify(storage::FileSystem& fs, const std::string& dir);

}  // namespace dcp::checkpoint
