#include "core/copy_runs.h"

#include <algorithm>

namespace dcp {
namespace {

// Element strides of a row-major box.
void ElementStrides(const Box& b, uint64_t* strides) {
  uint64_t s = 1;
  for (int d = b.rank() - 1; d >= 0; --d) {
    strides[d] = s;
    s *= static_cast<uint64_t>(b.lengths[d]);
  }
}

}  // namespace

Result<CopyRuns> CopyRuns::Make(DType dtype, const Box& src, const Box& dst, const Box& region) {
  CopyRuns r;
  const int rank = region.rank();
  const uint64_t bits = static_cast<uint64_t>(DTypeBits(dtype));
  if (region.NumElements() == 0) return r;

  uint64_t src_es[kMaxDims], dst_es[kMaxDims];
  ElementStrides(src, src_es);
  ElementStrides(dst, dst_es);

  // Merge trailing dimensions the region covers fully in both boxes into one run.
  int k = rank - 1;
  uint64_t run_elems = rank == 0 ? 1 : static_cast<uint64_t>(region.lengths[k]);
  while (k > 0 && region.lengths[k] == src.lengths[k] && region.lengths[k] == dst.lengths[k]) {
    --k;
    run_elems *= static_cast<uint64_t>(region.lengths[k]);
  }
  r.outer_rank_ = rank == 0 ? 0 : k;

  uint64_t src_base_el = 0, dst_base_el = 0;
  for (int d = 0; d < rank; ++d) {
    src_base_el += static_cast<uint64_t>(region.offsets[d] - src.offsets[d]) * src_es[d];
    dst_base_el += static_cast<uint64_t>(region.offsets[d] - dst.offsets[d]) * dst_es[d];
  }
  bool whole_bytes =
      (run_elems * bits) % 8 == 0 && (src_base_el * bits) % 8 == 0 && (dst_base_el * bits) % 8 == 0;
  r.num_runs_ = 1;
  for (int d = 0; d < r.outer_rank_; ++d) {
    r.outer_count_[d] = region.lengths[d];
    r.num_runs_ *= static_cast<uint64_t>(region.lengths[d]);
    if (region.lengths[d] > 1) {
      whole_bytes = whole_bytes && (src_es[d] * bits) % 8 == 0 && (dst_es[d] * bits) % 8 == 0;
    }
    r.src_stride_[d] = static_cast<int64_t>(src_es[d] * bits / 8);
    r.dst_stride_[d] = static_cast<int64_t>(dst_es[d] * bits / 8);
  }
  if (!whole_bytes) {
    return InvalidArgument("dtype " + std::string(DTypeName(dtype)) + ": copying region " +
                           region.ToString() + " between chunks " + src.ToString() + " and " +
                           dst.ToString() + " would split a byte; sub-byte chunks must start " +
                           "and end on whole bytes");
  }
  r.run_bytes_ = run_elems * bits / 8;
  r.src_base_ = src_base_el * bits / 8;
  r.dst_base_ = dst_base_el * bits / 8;
  return r;
}

uint64_t CopyRuns::Offset(uint64_t run, uint64_t base, const int64_t* stride) const {
  uint64_t off = base;
  for (int d = outer_rank_ - 1; d >= 0; --d) {
    uint64_t c = static_cast<uint64_t>(outer_count_[d]);
    off += (run % c) * static_cast<uint64_t>(stride[d]);
    run /= c;
  }
  return off;
}

uint64_t CopyRuns::FirstRunEndingAfter(uint64_t src_pos) const {
  // Source offsets grow with the run index (row-major walk), so binary search.
  uint64_t lo = 0, hi = num_runs_;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (src_offset(mid) + run_bytes_ > src_pos) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

void MarkSourceBlocks(const CopyRuns& runs, uint64_t block, std::vector<uint8_t>& needed) {
  // One binary search per needed block: a column slice of a huge chunk has millions of runs
  // but few blocks.
  uint64_t pos = 0;
  for (;;) {
    const uint64_t i = runs.FirstRunEndingAfter(pos);
    if (i >= runs.num_runs() || runs.run_bytes() == 0) return;
    const uint64_t b = std::max(runs.src_offset(i), pos) / block;
    if (b >= needed.size()) return;
    needed[b] = 1;
    pos = (b + 1) * block;
  }
}

uint64_t BytesToFetch(const CopyRuns& runs, uint64_t chunk_bytes, uint64_t block_size) {
  if (runs.num_runs() == 0 || runs.run_bytes() == 0) return 0;
  const uint64_t block = block_size ? block_size : kUnverifiedReadPiece;
  std::vector<uint8_t> needed((chunk_bytes + block - 1) / block, 0);
  MarkSourceBlocks(runs, block, needed);
  uint64_t n = 0;
  for (uint64_t b = 0; b < needed.size(); ++b) {
    if (needed[b]) n += std::min(block, chunk_bytes - b * block);
  }
  return n;
}

}  // namespace dcp
