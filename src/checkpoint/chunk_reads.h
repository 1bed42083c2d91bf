// Executing read items: stored chunks into destination memory, one open per file (LRU),
// each stored chunk read once for all the destinations that need it.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcp/checkpoint.h"
#include "metadata/metadata.h"
#include "planner/load_plan.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

class ChunkReads {
 public:
  // `ckpt` names the checkpoint in errors; file names resolve against DataDirOf(ckpt).
  ChunkReads(StateDict& sd, const metadata::Metadata& md, const std::string& ckpt,
             const LoadOptions& opts, storage::FileSystem& fs, LoadResult* stats);

  // Reads plan.reads[i] for every i in `items` (ascending, so that items of one stored
  // chunk are adjacent). Errors name the checkpoint, the file and the fqn.
  Status Read(const planner::LocalLoadPlan& plan, std::span<const uint32_t> items);
  Status ReadBytesEntries(const planner::LocalLoadPlan& plan);
  // Reads stored chunk `stored` of metadata tensor `tensor` whole into `dst`.
  Status ReadWhole(uint32_t tensor, uint32_t stored, std::span<std::byte> dst);

  // Called between stored chunks, e.g. to let in-flight broadcasts progress.
  void set_between_chunks(std::function<void()> f) { between_chunks_ = std::move(f); }

 private:
  Result<storage::ReadableFile*> Open(uint32_t file);

  StateDict& sd_;
  const metadata::Metadata& md_;
  const std::string ckpt_;
  const std::string data_dir_;
  const bool verify_;
  const size_t max_open_;
  storage::FileSystem& fs_;
  LoadResult* stats_;
  std::function<void()> between_chunks_;
  std::list<std::pair<uint32_t, std::unique_ptr<storage::ReadableFile>>> open_;  // MRU first
  std::vector<std::byte> bounce_;
};

}  // namespace dcp::checkpoint
