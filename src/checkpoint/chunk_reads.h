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
#include "storage/chunk_reader.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

class ChunkReads {
 public:
  // `ckpt` names the checkpoint in errors; file names resolve against DataDirOf(ckpt).
  ChunkReads(StateDict& sd, const metadata::Metadata& md, const std::string& ckpt,
             const LoadOptions& opts, storage::FileSystem& fs, LoadResult* stats);

  // The read items this rank performs from storage (plan.reads indices); by default all.
  // Reading one of them reads its stored chunk once for every item of that chunk in the
  // set (plan.reads keeps them adjacent), so however the items are split among calls to
  // Read, a stored chunk is read once.
  void set_from_storage(std::vector<bool> from_storage) { from_storage_ = std::move(from_storage); }

  // Reads plan.reads[i] for every i in `items` not already read, and with each the other
  // items of the same stored chunk this rank performs. Errors name the checkpoint, the file
  // and the fqn.
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
  std::vector<bool> from_storage_;  // per read item; empty: all
  std::vector<bool> done_;          // per read item
};

// The range of stored chunk `sc` of `md`, with its checksums.
storage::StoredRange RangeOf(const metadata::Metadata& md, const metadata::StoredChunk& sc);

}  // namespace dcp::checkpoint
