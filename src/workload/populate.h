// Real state dicts for a synthetic model: buffers filled with a pattern any rank can check.
//
// The pattern is a pure function of (fqn, global byte offset): byte k of the tensor's
// row-major global byte image is byte (k % 8) of Mix(XXH3(fqn), k / 8), where byte k belongs
// to element k / width. So a chunk written under one layout can be verified after loading
// it under any other: the value depends on where an element sits in the global tensor,
// never on which rank held it. One 64-bit mix per 8 bytes keeps filling near memcpy speed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/box.h"
#include "dcp/dtype.h"
#include "dcp/state_dict.h"
#include "dcp/status.h"
#include "workload/layout_spec.h"
#include "workload/model.h"

namespace dcp::workload {

// Bytes entries every populated state dict carries (small, rank-independent payloads).
inline constexpr std::string_view kOptimParamGroups = "optim.param_groups";
inline constexpr std::string_view kTrainStep = "train.step";

// The expected payload of a known bytes entry; empty for an unknown name.
std::span<const std::byte> ExpectedBytesEntry(std::string_view fqn);

// A state dict together with the memory its tensor views point into. The views stay
// valid while this object lives, including after it is moved (the buffers are heap
// blocks owned through unique_ptr).
struct OwnedStateDict {
  StateDict sd;
  std::vector<std::unique_ptr<std::byte[]>> buffers;  // one per chunk, in sd order
  uint64_t tensor_bytes = 0;                          // sum of chunk sizes
};

// Physical memory of this machine in bytes (0 when unknown).
uint64_t PhysicalMemoryBytes();

// InvalidArgument, naming `what` and both sizes, when `bytes` exceed 90% of `physical` (0: this
// machine's physical memory). PopulateStateDict and MakeEmptyLike check their allocation so.
Status CheckFitsInMemory(uint64_t bytes, std::string_view what, uint64_t physical = 0);

// The seed of a tensor's pattern.
uint64_t PatternSeed(std::string_view fqn);

// Byte `byte_in_element` of global element `element` of `fqn` for a dtype of
// `element_bytes` bytes per element.
std::byte PatternByte(std::string_view fqn, uint64_t element, int element_bytes,
                      int byte_in_element);

// Writes the pattern of `fqn` for `box` of a tensor of `global_shape` into `out`, which
// holds box.lengths elements of `dtype` row-major. InvalidArgument when the box is not
// inside the shape, `out` has the wrong size, or the dtype is sub-byte.
Status FillPattern(std::string_view fqn, DType dtype, const Shape& global_shape, const Box& box,
                   std::span<std::byte> out);

// The state dict `rank` holds under `layout`, filled with the pattern, plus the bytes
// entries kOptimParamGroups and kTrainStep with their expected payloads.
Result<OwnedStateDict> PopulateStateDict(const ModelSpec& model, const LayoutSpec& layout,
                                         int rank);

// The same chunks as PopulateStateDict but zeroed, with empty bytes entries: a load
// destination for `layout`.
Result<OwnedStateDict> MakeEmptyLike(const ModelSpec& model, const LayoutSpec& layout, int rank);

// Checks every byte of every chunk against the pattern, and every known bytes entry
// against its payload (unknown bytes entries are not checked). DataLoss naming the fqn,
// the chunk's box, the element's global coordinate and the byte on the first mismatch;
// InvalidArgument for a malformed chunk (view shape or dtype disagreeing with the entry,
// a box outside the tensor, a null buffer, non-host memory).
Status VerifyStateDict(const StateDict& sd);

}  // namespace dcp::workload
