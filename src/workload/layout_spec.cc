#include "workload/layout_spec.h"

#include <charconv>

#include "dcp/layout.h"

namespace dcp::workload {
namespace {

std::string_view AxisName(MeshAxis a) {
  switch (a) {
    case MeshAxis::kDp:
      return "dp";
    case MeshAxis::kTp:
      return "tp";
    case MeshAxis::kEp:
      return "ep";
  }
  return "?";
}

}  // namespace

int LayoutSpec::WorldSize() const { return static_cast<int>(MeshSize(MeshShape())); }

std::vector<int> LayoutSpec::MeshShape() const {
  std::vector<int> shape;
  for (const MeshDim& d : dims) shape.push_back(d.size);
  return shape;
}

std::string LayoutSpec::ToString() const {
  std::string s;
  for (const MeshDim& d : dims) {
    if (!s.empty()) s += ",";
    s += std::string(AxisName(d.axis)) + std::to_string(d.size);
  }
  return s;
}

Result<LayoutSpec> ParseLayout(std::string_view text) {
  const std::string quoted = "layout '" + std::string(text) + "': ";
  if (text.empty()) return InvalidArgument(quoted + "empty; expected e.g. tp2,dp2");
  LayoutSpec spec;
  int64_t world = 1;
  while (true) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    if (item.size() < 3) {
      return InvalidArgument(quoted + "item '" + std::string(item) + "' is not <dp|tp|ep><size>");
    }
    MeshAxis axis;
    const std::string_view kind = item.substr(0, 2);
    if (kind == "dp") {
      axis = MeshAxis::kDp;
    } else if (kind == "tp") {
      axis = MeshAxis::kTp;
    } else if (kind == "ep") {
      axis = MeshAxis::kEp;
    } else {
      return InvalidArgument(quoted + "unknown axis '" + std::string(kind) +
                             "'; expected dp, tp or ep");
    }
    const std::string_view digits = item.substr(2);
    int size = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), size);
    if (ec != std::errc() || end != digits.data() + digits.size() || size < 1) {
      return InvalidArgument(quoted + "size '" + std::string(digits) + "' of " + std::string(kind) +
                             " is not an integer >= 1");
    }
    for (const MeshDim& d : spec.dims) {
      if (d.axis == axis) return InvalidArgument(quoted + std::string(kind) + " given twice");
    }
    world *= size;
    if (world > (1 << 30)) return InvalidArgument(quoted + "world size is too large");
    spec.dims.push_back({axis, size});
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return spec;
}

Result<std::vector<HeldChunk>> ChunksForRank(const ModelSpec& model, const LayoutSpec& layout,
                                             int rank) {
  const std::vector<int> mesh = layout.MeshShape();
  if (rank < 0 || rank >= layout.WorldSize()) {
    return InvalidArgument("rank " + std::to_string(rank) + " is outside layout " +
                           layout.ToString() + " of " + std::to_string(layout.WorldSize()) +
                           " ranks");
  }
  const std::vector<int> coords = MeshCoords(rank, mesh);
  int ep_size = 1;
  int ep_coord = 0;
  for (size_t m = 0; m < mesh.size(); ++m) {
    if (layout.dims[m].axis == MeshAxis::kEp) {
      ep_size = mesh[m];
      ep_coord = coords[m];
    }
  }

  std::vector<HeldChunk> held;
  std::vector<Placement> placements(mesh.size(), Placement::Replicate());
  for (size_t i = 0; i < model.tensors.size(); ++i) {
    const TensorSpec& t = model.tensors[i];
    if (t.expert >= 0) {
      if (t.expert >= model.num_experts) {
        return InvalidArgument("tensor " + t.fqn + " has expert " + std::to_string(t.expert) +
                               " but the model has " + std::to_string(model.num_experts));
      }
      // Contiguous blocks: ep rank r owns experts e with r <= e * ep / E < r + 1.
      const int owner =
          static_cast<int>(static_cast<int64_t>(t.expert) * ep_size / model.num_experts);
      if (owner != ep_coord) continue;
    }
    for (size_t m = 0; m < mesh.size(); ++m) {
      const bool shard = layout.dims[m].axis == MeshAxis::kTp && t.tp_dim >= 0;
      placements[m] = shard ? Placement::Shard(t.tp_dim) : Placement::Replicate();
    }
    Result<Box> box = ChunkForRank(t.shape, mesh, placements, coords);
    if (!box.ok()) return box.status().Annotate("tensor " + t.fqn + ": ");
    if (box->Empty()) continue;
    held.emplace_back(i, std::move(box).value());
  }
  return held;
}

}  // namespace dcp::workload
