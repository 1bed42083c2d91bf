// Fuzz target: the dcp metadata decoder over arbitrary bytes. Any input must decode or give
// an error, never crash or read out of bounds; what decodes must survive encode -> decode ->
// encode unchanged.
//
// Header and body are covered by a hash, which random mutations almost never match. So an input
// whose first byte is odd is taken as a *body*: it is sealed with a correct header (flags from bit
// 1 of that byte) before decoding, which lets the fuzzer explore the body parser.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "metadata/codec.h"

namespace {

void Put(std::string& out, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out[at + i] = static_cast<char>(v >> (8 * i));
}

std::string Seal(std::string_view body, uint32_t flags) {
  std::string out(dcp::metadata::kHeaderSize, '\0');
  std::memcpy(out.data(), dcp::metadata::kMagic, sizeof(dcp::metadata::kMagic));
  Put(out, 8, dcp::metadata::kFormatVersion, 4);
  Put(out, 12, flags, 4);
  Put(out, 16, body.size(), 8);
  Put(out, 24, dcp::metadata::SealHash(out, body, dcp::metadata::kFormatVersion), 8);
  out.append(body);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::string sealed;
  if (size > 0 && (data[0] & 1)) {
    sealed = Seal(bytes.substr(1), (data[0] >> 1) & 1);
    bytes = sealed;
  }
  auto md = dcp::metadata::Decode(bytes);
  if (!md.ok()) return 0;
  const std::string once = dcp::metadata::Encode(*md);
  auto again = dcp::metadata::Decode(once);
  if (!again.ok() || dcp::metadata::Encode(*again) != once) std::abort();
  return 0;
}
