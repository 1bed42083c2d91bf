// The stored chunks of a tensor that may intersect a box, for both planners: every chunk when
// the tensor has few (testing each is cheaper than an index), else through a BoxIndex
// (core/box_index.h), kept for one tensor at a time (callers query in tensor order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <vector>

#include "core/box_index.h"
#include "metadata/metadata.h"

namespace dcp::planner {

class StoredChunkFinder {
 public:
  // Tensors with more than `index_min_chunks` stored chunks are indexed.
  StoredChunkFinder(const metadata::Metadata& md, size_t index_min_chunks)
      : md_(md), index_min_chunks_(index_min_chunks) {}

  // Ascending indices into md.tensors[tensor].chunks, a superset of those intersecting `box`.
  // `single_query`: the caller asks once for this tensor, so no index is worth building.
  const std::vector<size_t>& Candidates(uint32_t tensor, const Box& box,
                                        bool single_query = false) {
    const auto& chunks = md_.tensors[tensor].chunks;
    if (single_query || chunks.size() <= index_min_chunks_) {
      found_.resize(chunks.size());
      std::iota(found_.begin(), found_.end(), size_t{0});
      return found_;
    }
    if (tensor != indexed_) {
      index_.emplace(chunks.size(), [&](size_t i) -> const Box& { return chunks[i].box; });
      indexed_ = tensor;
    }
    found_ = index_->Candidates(box);
    return found_;
  }

 private:
  const metadata::Metadata& md_;
  const size_t index_min_chunks_;
  std::optional<BoxIndex> index_;
  uint32_t indexed_ = UINT32_MAX;
  std::vector<size_t> found_;
};

}  // namespace dcp::planner
