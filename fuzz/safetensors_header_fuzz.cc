// Fuzz target: the safetensors header parser over arbitrary bytes taken as a whole file.
// Any input must give a header or an error, never a crash, a leak or an out-of-bounds read;
// an accepted header must describe exactly the bytes of the input, and accepted sharding info
// (torch's DCP_SHARDING_INFO) a bounded chunk of every tensor.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "hf/safetensors_header.h"
#include "hf/torch_hf_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto h = dcp::hf::ParseSafetensorsHeader(bytes, size, "fuzz.safetensors");
  if (!h.ok()) return 0;
  // Invariants of an accepted file: contiguous ranges covering the data exactly.
  uint64_t pos = 0;
  for (const auto& t : h->tensors) {
    if (t.begin != pos || t.end < t.begin) std::abort();
    pos = t.end;
  }
  if (h->data_start() + pos != size) std::abort();
  // torch's sharding info, when there: offsets for every tensor, each chunk's end bounded.
  auto info = h->metadata.find(std::string(dcp::hf::kShardingInfoKey));
  if (info == h->metadata.end()) return 0;
  auto offsets = dcp::hf::ParseShardingInfo(info->second, h->tensors, "fuzz.safetensors");
  if (!offsets.ok()) return 0;
  if (offsets->size() != h->tensors.size()) std::abort();
  for (size_t i = 0; i < offsets->size(); ++i) {
    const auto& at = (*offsets)[i];
    const auto& shape = h->tensors[i].shape;
    if (at.rank() != shape.rank()) std::abort();
    for (int d = 0; d < at.rank(); ++d) {
      if (at[d] < 0 || static_cast<uint64_t>(at[d] + shape[d]) > (uint64_t{1} << 62)) std::abort();
    }
  }
  return 0;
}
