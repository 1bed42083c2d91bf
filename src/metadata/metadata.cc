#include "metadata/metadata.h"

#include <algorithm>

namespace dcp {

uint64_t Metadata::TotalChunks() const {
  uint64_t n = 0;
  for (const auto& t : tensors) n += t.chunks.size();
  return n;
}

uint64_t Metadata::TotalDataBytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors) {
    for (const auto& c : t.chunks) n += c.byte_length;
  }
  for (const auto& b : bytes) n += b.byte_length;
  return n;
}

template <typename T>
static const T* FindByFqn(const std::vector<T>& v, std::string_view fqn) {
  auto it = std::lower_bound(v.begin(), v.end(), fqn,
                             [](const T& e, std::string_view f) { return e.fqn < f; });
  return it != v.end() && it->fqn == fqn ? &*it : nullptr;
}

const TensorMeta* Metadata::FindTensor(std::string_view fqn) const {
  return FindByFqn(tensors, fqn);
}

const BytesMeta* Metadata::FindBytes(std::string_view fqn) const { return FindByFqn(bytes, fqn); }

}  // namespace dcp

namespace dcp::metadata {

uint32_t VersionFor(const Metadata& md) {
  for (const auto& f : md.files) {
    if (!f.base.empty()) return kFirstReferenceVersion;
  }
  return kFirstReferenceVersion - 1;
}

bool ValidBaseName(std::string_view name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

}  // namespace dcp::metadata
