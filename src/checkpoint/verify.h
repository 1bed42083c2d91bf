// Offline verification of a checkpoint directory (`dcp verify`).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dcp/checkpoint.h"
#include "metadata/metadata.h"
#include "storage/chunk_reader.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

// Checks the metadata, that every data file is present with its recorded size, and every
// chunk's and bytes entry's checksum. The first problem is returned as an error naming
// the file and the fqn.
Result<VerifyResult> Verify(storage::FileSystem& fs, const std::string& dir);

// The checksummed ranges (stored chunks, bytes entries) of data file `file` that lie wholly
// inside `spans` (all when empty), in file order: what a copy of those spans is checked
// against as it streams by (storage::StreamVerifier). None without checksums.
std::vector<storage::StoredRange> StoredRangesWithin(
    const metadata::Metadata& md, uint32_t file,
    const std::vector<std::pair<uint64_t, uint64_t>>& spans);

}  // namespace dcp::checkpoint
