#include "planner/slab_cuts.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <tuple>

namespace dcp::planner {
namespace {

// With verified reads, the rows (relative to the shard's first, in (0, rows)) where `box` of
// `tensor` may be cut into slabs so that the readers on either side fetch disjoint stored
// bytes: rows no stored chunk crosses, and rows inside chunks with block checksums (format 3)
// that start a checksum block of every chunk crossing them (each side then reads and verifies
// only its own blocks). A chunk with one checksum is never cut: it is read whole.
class CutRows {
 public:
  CutRows(uint32_t tensor, const Box& box, StoredChunkFinder& finder,
          const metadata::Metadata& md) {
    const metadata::TensorMeta& t = md.tensors[tensor];
    const auto rows = box.lengths[0];
    struct Span {
      int64_t from, to;  // rows of the shard it covers
      int64_t start;     // its chunk's first row, relative to the shard (may be negative)
      int64_t step;      // rows between block-aligned rows inside it; 0: no cut inside
    };
    std::vector<Span> spans;
    for (const size_t i : finder.Candidates(tensor, box)) {
      const metadata::StoredChunk& sc = t.chunks[i];
      auto region = Intersect(box, sc.box);
      if (!region || region->Empty()) continue;
      const int64_t from = region->offsets[0] - box.offsets[0];
      int64_t step = 0;
      if (!sc.block_xxh3.empty() && md.block_size > 0 && sc.box.lengths[0] > 0) {
        // A row of a sub-byte dtype may not end on a byte: no cut inside such a chunk.
        const std::optional<uint64_t> row_bytes =
            DTypeBytes(t.dtype, static_cast<uint64_t>(sc.box.NumElements() / sc.box.lengths[0]));
        if (row_bytes && *row_bytes > 0)
          step = static_cast<int64_t>(md.block_size / std::gcd(*row_bytes, md.block_size));
      }
      spans.push_back({from, from + region->lengths[0], sc.box.offsets[0] - box.offsets[0], step});
    }
    // A row is a clean cut unless some span starting before it ends after it (a sweep over
    // the spans by start).
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return std::tie(a.from, a.to) < std::tie(b.from, b.to);
    });
    int64_t reach = 0;  // furthest end among spans started so far
    for (const auto& [from, to, start, step] : spans) {
      if (from > 0 && from < rows && reach <= from && (clean_.empty() || clean_.back() != from)) {
        clean_.push_back(from);
      }
      reach = std::max(reach, to);
    }
    // Inside the elementary intervals between consecutive span ends, rows may be cut where
    // every span covering the interval agrees on a block-aligned step.
    if (spans.size() <= kMaxSpansForBlockCuts) {
      std::vector<int64_t> edges;
      for (const Span& sp : spans) {
        edges.push_back(sp.from);
        edges.push_back(sp.to);
      }
      std::sort(edges.begin(), edges.end());
      edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
      for (size_t e = 0; e + 1 < edges.size(); ++e) {
        const int64_t u = edges[e], v = edges[e + 1];
        int64_t step = 0, start = 0;
        bool ok = false;
        for (const Span& sp : spans) {
          if (sp.from > u || sp.to < v) continue;  // does not cover [u, v)
          if (sp.step == 0 || (ok && sp.start != start)) {
            ok = false;
            break;
          }
          step = ok ? std::lcm(step, sp.step) : sp.step;
          start = sp.start;
          ok = step <= rows;
          if (!ok) break;
        }
        // Only runs with rows to cut: Nearest looks at the neighbouring runs alone.
        if (ok && step > 0) {
          const Run run{u, v, Mod(start, step), step};
          if (run.Points() > 0) runs_.push_back(run);
        }
      }
    }
    for (const Run& r : runs_) count_ += r.Points();
    count_ += clean_.size();
  }

  // How many rows may be cut.
  uint64_t count() const { return count_; }

  // An allowed row near `row`, the nearest among the clean rows around it and the
  // block-aligned rows around it in its own and the neighbouring intervals (ties: the lower);
  // -1 when there is none.
  int64_t Nearest(int64_t row) const {
    int64_t best = -1;
    auto consider = [&](int64_t c) {
      if (c < 0) return;
      const int64_t d = c > row ? c - row : row - c;
      const int64_t bd = best > row ? best - row : row - best;
      if (best < 0 || d < bd || (d == bd && c < best)) best = c;
    };
    auto it = std::lower_bound(clean_.begin(), clean_.end(), row);
    if (it != clean_.end()) consider(*it);
    if (it != clean_.begin()) consider(*(it - 1));
    auto r = std::upper_bound(runs_.begin(), runs_.end(), row,
                              [](int64_t x, const Run& run) { return x < run.from; });
    if (r != runs_.end()) consider(r->First());
    if (r != runs_.begin()) {
      const Run& run = *(r - 1);
      if (row < run.to) {
        const int64_t below = row - Mod(row - run.phase, run.step);
        consider(below > run.from ? below : -1);
        consider(below + run.step < run.to ? below + run.step : -1);
        if (r - 1 != runs_.begin()) consider((r - 2)->Last());
      } else {
        consider(run.Last());
      }
    }
    return best;
  }

 private:
  static constexpr size_t kMaxSpansForBlockCuts = 256;
  static int64_t Mod(int64_t a, int64_t m) { return ((a % m) + m) % m; }
  // Rows from < r < to with r = phase (mod step).
  struct Run {
    int64_t from, to, phase, step;
    int64_t First() const {
      const int64_t r = from + 1 + Mod(phase - from - 1, step);
      return r < to ? r : -1;
    }
    int64_t Last() const {
      const int64_t r = to - 1 - Mod(to - 1 - phase, step);
      return r > from ? r : -1;
    }
    uint64_t Points() const {
      const int64_t f = First();
      return f < 0 ? 0 : static_cast<uint64_t>((Last() - f) / step + 1);
    }
  };
  std::vector<int64_t> clean_;  // ascending
  std::vector<Run> runs_;       // ascending, disjoint
  uint64_t count_ = 0;
};

}  // namespace

// `box` cut along dimension 0 into about nbytes / slab_bytes slabs of similar size: at even
// rows, or with whole-chunk reads at the allowed rows nearest to them (CutRows); {box} when it
// is small or cannot be cut.
std::vector<Box> CutIntoSlabs(uint32_t tensor, const Box& box, uint64_t nbytes, uint64_t slab_bytes,
                              StoredChunkFinder* finder, const metadata::Metadata* md,
                              bool whole_chunk_reads) {
  if (nbytes <= slab_bytes || box.rank() == 0 || box.lengths[0] < 2) return {box};
  const auto rows = static_cast<uint64_t>(box.lengths[0]);
  if (nbytes % rows != 0) return {box};  // a row is not a whole number of bytes
  const bool anywhere = md == nullptr || !whole_chunk_reads;
  std::optional<CutRows> cuts;
  if (!anywhere) cuts.emplace(tensor, box, *finder, *md);
  const uint64_t n = std::min<uint64_t>((nbytes + slab_bytes - 1) / slab_bytes,
                                        anywhere ? rows : cuts->count() + 1);
  std::vector<Box> out;
  int64_t from = 0;
  for (uint64_t k = 1; k <= n; ++k) {
    int64_t to = static_cast<int64_t>(rows);
    if (k < n) {
      to = static_cast<int64_t>(rows * k / n);
      if (!anywhere) to = cuts->Nearest(to);
      if (to <= from) continue;
    }
    Box slab = box;
    slab.offsets[0] += from;
    slab.lengths[0] = to - from;
    out.push_back(std::move(slab));
    from = to;
  }
  return out;
}

}  // namespace dcp::planner
