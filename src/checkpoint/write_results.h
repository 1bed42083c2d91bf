// What the writers of a save report to rank 0, and how rank 0 turns those reports into the
// checkpoint's metadata: the one metadata builder, used by save and by `dcp simulate` (which
// lays the files out as the writers would, without data, so the metadata it measures is the
// metadata a save commits, block checksums included).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/incremental.h"
#include "dcp/status.h"
#include "metadata/metadata.h"
#include "planner/save_plan.h"
#include "storage/data_files.h"

namespace dcp::checkpoint {

// What one rank wrote: its tensor file, its bytes file and, in an incremental save, the planned
// chunks it left in a base's files (the tensor file then holds the other planned chunks, in
// order).
struct Written {
  storage::WrittenFile tensors;
  storage::WrittenFile bytes;
  std::vector<Reused> reused;  // ascending Reused::index
};

std::string EncodeWritten(const Written& written);
Result<Written> DecodeWritten(std::string_view in);

// The metadata of the save `save_id` of `plan`, `written[r]` being what rank r wrote (empty
// for ranks that wrote nothing).
Result<metadata::Metadata> BuildMetadata(const planner::GlobalSavePlan& plan, uint64_t save_id,
                                         const std::vector<Written>& written, int world);

// A chunk a rank writes: plan.tensors[tensor].chunks[chunk], stored under `key` in the rank's
// safetensors file (the fqn, or "<fqn>.__dcp_chunk_<k>" for the k-th of several chunks of one
// tensor written by one rank).
struct PlannedChunk {
  uint32_t tensor = 0;
  uint32_t chunk = 0;
  std::string key;
};
// The chunks `rank` writes, in plan order (the order of its file).
std::vector<PlannedChunk> PlannedChunksOf(const planner::GlobalSavePlan& plan, int rank);

// What every rank would report after writing `plan` (storage::WriteSafetensorsFile and
// WriteBytesFile's layout: header, then data in order): exact file sizes, offsets and numbers
// of block checksums; the checksum values are made up.
std::vector<Written> LayOutWrites(const planner::GlobalSavePlan& plan, int world,
                                  uint64_t block_size);

}  // namespace dcp::checkpoint
