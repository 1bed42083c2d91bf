#include "checkpoint/write_mine.h"

#include <unordered_map>

#include "checkpoint/names.h"
#include "core/copy_runs.h"
#include "core/cpu_share.h"
#include "storage/data_files.h"

namespace dcp::checkpoint {
namespace {

// What this rank writes, in global plan order, with its own memory.
struct MyWrites {
  std::vector<storage::TensorToWrite> tensors;
  std::vector<const planner::GlobalSavePlan::Chunk*> chunks;  // each tensor's planned chunk
  std::vector<const std::string*> fqns;
  std::vector<std::span<const std::byte>> bytes;
};

Result<MyWrites> CollectMyWrites(const StateDict& sd, const planner::GlobalSavePlan& plan,
                                 int rank) {
  MyWrites w;
  for (PlannedChunk& p : PlannedChunksOf(plan, rank)) {
    const auto& t = plan.tensors[p.tensor];
    const auto& c = t.chunks[p.chunk];
    const StateEntry* e = sd.find(t.fqn);
    if (!e) return Internal("planned chunk of '" + t.fqn + "' missing from the state dict");
    // The held chunk this box is (or is a dimension-0 slice of: see split_replicas).
    const TensorChunk* tc = nullptr;
    for (const auto& cand : e->chunks) {
      if (cand.box.Contains(c.box)) tc = &cand;
    }
    if (!tc) return Internal("planned chunk " + c.box.ToString() + " of '" + t.fqn + "' not held");
    auto runs = CopyRuns::Make(t.dtype, tc->box, c.box, c.box);
    if (!runs.ok() || runs->num_runs() > 1) {
      return Internal("planned chunk " + c.box.ToString() + " of '" + t.fqn +
                      "' is not contiguous in the held chunk " + tc->box.ToString());
    }
    const uint64_t offset = runs->num_runs() == 1 ? runs->src_offset(0) : 0;
    w.tensors.push_back({std::move(p.key), t.dtype, c.box.lengths,
                         std::span<const std::byte>(tc->view.bytes() + offset, c.nbytes)});
    w.chunks.push_back(&c);
    w.fqns.push_back(&t.fqn);
  }
  for (const auto& b : plan.bytes) {
    if (b.writer != rank) continue;
    const StateEntry* e = sd.find(b.fqn);
    if (!e) return Internal("planned bytes entry '" + b.fqn + "' missing from the state dict");
    w.bytes.push_back(e->bytes);
  }
  return w;
}

}  // namespace

Status WriteMine(const StateDict& sd, const std::string& dir, const planner::GlobalSavePlan& plan,
                 int rank, uint64_t save_id, const SaveOptions& opts, storage::FileSystem& fs,
                 const BaseChunks* base, Written* out, SaveResult* result) {
  DCP_ASSIGN_OR_RETURN(MyWrites mine, CollectMyWrites(sd, plan, rank));
  if (base && !mine.tensors.empty()) {
    std::vector<BaseChunks::Chunk> check;
    for (size_t i = 0; i < mine.tensors.size(); ++i) {
      const storage::TensorToWrite& t = mine.tensors[i];
      check.push_back({mine.fqns[i], t.dtype, &mine.chunks[i]->box, t.data});
    }
    std::vector<std::optional<Reused>> found = base->FindAll(check, CpusPerLocalRank());
    std::vector<storage::TensorToWrite> changed;
    std::vector<const std::string*> fqns;
    for (size_t i = 0; i < mine.tensors.size(); ++i) {
      storage::TensorToWrite& t = mine.tensors[i];
      if (auto& r = found[i]) {
        r->index = static_cast<uint32_t>(i);
        result->bytes_referenced += r->byte_length;
        ++result->chunks_referenced;
        out->reused.push_back(std::move(*r));
      } else {
        changed.push_back(std::move(t));
        fqns.push_back(mine.fqns[i]);
      }
    }
    // Keys as the metadata implies them (ChunkKey): over the chunks of a tensor this file holds.
    std::unordered_map<std::string_view, uint64_t> count, next;
    for (const std::string* f : fqns) ++count[*f];
    for (size_t i = 0; i < changed.size(); ++i) {
      const uint64_t n = count[*fqns[i]];
      changed[i].key = ChunkKey(*fqns[i], n > 1, n > 1 ? next[*fqns[i]]++ : 0);
    }
    mine.tensors = std::move(changed);
  }
  if (!mine.tensors.empty()) {
    const std::string recycle = opts.recycle_dir.empty()
                                    ? std::string()
                                    : storage::JoinPath(opts.recycle_dir, RecycledFileName(rank));
    DCP_ASSIGN_OR_RETURN(out->tensors,
                         storage::WriteSafetensorsFile(
                             fs, storage::JoinPath(dir, DataFileName(save_id, rank)), mine.tensors,
                             metadata::kChecksumBlockSize, recycle, &result->file_recycled));
    ++result->files_written;
  }
  if (!mine.bytes.empty()) {
    DCP_ASSIGN_OR_RETURN(out->bytes,
                         storage::WriteBytesFile(
                             fs, storage::JoinPath(dir, BytesFileName(save_id, rank)), mine.bytes));
    ++result->files_written;
  }
  result->items_written = out->tensors.ranges.size() + out->bytes.ranges.size();
  for (const auto* f : {&out->tensors, &out->bytes}) {
    for (const auto& r : f->ranges) result->bytes_written += r.byte_length;
  }
  return OkStatus();
}

}  // namespace dcp::checkpoint
