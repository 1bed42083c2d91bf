// Non-owning views of tensor memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dcp/box.h"
#include "dcp/dtype.h"

namespace dcp {

// Where a view's memory lives. Only host memory is read and written today; the field
// exists so device memory (CUDA) can be added without changing the API.
enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };

// A row-major contiguous tensor in caller memory. Cheap to copy; it does not own `data`,
// which must stay valid (and, for save, unchanged) until the call using it returns.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  MemoryKind memory = MemoryKind::kHost;

  TensorView() = default;
  TensorView(void* d, DType t, Shape s, MemoryKind m = MemoryKind::kHost)
      : data(d), dtype(t), shape(s), memory(m) {}

  // Throw dcp::Error (kInvalidArgument) when the shape has a negative extent or the size
  // does not fit 64 bits, in every build type.
  uint64_t NumElements() const;
  // Size in bytes; sub-byte dtypes round up (validation rejects partial bytes).
  uint64_t NumBytes() const;
  std::byte* bytes() const { return static_cast<std::byte*>(data); }
};

}  // namespace dcp
