// Offline verification of a checkpoint directory (`dcp verify`).
#pragma once

#include <cstdint>
#include <span>
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

// The checksummed ranges (stored chunks, bytes entries) of every data file of `md`, each
// file's in file order, from one pass over the metadata: what a copy of a file is checked
// against as it streams by (storage::StreamVerifier). None without checksums.
std::vector<std::vector<storage::StoredRange>> StoredRangesByFile(const metadata::Metadata& md);
// Those of `ranges` lying wholly inside one of `spans` ((offset, length) pairs; all when
// empty): what a sparse copy holding those spans is checked against.
std::vector<storage::StoredRange> RangesWithin(
    std::span<const storage::StoredRange> ranges,
    const std::vector<std::pair<uint64_t, uint64_t>>& spans);

}  // namespace dcp::checkpoint
