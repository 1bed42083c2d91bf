// Parallel layouts of a synthetic model: "tp2,dp2" -> which boxes each rank holds.
//
// A layout string lists mesh dimensions slowest first, each an axis kind and a size:
//   dp<N>  data parallel: every tensor replicated;
//   tp<N>  tensor parallel: each tensor's tp_dim sharded (torch.chunk split), the
//          others replicated;
//   ep<N>  expert parallel: experts dealt out in contiguous blocks (ep rank r owns experts
//          [r*E/N, (r+1)*E/N)), non-expert tensors replicated.
// Examples: "dp4", "tp4", "ep4", "tp2,dp2", "dp2,tp2", "tp2,ep2". World size is the
// product of the sizes; rank -> mesh coordinate is row-major (dcp::MeshCoords).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcp/box.h"
#include "dcp/status.h"
#include "workload/model.h"

namespace dcp::workload {

enum class MeshAxis : uint8_t { kDp, kTp, kEp };

struct MeshDim {
  MeshAxis axis;
  int size;
  friend bool operator==(const MeshDim& a, const MeshDim& b) = default;
};

struct LayoutSpec {
  std::vector<MeshDim> dims;  // slowest first, as written

  int WorldSize() const;
  std::vector<int> MeshShape() const;
  std::string ToString() const;  // the canonical string, e.g. "tp2,dp2"
};

// Parses "tp2,dp2" and friends. InvalidArgument for an empty string, an unknown axis,
// a size that is not an integer >= 1, or an axis given twice.
Result<LayoutSpec> ParseLayout(std::string_view text);

// One box of one tensor that a rank holds: (index into ModelSpec::tensors, box).
using HeldChunk = std::pair<size_t, Box>;

// The chunks `rank` holds under `layout`, in model tensor order, at most one per tensor.
// Empty boxes (uneven torch.chunk tails) and experts owned by another ep rank are left
// out. InvalidArgument when rank is outside [0, WorldSize()) or a tensor's tp_dim is not
// one of its dimensions.
Result<std::vector<HeldChunk>> ChunksForRank(const ModelSpec& model, const LayoutSpec& layout,
                                             int rank);

}  // namespace dcp::workload
