// Offline verification of a checkpoint directory (`dcp verify`).
#pragma once

#include <cstdint>
#include <string>

#include "dcp/checkpoint.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

// Checks the metadata, that every data file is present with its recorded size, and every
// chunk's and bytes entry's checksum. The first problem is returned as an error naming
// the file and the fqn.
Result<VerifyResult> Verify(storage::FileSystem& fs, const std::string& dir);

}  // namespace dcp::checkpoint
