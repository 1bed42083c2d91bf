// File names inside a checkpoint directory (docs/format.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dcp::checkpoint {

inline constexpr std::string_view kMetadataName = "dcp.metadata";
inline constexpr std::string_view kTmpSuffixPrefix = ".tmp-";

std::string SaveIdHex(uint64_t save_id);
std::string DataFileName(uint64_t save_id, int rank);   // data-<id>-r<rank>.safetensors
std::string BytesFileName(uint64_t save_id, int rank);  // data-<id>-r<rank>.bytes
// True for names a dcp save writes (data files, metadata tmp files): the only files a
// save may garbage-collect.
bool IsDcpDataFileName(std::string_view name);
bool IsMetadataTmpName(std::string_view name);
// dcp.lock.stale-<id>: a stale save lock moved aside while being taken over.
bool IsStaleLockName(std::string_view name);

}  // namespace dcp::checkpoint

namespace dcp::checkpoint {

// Per-rank metadata, written when saving without collectives: dcp.metadata.rank<R>.
std::string RankMetadataName(int rank);
// The rank of a per-rank metadata file name; -1 for any other name.
int ParseRankMetadataName(std::string_view name);

}  // namespace dcp::checkpoint
