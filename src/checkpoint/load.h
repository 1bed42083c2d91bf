// Load, through the metadata -> planner -> storage layers, on any Comm.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dcp/checkpoint.h"
#include "metadata/metadata.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

Result<LoadResult> Load(StateDict& sd, const std::string& dir, const LoadOptions& opts,
                        storage::FileSystem& fs);

// Bytes [offset, offset + length) of data file `file` (an index into the metadata's files).
struct ReadSpan {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A load whose ranks cannot all read every file where it is (the memory tier's restore: each
// host holds some files): the plan prefers readers that can, and the caller brings the rest.
struct LoadHooks {
  // [rank][file]: see planner::BroadcastPlanOptions::readable.
  const std::vector<std::vector<bool>>* readable = nullptr;
  // Called on every rank at the same point, once the plan says what each rank reads from
  // storage and before any read, with this rank's reads (whole stored chunks and bytes
  // entries). May use the communicator (every rank calls it). A failure on any rank fails the
  // load on every rank.
  std::function<Status(const std::vector<ReadSpan>& reads)> before_reads;
  // Called on a rank whose read found data file `file` damaged (missing, another size, a
  // checksum mismatch; `why`), before the load fails on every rank: the copy it read is bad.
  std::function<void(uint32_t file, const Status& why)> damaged;
  // The checkpoint's metadata as stored, already on every rank (a memory tier's restore chose
  // it among the hosts' copies): used instead of reading `dir`'s, with no broadcast and no
  // second decode; the load maps its names as `opts` says, as for any metadata.
  const ::dcp::metadata::Metadata* metadata = nullptr;
};
Result<LoadResult> Load(StateDict& sd, const std::string& dir, const LoadOptions& opts,
                        storage::FileSystem& fs, const LoadHooks* hooks);

}  // namespace dcp::checkpoint
