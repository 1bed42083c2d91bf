#include "dcp/tensor.h"

#include <string>

#include "dcp/status.h"

namespace dcp {

uint64_t TensorView::NumElements() const {
  const std::optional<uint64_t> n = shape.NumElements();
  if (!n) {
    throw Error(InvalidArgument("tensor view of shape " + shape.ToString() +
                                ": negative extent or more than 2^64 elements"));
  }
  return *n;
}

uint64_t TensorView::NumBytes() const {
  uint64_t bits = 0;
  if (__builtin_mul_overflow(NumElements(), static_cast<uint64_t>(DTypeBits(dtype)), &bits)) {
    throw Error(InvalidArgument("tensor view of shape " + shape.ToString() + " and dtype " +
                                std::string(DTypeName(dtype)) + ": size overflows 64 bits"));
  }
  return bits / 8 + (bits % 8 != 0);
}

}  // namespace dcp
