#include "dcp/dtype.h"

#include <array>

namespace dcp {
namespace {

struct DTypeInfo {
  std::string_view name;
  int bits;
};

// Indexed by DType; the order must match the enum.
constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
    {"BOOL", 8},    {"U8", 8},      {"I8", 8},          {"U16", 16},        {"I16", 16},
    {"U32", 32},    {"I32", 32},    {"U64", 64},        {"I64", 64},        {"F16", 16},
    {"BF16", 16},   {"F32", 32},    {"F64", 64},        {"C64", 64},        {"F8_E4M3", 8},
    {"F8_E5M2", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"F4", 4},
    {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"C128", 128},      {"C32", 32},
}};

}  // namespace

int DTypeBits(DType t) { return kInfo[static_cast<int>(t)].bits; }

std::string_view DTypeName(DType t) { return kInfo[static_cast<int>(t)].name; }

std::optional<DType> ParseDType(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (kInfo[i].name == name) return static_cast<DType>(i);
  }
  return std::nullopt;
}

std::optional<uint64_t> DTypeBytes(DType t, uint64_t elements) {
  uint64_t bits = 0;
  if (__builtin_mul_overflow(elements, static_cast<uint64_t>(DTypeBits(t)), &bits)) {
    return std::nullopt;
  }
  if (bits % 8 != 0) return std::nullopt;
  return bits / 8;
}

}  // namespace dcp
