// Executing read items: stored chunks into destination memory, one open per file (LRU),
// each stored chunk read once for all the destinations that need it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "dcp/checkpoint.h"
#include "metadata/metadata.h"
#include "planner/load_plan.h"
#include "storage/chunk_reader.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

class ChunkReads {
 public:
  // `ckpt` names the checkpoint in errors; files are found by DataFilePath(ckpt, file).
  ChunkReads(StateDict& sd, const metadata::Metadata& md, const std::string& ckpt,
             const LoadOptions& opts, storage::FileSystem& fs, LoadResult* stats);

  // The load's private plan and which of its items this rank does not read from storage
  // (filled by broadcasts; empty: it reads them all). Both must outlive this object. Read then
  // reads a stored chunk once for all the items of the plan it is given and the private items that
  // need part of it (each plan keeps one stored chunk's items adjacent), so however reads are split
  // among calls and plans, a stored chunk is read once per rank.
  void set_private(const planner::LocalLoadPlan* plan, const std::vector<bool>& not_from_storage) {
    private_plan_ = plan;
    not_from_storage_ = &not_from_storage;
  }

  // Reads plan.reads[i] for every i in `items` not already read, and with each the other
  // items of its stored chunk (above). `plan` must outlive this object. Errors name the
  // checkpoint, the file and the fqn.
  Status Read(const planner::LocalLoadPlan& plan, std::span<const uint32_t> items);
  Status ReadBytesEntries(const planner::LocalLoadPlan& plan);
  // On an object store: (tensor, stored chunk) pairs that ReadWhole will read, so that they
  // are fetched ahead, coalesced.
  void HintWhole(const std::vector<std::pair<uint32_t, uint32_t>>& chunks);
  // On an object store: the private plan's reads too, so that they are fetched while the
  // shared phase waits on other ranks (called once this rank's shared reads are issued).
  void HintPrivate();
  // Reads stored chunk `stored` of metadata tensor `tensor` whole into `dst`.
  Status ReadWhole(uint32_t tensor, uint32_t stored, std::span<std::byte> dst);

  // The data file whose bytes a failed read found damaged (missing, another size, a checksum
  // mismatch): the first such failure's.
  std::optional<uint32_t> damaged_file() const { return damaged_file_; }

  // Called between stored chunks, e.g. to let in-flight broadcasts progress.
  void set_between_chunks(std::function<void()> f) { between_chunks_ = std::move(f); }
  // Read stops before its next stored chunk once `stop` is requested (a second reader whose
  // load failed elsewhere), with an error nobody reports: the load's own failure comes first.
  void set_stop(std::stop_token stop) { stop_ = std::move(stop); }
  // Files kept open from now on (closing the least recently used beyond it); 0 closes all.
  void set_max_open_files(size_t n) {
    max_open_ = std::max<size_t>(n, 1);
    while (open_.size() > n) open_.pop_back();
  }

 private:
  Result<storage::ReadableFile*> Open(uint32_t file);
  // Returns `s`, remembering `file` as damaged when `s` says its bytes are.
  Status Noted(uint32_t file, Status s) {
    if (s.code() == StatusCode::kDataLoss && !damaged_file_) damaged_file_ = file;
    return s;
  }
  // Tells each file what `plan` will read of it: on an object store its stored chunks, on a
  // file system (a broadcast load's shared plan only) the blocks of its slabs.
  void Hint(const planner::LocalLoadPlan& plan, const std::vector<bool>& done);
  void HintRanges(const std::vector<std::pair<uint32_t, uint32_t>>& chunks);
  // Tells each file (by metadata index) the byte ranges it will be read at.
  void Announce(std::map<uint32_t, std::vector<storage::ByteRange>>& by_file);
  // Whether item k of the private plan is read from storage by this rank.
  bool FromStorage(size_t k) const {
    return !not_from_storage_ || not_from_storage_->empty() || !(*not_from_storage_)[k];
  }

  StateDict& sd_;
  const metadata::Metadata& md_;
  const std::string ckpt_;
  const bool verify_;
  size_t max_open_;  // file systems' files (object stores' stay open)
  std::set<std::pair<uint32_t, uint32_t>> announced_chunks_;  // object stores: (tensor, stored)
  storage::FileSystem& fs_;
  LoadResult* stats_;
  std::function<void()> between_chunks_;
  std::stop_token stop_;
  std::list<std::pair<uint32_t, std::unique_ptr<storage::ReadableFile>>> open_;  // MRU first
  // File system: per file, every range announced to it (given again when it is reopened).
  std::map<uint32_t, std::vector<storage::ByteRange>> announced_;
  std::vector<std::byte> bounce_;
  const planner::LocalLoadPlan* private_plan_ = nullptr;
  const std::vector<bool>* not_from_storage_ = nullptr;              // per item of *private_plan_
  std::map<const planner::LocalLoadPlan*, std::vector<bool>> done_;  // per plan, per item
  std::set<const planner::LocalLoadPlan*> hinted_;
  std::optional<uint32_t> damaged_file_;
};

// Whether the stored chunks `plan` reads from `ckpt` are in this host's page cache (at least
// 95% of their bytes, by FileSystem::CachedFraction; unknown counts as not): reading them is
// then a memory copy, cheaper than any broadcast (LoadOptions::broadcast_cached).
// `readable` ([rank][file], may be null): a file this rank `me` may not read counts as not
// cached (a memory tier's copy the restore does not trust).
bool ReadsAreCached(storage::FileSystem& fs, const std::string& ckpt, const metadata::Metadata& md,
                    const planner::LocalLoadPlan& plan,
                    const std::vector<std::vector<bool>>* readable, int me);

// The range of stored chunk `sc` of `md`, with its checksums.
storage::StoredRange RangeOf(const metadata::Metadata& md, const metadata::StoredChunk& sc);

}  // namespace dcp::checkpoint
