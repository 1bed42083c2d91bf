#include "planner/load_plan.h"

#include <algorithm>

#include "core/copy_runs.h"
#include "planner/stored_chunk_finder.h"

namespace dcp::planner {
namespace {

// Tensors with more stored chunks than this, loaded into several destination chunks, are
// searched through a BoxIndex (StoredChunkFinder).
constexpr size_t kIndexMinChunks = 256;

Status CheckDestination(const StateEntry& e, const metadata::TensorMeta& t,
                        const std::string& where) {
  if (e.dtype != t.dtype) {
    return InvalidArgument(where + ": dtype mismatch: the checkpoint has " +
                           std::string(DTypeName(t.dtype)) + ", the destination " +
                           std::string(DTypeName(e.dtype)));
  }
  if (!(e.global_shape == t.global_shape)) {
    return InvalidArgument(where + ": global shape mismatch: the checkpoint has " +
                           t.global_shape.ToString() + ", the destination " +
                           e.global_shape.ToString());
  }
  for (const TensorChunk& c : e.chunks) {
    if (c.view.dtype != t.dtype) {
      return InvalidArgument(where + ": a destination chunk has dtype " +
                             std::string(DTypeName(c.view.dtype)) + ", the checkpoint " +
                             std::string(DTypeName(t.dtype)));
    }
    if (!c.box.WithinShape(t.global_shape)) {
      return InvalidArgument(where + ": destination chunk " + c.box.ToString() +
                             " lies outside the global shape " + t.global_shape.ToString());
    }
    if (c.view.memory != MemoryKind::kHost) {
      return InvalidArgument(where + ": only host memory is supported so far");
    }
    if (c.box.NumElements() > 0 && c.view.data == nullptr) {
      return InvalidArgument(where + ": destination chunk " + c.box.ToString() + " has no memory");
    }
  }
  return OkStatus();
}

}  // namespace

Result<LocalLoadPlan> PlanLoad(const StateDict& sd, const metadata::Metadata& md,
                               bool allow_partial, const std::string& ckpt) {
  LocalLoadPlan plan;
  StoredChunkFinder finder(md, kIndexMinChunks);
  const auto& entries = sd.entries();
  for (uint32_t ei = 0; ei < entries.size(); ++ei) {
    const StateEntry& e = entries[ei];
    const std::string where = "checkpoint " + ckpt + ": '" + e.fqn + "'";
    const metadata::TensorMeta* t = md.FindTensor(e.fqn);
    const metadata::BytesMeta* b = md.FindBytes(e.fqn);
    if (!t && !b) {
      if (allow_partial) {
        plan.skipped.push_back(ei);
        continue;
      }
      return NotFound(where + " is not in the checkpoint");
    }
    if (e.kind == StateEntry::Kind::kBytes) {
      if (!b)
        return InvalidArgument(where + " is a tensor in the checkpoint, bytes in the destination");
      plan.bytes.push_back({ei, static_cast<uint32_t>(b - md.bytes.data())});
      continue;
    }
    if (!t)
      return InvalidArgument(where + " is bytes in the checkpoint, a tensor in the destination");
    DCP_RETURN_IF_ERROR(CheckDestination(e, *t, where));
    const auto ti = static_cast<uint32_t>(t - md.tensors.data());
    for (uint32_t ci = 0; ci < e.chunks.size(); ++ci) {
      const Box& dst = e.chunks[ci].box;
      for (uint32_t cj = 0; cj < ci && !dst.Empty(); ++cj) {
        if (e.chunks[cj].box == dst) {
          return InvalidArgument(where + ": destination chunk " + dst.ToString() +
                                 " added twice on one rank");
        }
      }
      uint64_t covered = 0;
      // With many stored chunks, only those near the destination chunk are intersected; one
      // destination chunk: one scan is cheaper than the index.
      for (const size_t s : finder.Candidates(ti, dst, /*single_query=*/e.chunks.size() == 1)) {
        const auto si = static_cast<uint32_t>(s);
        auto region = Intersect(dst, t->chunks[si].box);
        if (!region) continue;
        // Sub-byte dtypes: every copy must start and end on whole bytes; found here, the
        // error is agreed on by all ranks before any data moves.
        auto runs = CopyRuns::Make(t->dtype, t->chunks[si].box, dst, *region);
        if (!runs.ok()) return runs.status().Annotate(where + ": ");
        covered += region->NumElements();
        plan.reads.push_back({ei, ci, ti, si, *region});
      }
      if (covered != dst.NumElements()) {
        return InvalidArgument(where + ": destination chunk " + dst.ToString() +
                               " is not covered by the stored chunks (" + std::to_string(covered) +
                               " of " + std::to_string(dst.NumElements()) + " elements)");
      }
    }
  }
  std::sort(plan.reads.begin(), plan.reads.end(), [&](const ReadItem& a, const ReadItem& b) {
    const auto& ca = md.tensors[a.tensor].chunks[a.stored];
    const auto& cb = md.tensors[b.tensor].chunks[b.stored];
    // Items of one stored chunk end up adjacent: ChunkReads reads each chunk once for all.
    return std::tie(ca.file, ca.byte_offset, a.tensor, a.stored, a.entry, a.dst_chunk) <
           std::tie(cb.file, cb.byte_offset, b.tensor, b.stored, b.entry, b.dst_chunk);
  });
  return plan;
}

}  // namespace dcp::planner
