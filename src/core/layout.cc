#include "dcp/layout.h"

#include <algorithm>
#include <cassert>

namespace dcp {

std::string Placement::ToString() const {
  return is_shard() ? "S(" + std::to_string(dim_) + ")" : "R";
}

Interval TorchChunk(int64_t extent, int parts, int index) {
  assert(extent >= 0 && parts >= 1 && index >= 0 && index < parts);
  // torch.chunk: fixed piece size ceil(extent / parts); the pieces past the end are empty.
  const int64_t piece = (extent + parts - 1) / parts;
  const int64_t begin = std::min(piece * index, extent);
  const int64_t end = std::min(begin + piece, extent);
  return {begin, end - begin};
}

Result<Box> ChunkForRank(const Shape& global_shape, const std::vector<int>& mesh_shape,
                         const std::vector<Placement>& placements,
                         const std::vector<int>& mesh_coords) {
  if (placements.size() != mesh_shape.size() || mesh_coords.size() != mesh_shape.size()) {
    return InvalidArgument("mesh of " + std::to_string(mesh_shape.size()) + " dims got " +
                           std::to_string(placements.size()) + " placements and " +
                           std::to_string(mesh_coords.size()) + " coordinates");
  }
  for (int d = 0; d < global_shape.rank(); ++d) {
    if (global_shape[d] < 0) {
      return InvalidArgument("global shape " + global_shape.ToString() + " has a negative extent");
    }
  }
  Box box = Box::Whole(global_shape);
  // Mesh dims apply in order, each splitting what the previous ones left (DTensor's rule),
  // so {S(0), S(0)} over a 2x2 mesh yields quarters ordered by row-major mesh rank.
  for (size_t m = 0; m < mesh_shape.size(); ++m) {
    // Built only on error: this runs once per tensor per rank in planning loops.
    auto where = [m] { return "mesh dim " + std::to_string(m); };
    if (mesh_shape[m] < 1) {
      return InvalidArgument(where() + " has size " + std::to_string(mesh_shape[m]) +
                             "; sizes must be >= 1");
    }
    if (mesh_coords[m] < 0 || mesh_coords[m] >= mesh_shape[m]) {
      return InvalidArgument(where() + ": coordinate " + std::to_string(mesh_coords[m]) +
                             " is outside [0, " + std::to_string(mesh_shape[m]) + ")");
    }
    const Placement& p = placements[m];
    if (p.is_replicate()) continue;
    if (p.dim() < 0 || p.dim() >= global_shape.rank()) {
      return InvalidArgument(where() + ": " + p.ToString() + " shards a dimension of a tensor of " +
                             std::to_string(global_shape.rank()) + " dims " +
                             global_shape.ToString());
    }
    const int d = p.dim();
    const Interval piece = TorchChunk(box.lengths[d], mesh_shape[m], mesh_coords[m]);
    box.offsets[d] += piece.offset;
    box.lengths[d] = piece.length;
  }
  return box;
}

int64_t MeshSize(const std::vector<int>& mesh_shape) {
  int64_t n = 1;
  for (int s : mesh_shape) n *= s;
  return n;
}

std::vector<int> MeshCoords(int rank, const std::vector<int>& mesh_shape) {
  assert(rank >= 0 && rank < MeshSize(mesh_shape));
  std::vector<int> coords(mesh_shape.size());
  for (size_t m = mesh_shape.size(); m-- > 0;) {
    coords[m] = rank % mesh_shape[m];
    rank /= mesh_shape[m];
  }
  return coords;
}

int MeshRank(const std::vector<int>& mesh_coords, const std::vector<int>& mesh_shape) {
  assert(mesh_coords.size() == mesh_shape.size());
  int rank = 0;
  for (size_t m = 0; m < mesh_shape.size(); ++m) {
    assert(mesh_coords[m] >= 0 && mesh_coords[m] < mesh_shape[m]);
    rank = rank * mesh_shape[m] + mesh_coords[m];
  }
  return rank;
}

}  // namespace dcp
