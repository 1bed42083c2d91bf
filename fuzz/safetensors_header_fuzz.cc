// Fuzz target: the safetensors header parser over arbitrary bytes taken as a whole file.
// Any input must give a header or an error, never a crash, a leak or an out-of-bounds read;
// an accepted header must describe exactly the bytes of the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "hf/safetensors_header.h"

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
  return 0;
}
