#include "metadata/merge.h"

#include <algorithm>
#include <map>

namespace dcp::metadata {

Result<Metadata> MergeRankMetadata(const std::vector<Metadata>& parts) {
  if (parts.empty()) return InvalidArgument("no per-rank metadata to merge");
  Metadata out;
  out.save_id = parts[0].save_id;
  out.world_size = static_cast<uint32_t>(parts.size());
  // Block checksums are counted in the set's one block size (0: none, formats 1 and 2).
  out.block_size = parts[0].block_size;
  std::map<std::string, TensorMeta, std::less<>> tensors;
  std::map<std::string, BytesMeta, std::less<>> bytes;
  std::map<std::string, size_t, std::less<>> tensor_rank;
  for (size_t r = 0; r < parts.size(); ++r) {
    const Metadata& p = parts[r];
    if (p.world_size != parts.size()) {
      return FailedPrecondition("per-rank metadata of rank " + std::to_string(r) +
                                " was written by a job of " + std::to_string(p.world_size) +
                                " ranks, but " + std::to_string(parts.size()) +
                                " rank files are present (files of different saves?)");
    }
    if (p.block_size != out.block_size) {
      return FailedPrecondition("per-rank metadata of rank " + std::to_string(r) +
                                " has checksum blocks of " + std::to_string(p.block_size) +
                                " bytes, rank 0's of " + std::to_string(out.block_size) +
                                " (files of different saves?)");
    }
    const auto file_base = static_cast<uint32_t>(out.files.size());
    out.files.insert(out.files.end(), p.files.begin(), p.files.end());
    for (const TensorMeta& t : p.tensors) {
      auto [it, inserted] =
          tensors.try_emplace(t.fqn, TensorMeta{t.fqn, t.dtype, t.global_shape, {}, t.path});
      if (inserted) tensor_rank[t.fqn] = r;
      TensorMeta& m = it->second;
      if (m.path.empty()) m.path = t.path;
      if (m.dtype != t.dtype || !(m.global_shape == t.global_shape)) {
        return InvalidArgument("tensor '" + t.fqn + "': rank " +
                               std::to_string(tensor_rank[t.fqn]) + " saved " +
                               std::string(DTypeName(m.dtype)) + " " + m.global_shape.ToString() +
                               ", rank " + std::to_string(r) + " " +
                               std::string(DTypeName(t.dtype)) + " " + t.global_shape.ToString());
      }
      for (StoredChunk c : t.chunks) {
        c.file += file_base;
        m.chunks.push_back(c);
      }
    }
    for (BytesMeta b : p.bytes) {
      b.file += file_base;
      bytes.try_emplace(b.fqn, b);
    }
  }
  for (auto& [fqn, t] : tensors) {
    // Lowest rank first among identical boxes: stable sort keeps rank order.
    std::stable_sort(t.chunks.begin(), t.chunks.end(),
                     [](const StoredChunk& a, const StoredChunk& b) { return a.box < b.box; });
    t.chunks.erase(
        std::unique(t.chunks.begin(), t.chunks.end(),
                    [](const StoredChunk& a, const StoredChunk& b) { return a.box == b.box; }),
        t.chunks.end());
    out.tensors.push_back(std::move(t));
  }
  for (auto& [fqn, b] : bytes) out.bytes.push_back(std::move(b));
  return out;
}

}  // namespace dcp::metadata
