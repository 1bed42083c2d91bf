#include "planner/save_plan.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/wire.h"
#include "planner/balancer.h"

namespace dcp::planner {
namespace {

Status ValidateTensorEntry(const StateEntry& e) {
  const std::string where = "tensor '" + e.fqn + "'";
  if (e.global_shape.rank() > kMaxDims)
    return InvalidArgument(where + " has more than 8 dimensions");
  if (!e.global_shape.NumElements()) {
    return InvalidArgument(where + " has an invalid global shape " + e.global_shape.ToString());
  }
  for (const TensorChunk& c : e.chunks) {
    const TensorView& v = c.view;
    if (v.dtype != e.dtype) {
      return InvalidArgument(where + " has chunks of different dtypes (" +
                             std::string(DTypeName(e.dtype)) + " and " +
                             std::string(DTypeName(v.dtype)) + ")");
    }
    if (c.box.offsets.rank() != e.global_shape.rank() || !c.box.WithinShape(e.global_shape)) {
      return InvalidArgument(where + ": chunk " + c.box.ToString() +
                             " does not fit the global shape " + e.global_shape.ToString());
    }
    if (v.memory != MemoryKind::kHost) {
      return InvalidArgument(where + ": only host memory is supported so far");
    }
    uint64_t n = c.box.NumElements();
    if (!DTypeBytes(e.dtype, n)) {
      return InvalidArgument(where + ": chunk " + c.box.ToString() + " of dtype " +
                             std::string(DTypeName(e.dtype)) + " does not end on a whole byte");
    }
    if (n > 0 && v.data == nullptr) return InvalidArgument(where + ": chunk has no memory");
  }
  return OkStatus();
}

struct ChunkAcc {
  uint64_t nbytes = 0;
  std::vector<int> plans;  // plan classes holding it, ascending
};
struct TensorAcc {
  DType dtype;
  Shape global_shape;
  int first_plan;
  std::map<Box, ChunkAcc> chunks;
  std::string path;  // the first non-empty one, in plan order
};
struct BytesAcc {
  uint64_t nbytes = 0;
  std::vector<int> plans;
  std::string path;
};

int FirstRank(const std::vector<std::vector<int>>& holders, int plan) {
  return holders[plan].empty() ? -1 : holders[plan].front();
}

// No two distinct chunks overlap, and together they cover the tensor. `ranks[i]` is the
// lowest rank holding boxes[i], named in the error.
Status CheckTiling(const std::string& fqn, const Shape& shape, const std::vector<Box>& boxes,
                   const std::vector<int>& ranks, bool require_coverage) {
  if (auto pair = FindOverlap(boxes)) {
    const auto [i, j] = *pair;
    return InvalidArgument("tensor '" + fqn + "': saved chunks " + boxes[i].ToString() + " (rank " +
                           std::to_string(ranks[i]) + ") and " + boxes[j].ToString() + " (rank " +
                           std::to_string(ranks[j]) + ") overlap without being equal");
  }
  uint64_t covered = 0;
  for (const Box& b : boxes) covered += b.NumElements();
  uint64_t total = shape.NumElements().value_or(0);
  if (require_coverage && covered != total) {
    return InvalidArgument("tensor '" + fqn + "': the saved chunks cover " +
                           std::to_string(covered) + " of its " + std::to_string(total) +
                           " elements");
  }
  return OkStatus();
}

}  // namespace

Result<LocalSavePlan> BuildLocalSavePlan(const StateDict& sd) {
  LocalSavePlan plan;
  for (const StateEntry& e : sd.entries()) {
    if (e.kind == StateEntry::Kind::kBytes) {
      plan.items.push_back(
          SaveItem{e.fqn, true, DType::kU8, Shape(), Box(), e.bytes.size(), e.path});
      continue;
    }
    DCP_RETURN_IF_ERROR(ValidateTensorEntry(e));
    for (size_t i = 0; i < e.chunks.size(); ++i) {
      const Box& box = e.chunks[i].box;
      bool repeated = false;
      for (size_t j = 0; j < i; ++j) repeated = repeated || e.chunks[j].box == box;
      if (repeated && box.Empty()) continue;  // uneven splits repeat empty tails; no data
      if (repeated) {
        return InvalidArgument("tensor '" + e.fqn + "': chunk " + box.ToString() +
                               " added twice on one rank");
      }
      // The path travels once per entry (with its first chunk), not once per chunk.
      plan.items.push_back(SaveItem{e.fqn, false, e.dtype, e.global_shape, box,
                                    *DTypeBytes(e.dtype, box.NumElements()),
                                    i == 0 ? e.path : std::string()});
    }
  }
  return plan;
}

std::string EncodeLocalPlan(const LocalSavePlan& plan) {
  std::string out;
  wire::Writer w(out);
  w.Varint(plan.items.size());
  for (const SaveItem& it : plan.items) {
    w.String(it.fqn);
    w.Byte(it.is_bytes ? 1 : 0);
    w.Varint(it.nbytes);
    w.String(it.path);
    if (it.is_bytes) continue;
    w.Byte(static_cast<uint8_t>(it.dtype));
    w.ShapeWithRank(it.global_shape);
    w.Extents(it.box.offsets);
    w.Extents(it.box.lengths);
  }
  return out;
}

Result<LocalSavePlan> DecodeLocalPlan(std::string_view data) {
  wire::Reader r(data);
  LocalSavePlan plan;
  plan.items.resize(r.Count(3));
  for (SaveItem& it : plan.items) {
    it.fqn = std::string(r.String());
    it.is_bytes = r.Byte() != 0;
    it.nbytes = r.Varint();
    it.path = std::string(r.String());
    if (it.is_bytes) continue;
    uint8_t dtype = r.Byte();
    if (dtype >= kNumDTypes) return DataLoss("corrupt save plan: bad dtype");
    it.dtype = static_cast<DType>(dtype);
    it.global_shape = r.ShapeWithRank();
    it.box.offsets = r.Extents(it.global_shape.rank());
    it.box.lengths = r.Extents(it.global_shape.rank());
  }
  if (!r.ok() || !r.AtEnd()) return DataLoss("corrupt save plan received");
  return plan;
}

// A replicated chunk is cut into pieces of at most a fair share / kPiecesPerShare, so that
// largest-first balancing ends every writer within about one piece of the mean (save), and a
// load of the same checkpoint has stored chunks small enough to balance its readers too
// (with checksums verified the load planner cuts slabs only between stored chunks).
// Never below kMinSplitBytes: many tiny pieces cost more than the imbalance.
constexpr uint64_t kPiecesPerShare = 8;
constexpr uint64_t kMinSplitBytes = uint64_t{256} << 10;

namespace {

// Every distinct fqn of the gathered plans: tensors with their chunks (each with the plan
// classes holding it) and bytes entries. Ranks that disagree on what an fqn is fail here.
struct Gathered {
  std::map<std::string, TensorAcc, std::less<>> tensors;
  std::map<std::string, BytesAcc, std::less<>> bytes;
};

Result<Gathered> GatherEntries(const std::vector<LocalSavePlan>& plans,
                               const std::vector<std::vector<int>>& holders) {
  Gathered g;
  auto& tensors = g.tensors;
  auto& bytes = g.bytes;
  for (int p = 0; p < static_cast<int>(plans.size()); ++p) {
    for (const SaveItem& it : plans[p].items) {
      if (it.is_bytes) {
        if (tensors.count(it.fqn)) {
          return InvalidArgument("'" + it.fqn + "' is a tensor on rank " +
                                 std::to_string(FirstRank(holders, tensors[it.fqn].first_plan)) +
                                 " but bytes on rank " + std::to_string(FirstRank(holders, p)));
        }
        auto& acc = bytes[it.fqn];
        if (acc.plans.empty()) acc.nbytes = it.nbytes;
        if (acc.path.empty()) acc.path = it.path;
        if (acc.plans.empty() || acc.plans.back() != p) acc.plans.push_back(p);
        continue;
      }
      if (bytes.count(it.fqn)) {
        return InvalidArgument("'" + it.fqn + "' is bytes on rank " +
                               std::to_string(FirstRank(holders, bytes[it.fqn].plans[0])) +
                               " but a tensor on rank " + std::to_string(FirstRank(holders, p)));
      }
      auto [tit, inserted] =
          tensors.try_emplace(it.fqn, TensorAcc{it.dtype, it.global_shape, p, {}});
      TensorAcc& t = tit->second;
      if (!inserted && (t.dtype != it.dtype || !(t.global_shape == it.global_shape))) {
        return InvalidArgument("tensor '" + it.fqn + "': rank " +
                               std::to_string(FirstRank(holders, t.first_plan)) + " has " +
                               std::string(DTypeName(t.dtype)) + " " + t.global_shape.ToString() +
                               " but rank " + std::to_string(FirstRank(holders, p)) + " has " +
                               std::string(DTypeName(it.dtype)) + " " + it.global_shape.ToString());
      }
      if (t.path.empty()) t.path = it.path;
      ChunkAcc& c = t.chunks[it.box];
      c.nbytes = it.nbytes;
      if (c.plans.empty() || c.plans.back() != p) c.plans.push_back(p);
    }
  }
  return g;
}

// A replicated chunk larger than `piece` would leave its writer behind the others
// (whole-chunk balance): it is split along dimension 0 into pieces of at most about `piece`
// bytes that its holders write (a holder may write several). Returns {box} when it is not
// split: one holder, or a row that is not whole bytes.
std::vector<Box> SplitReplicated(const Box& box, const ChunkAcc& c, DType dtype,
                                 const std::vector<std::vector<int>>& holders, uint64_t piece) {
  if (c.nbytes <= piece || box.rank() == 0 || box.lengths[0] < 2) return {box};
  if (c.plans.size() == 1 && holders[c.plans[0]].size() < 2) return {box};
  const uint64_t rows = static_cast<uint64_t>(box.lengths[0]);
  if (!DTypeBytes(dtype, box.NumElements() / rows)) return {box};  // rows split bytes
  const uint64_t n = std::min((c.nbytes + piece - 1) / piece, rows);
  std::vector<Box> out;
  const uint64_t per = (rows + n - 1) / n;
  for (uint64_t at = 0; at < rows; at += per) {
    Box part = box;
    part.offsets[0] += static_cast<int64_t>(at);
    part.lengths[0] = static_cast<int64_t>(std::min(per, rows - at));
    out.push_back(std::move(part));
  }
  return out;
}

// A replicated item awaiting its writer.
struct Pending {
  uint64_t weight;
  bool is_bytes;
  size_t entry, chunk;  // index into out.tensors/out.bytes and the chunk list
  const std::vector<int>* plans;
};

// Invariant 2: largest first, each to the holder with the fewest bytes so far, ties to the
// lowest rank; ties between items in (kind, fqn, box) order, which the sort gets from the
// already-sorted entry and chunk indices.
void AssignWriters(std::vector<Pending> pending, const std::vector<std::vector<int>>& holders,
                   GlobalSavePlan* out) {
  std::sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) {
    return std::tie(b.weight, a.is_bytes, a.entry, a.chunk) <
           std::tie(a.weight, b.is_bytes, b.entry, b.chunk);
  });
  ClassBalancer balancer(holders, out->bytes_per_rank);
  for (const Pending& it : pending) {
    const int rank = balancer.Assign(*it.plans, it.weight);
    out->bytes_per_rank[rank] += it.weight;
    if (it.is_bytes) {
      out->bytes[it.entry].writer = rank;
    } else {
      out->tensors[it.entry].chunks[it.chunk].writer = rank;
    }
  }
}

