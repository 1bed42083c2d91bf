// Index arithmetic for resharding: the byte runs that copy a region between two boxes.
//
// Both boxes are stored row-major and contiguous (a stored chunk in its file, a destination
// chunk in caller memory). The region (their intersection) is walked as runs of contiguous
// bytes, innermost dimensions merged wherever the region spans them fully in both boxes,
// so the copy of a whole chunk into an identical box is a single run.
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/box.h"
#include "dcp/dtype.h"
#include "dcp/status.h"

namespace dcp {

class CopyRuns {
 public:
  // kInvalidArgument when a sub-byte dtype makes a run start or end inside a byte.
  static Result<CopyRuns> Make(DType dtype, const Box& src, const Box& dst, const Box& region);

  uint64_t num_runs() const { return num_runs_; }
  uint64_t run_bytes() const { return run_bytes_; }
  uint64_t total_bytes() const { return num_runs_ * run_bytes_; }
  uint64_t src_offset(uint64_t run) const { return Offset(run, src_base_, src_stride_); }
  uint64_t dst_offset(uint64_t run) const { return Offset(run, dst_base_, dst_stride_); }
  // The first run whose source bytes end after `src_pos` (num_runs() if none).
  uint64_t FirstRunEndingAfter(uint64_t src_pos) const;

 private:
  uint64_t Offset(uint64_t run, uint64_t base, const int64_t* stride) const;

  uint64_t num_runs_ = 0;
  uint64_t run_bytes_ = 0;
  int outer_rank_ = 0;  // dimensions walked run by run, outermost first
  int64_t outer_count_[kMaxDims] = {};
  uint64_t src_base_ = 0, dst_base_ = 0;
  int64_t src_stride_[kMaxDims] = {};  // bytes per step of each outer dimension
  int64_t dst_stride_[kMaxDims] = {};
};

// Sets needed[b] for every block b of `block` bytes (of the source) that `runs` read from;
// `needed` has one entry per block of the source.
void MarkSourceBlocks(const CopyRuns& runs, uint64_t block, std::vector<uint8_t>& needed);

// Bytes of a stored chunk of `chunk_bytes` a load fetches from storage to copy `runs` out of
// it: the whole blocks of `block_size` (0: kUnverifiedReadPiece) the runs touch.
uint64_t BytesToFetch(const CopyRuns& runs, uint64_t chunk_bytes, uint64_t block_size);

// The piece size of partial reads when a chunk has no block checksums.
inline constexpr uint64_t kUnverifiedReadPiece = uint64_t{1} << 20;

}  // namespace dcp
