// Element types: every dtype of the safetensors format, and the complex ones torch has, with
// their width in bits.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace dcp {

enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kU64,
  kI64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kC64,
  kF8_E4M3,
  kF8_E5M2,
  kF8_E8M0,
  kF8_E4M3FNUZ,
  kF8_E5M2FNUZ,
  kF4,       // 4 bits: two elements per byte
  kF6_E2M3,  // 6 bits: four elements per three bytes
  kF6_E3M2,
  // After the safetensors dtypes (codes are stored in the metadata: new ones go last, and a
  // reader that predates them refuses the checkpoint as having an unknown dtype code).
  kC128,  // complex128: two F64
  kC32,   // complex32 (torch.chalf): two F16
};

inline constexpr int kNumDTypes = static_cast<int>(DType::kC32) + 1;

// Width of one element in bits (1 byte for BOOL, as in safetensors).
int DTypeBits(DType t);

// The safetensors spelling: "BF16", "F8_E4M3", ...
std::string_view DTypeName(DType t);

// Parses a safetensors dtype name; nullopt when unknown.
std::optional<DType> ParseDType(std::string_view name);

// Bytes needed for `elements` elements, or nullopt when they do not fill whole bytes
// (sub-byte dtypes) or the size overflows.
std::optional<uint64_t> DTypeBytes(DType t, uint64_t elements);

}  // namespace dcp