// A tensor chunk's weight for balancing: its bytes, at least 1 (an empty chunk is still an
// item to write). Bytes entries weigh 1 each.
uint64_t ChunkWeight(uint64_t nbytes) { return std::max<uint64_t>(nbytes, 1); }

}  // namespace

Result<GlobalSavePlan> PlanSave(const std::vector<LocalSavePlan>& plans,
                                const std::vector<std::vector<int>>& holders, int world_size,
                                const SavePlanOptions& opts) {
  DCP_ASSIGN_OR_RETURN(Gathered g, GatherEntries(plans, holders));

  GlobalSavePlan out;
  out.bytes_per_rank.assign(world_size, 0);
  out.tensors.reserve(g.tensors.size());
  std::vector<Pending> pending;
  auto single_holder = [&](const std::vector<int>& ps) {
    return ps.size() == 1 && holders[ps[0]].size() == 1;
  };
  uint64_t total = 0;
  for (const auto& [fqn, t] : g.tensors) {
    for (const auto& [box, c] : t.chunks) total += c.nbytes;
  }
  const uint64_t piece = std::max<uint64_t>(
      total / static_cast<uint64_t>(std::max(world_size, 1)) / kPiecesPerShare, kMinSplitBytes);
  const bool split = opts.balance && opts.split_replicas;

  // Chunks held by one rank go to it; replicated ones wait for AssignWriters.
  for (auto& [fqn, t] : g.tensors) {
    GlobalSavePlan::Tensor gt{fqn, t.dtype, t.global_shape, {}, t.path};
    std::vector<Box> boxes;
    std::vector<int> lowest_holder;
    boxes.reserve(t.chunks.size());
    lowest_holder.reserve(t.chunks.size());
    for (auto& [chunk_box, c] : t.chunks) {
      int lowest = FirstRank(holders, c.plans[0]);
      for (int p : c.plans) lowest = std::min(lowest, FirstRank(holders, p));
      boxes.push_back(chunk_box);
      lowest_holder.push_back(lowest);
      const std::vector<Box> pieces = split ? SplitReplicated(chunk_box, c, t.dtype, holders, piece)
                                            : std::vector<Box>{chunk_box};
      for (const Box& box : pieces) {
        const uint64_t nbytes = *DTypeBytes(t.dtype, box.NumElements());
        int writer = -1;
        if (single_holder(c.plans) || !opts.balance) {
          writer = lowest;
          out.bytes_per_rank[writer] += ChunkWeight(nbytes);
        } else {
          pending.push_back(
              {ChunkWeight(nbytes), false, out.tensors.size(), gt.chunks.size(), &c.plans});
        }
        gt.chunks.push_back({box, nbytes, writer});
        out.unique_bytes += nbytes;
      }
    }
    DCP_RETURN_IF_ERROR(
        CheckTiling(fqn, t.global_shape, boxes, lowest_holder, opts.require_coverage));
    out.tensors.push_back(std::move(gt));
  }
  for (auto& [fqn, b] : g.bytes) {
    int writer = -1;
    if (single_holder(b.plans) || !opts.balance) {
      writer = FirstRank(holders, b.plans[0]);
      for (int p : b.plans) writer = std::min(writer, FirstRank(holders, p));
      out.bytes_per_rank[writer] += 1;
    } else {
      pending.push_back({1, true, out.bytes.size(), 0, &b.plans});
    }
    out.bytes.push_back({fqn, b.nbytes, writer, b.path});
  }

  AssignWriters(std::move(pending), holders, &out);
  // Pieces of split chunks were appended after their chunk; restore box order.
  for (auto& t : out.tensors) {
    std::sort(t.chunks.begin(), t.chunks.end(),
              [](const GlobalSavePlan::Chunk& a, const GlobalSavePlan::Chunk& b) {
                return a.box < b.box;
              });
  }
  return out;
}

}  // namespace dcp::planner
