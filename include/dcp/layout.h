// Device-mesh layouts: which box of a global tensor a mesh coordinate holds.
//
// A mesh is an N-d grid of ranks (e.g. {tp=2, dp=2}); each mesh dimension either shards
// one tensor dimension or replicates the tensor. Splitting follows torch.chunk exactly,
// and several mesh dimensions sharding the same tensor dimension split it hierarchically
// in mesh-dimension order, as DTensor does. These are pure functions: no state, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcp/box.h"
#include "dcp/status.h"

namespace dcp {

// How one mesh dimension lays a tensor out: shard one tensor dimension, or replicate.
class Placement {
 public:
  static Placement Shard(int tensor_dim) { return Placement(tensor_dim); }
  static Placement Replicate() { return Placement(kReplicate); }

  bool is_shard() const { return dim_ != kReplicate; }
  bool is_replicate() const { return dim_ == kReplicate; }
  // The sharded tensor dimension; meaningful only when is_shard().
  int dim() const { return dim_; }
  std::string ToString() const;  // "S(0)" or "R", as DTensor prints them

  friend bool operator==(const Placement& a, const Placement& b) = default;

 private:
  static constexpr int kReplicate = -1;
  explicit Placement(int dim) : dim_(dim) {}

  int dim_;  // kReplicate, or the tensor dimension (validated by ChunkForRank)
};

// A 1-d half-open range [offset, offset + length).
struct Interval {
  int64_t offset = 0;
  int64_t length = 0;
  friend bool operator==(const Interval& a, const Interval& b) = default;
};

// Piece `index` of `extent` split into `parts` the way torch.chunk does: every piece has
// ceil(extent / parts) elements except the tail, which may be smaller or empty
// (6 in 4 -> 2,2,2,0; 5 in 4 -> 2,2,1,0). An empty piece sits at offset `extent`.
// Requires extent >= 0, parts >= 1, 0 <= index < parts.
Interval TorchChunk(int64_t extent, int parts, int index);

// The box of a tensor of `global_shape` held at `mesh_coords` of a mesh of `mesh_shape`
// with one placement per mesh dimension. The box may be empty (uneven splits).
// InvalidArgument when the sizes of the three vectors differ, a mesh size is < 1, a
// coordinate is out of range, a shard dimension is not a dimension of the tensor, or the
// global shape has a negative extent.
Result<Box> ChunkForRank(const Shape& global_shape, const std::vector<int>& mesh_shape,
                         const std::vector<Placement>& placements,
                         const std::vector<int>& mesh_coords);

// Number of ranks in a mesh (product of its sizes; 1 for an empty mesh).
int64_t MeshSize(const std::vector<int>& mesh_shape);

// The mesh coordinate of `rank`, row-major (last mesh dimension varies fastest).
// Requires every size >= 1 and 0 <= rank < MeshSize(mesh_shape).
std::vector<int> MeshCoords(int rank, const std::vector<int>& mesh_shape);

// The inverse of MeshCoords. Requires coordinates within the mesh.
int MeshRank(const std::vector<int>& mesh_coords, const std::vector<int>& mesh_shape);

}  // namespace dcp
