#include "workload/populate.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cstring>
#include <string>

namespace dcp::workload {
namespace {

// splitmix64's finalizer over (seed, word index): a bijection of the word index for a given
// seed, so neighbouring words (and thus shifted copies) never look alike.
inline uint64_t Mix(uint64_t seed, uint64_t word) {
  uint64_t z = seed + word * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Little-endian byte image of a pattern word, whatever the host's byte order.
inline void StoreWord(uint64_t v, std::byte* out) {
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  std::memcpy(out, &v, 8);
}

// Writes bytes [offset, offset + n) of the tensor's global pattern image.
void FillBytes(uint64_t seed, uint64_t offset, std::byte* out, uint64_t n) {
  std::array<std::byte, 8> word;
  while (n > 0 && offset % 8 != 0) {  // unaligned head
    StoreWord(Mix(seed, offset / 8), word.data());
    *out++ = word[offset % 8];
    ++offset;
    --n;
  }
  for (; n >= 8; n -= 8, offset += 8, out += 8) StoreWord(Mix(seed, offset / 8), out);
  if (n > 0) {  // tail
    StoreWord(Mix(seed, offset / 8), word.data());
    std::memcpy(out, word.data(), n);
  }
}

// Calls fn(global coordinate of the run start, global flat element index, local flat
// element index, run length) for each row-major run of `box` along its last dimension.
// fn returns false to stop early.
template <typename Fn>
void ForEachRun(const Shape& global, const Box& box, Fn&& fn) {
  const int rank = box.rank();
  if (box.Empty()) return;
  if (rank == 0) {
    fn(Shape{}, uint64_t{0}, uint64_t{0}, uint64_t{1});
    return;
  }
  Shape strides = Shape::Zeros(rank);
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= global[d];
  }
  const uint64_t run = static_cast<uint64_t>(box.lengths[rank - 1]);
  Shape coord = box.offsets;  // global coordinate of the current run start
  uint64_t local = 0;
  while (true) {
    uint64_t flat = 0;
    for (int d = 0; d < rank; ++d) flat += static_cast<uint64_t>(coord[d] * strides[d]);
    if (!fn(coord, flat, local, run)) return;
    local += run;
    // Odometer over the leading dims, last-but-one fastest.
    int d = rank - 2;
    for (; d >= 0; --d) {
      if (++coord[d] < box.offsets[d] + box.lengths[d]) break;
      coord[d] = box.offsets[d];
    }
    if (d < 0) return;
  }
}

std::string Hex(std::byte b) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0x%02x", static_cast<unsigned>(b));
  return buf;
}

const std::vector<std::byte>& ParamGroupsPayload() {
  static const std::vector<std::byte> kPayload = [] {
    const std::string_view text =
        R"([{"lr":0.0003,"betas":[0.9,0.95],"eps":1e-08,"weight_decay":0.1,"name":"decay"},)"
        R"({"lr":0.0003,"betas":[0.9,0.95],"eps":1e-08,"weight_decay":0.0,"name":"no_decay"}])";
    const auto* p = reinterpret_cast<const std::byte*>(text.data());
    return std::vector<std::byte>(p, p + text.size());
  }();
  return kPayload;
}

const std::vector<std::byte>& TrainStepPayload() {
  // A little-endian int64 step, as a framework would serialize a counter.
  static const std::vector<std::byte> kPayload = [] {
    std::vector<std::byte> v(8);
    StoreWord(123456, v.data());
    return v;
  }();
  return kPayload;
}

enum class Fill { kPattern, kZero };

}  // namespace

uint64_t PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

Status CheckFitsInMemory(uint64_t bytes, std::string_view what, uint64_t physical) {
  if (physical == 0) physical = PhysicalMemoryBytes();
  if (physical == 0) return OkStatus();  // unknown: nothing to compare with
  if (bytes > physical / 10 * 9) {
    return InvalidArgument(std::string(what) + " needs " + std::to_string(bytes >> 20) +
                           " MiB, more than this machine's memory (" +
                           std::to_string(physical >> 20) +
                           " MiB physical); use fewer --layers, a smaller --width-scale or more "
                           "ranks");
  }
  return OkStatus();
}

namespace {

Result<OwnedStateDict> Build(const ModelSpec& model, const LayoutSpec& layout, int rank,
                             Fill fill) {
  DCP_ASSIGN_OR_RETURN(std::vector<HeldChunk> chunks, ChunksForRank(model, layout, rank));
  // Estimate before allocating: a state that cannot fit fails here, clearly, rather than
  // ending in the OOM killer.
  uint64_t need = 0;
  for (const auto& [index, box] : chunks) {
    need += DTypeBytes(model.tensors[index].dtype, box.NumElements()).value_or(0);
  }
  DCP_RETURN_IF_ERROR(CheckFitsInMemory(need, "rank " + std::to_string(rank) + "'s state of " +
                                                  model.name + " (" +
                                                  std::to_string(model.num_layers) + " layers)"));
  OwnedStateDict out;
  out.buffers.reserve(chunks.size());
  for (const auto& [index, box] : chunks) {
    const TensorSpec& t = model.tensors[index];
    const std::optional<uint64_t> bytes = DTypeBytes(t.dtype, box.NumElements());
    if (!bytes) {
      return InvalidArgument("tensor " + t.fqn + ": chunk " + box.ToString() +
                             " is not a whole number of bytes of " +
                             std::string(DTypeName(t.dtype)));
    }
    // Zeroed for load destinations; left uninitialised when the pattern overwrites it.
    auto buffer = fill == Fill::kZero ? std::make_unique<std::byte[]>(*bytes)
                                      : std::make_unique_for_overwrite<std::byte[]>(*bytes);
    if (fill == Fill::kPattern) {
      DCP_RETURN_IF_ERROR(
          FillPattern(t.fqn, t.dtype, t.shape, box, std::span(buffer.get(), *bytes)));
    }
    out.sd.add(t.fqn, TensorView(buffer.get(), t.dtype, box.lengths), Chunk{t.shape, box.offsets});
    out.tensor_bytes += *bytes;
    out.buffers.push_back(std::move(buffer));
  }
  for (std::string_view fqn : {kOptimParamGroups, kTrainStep}) {
    if (fill == Fill::kPattern) {
      out.sd.add_bytes(fqn, ExpectedBytesEntry(fqn));
    } else {
      out.sd.add_bytes(fqn);
    }
  }
  return out;
}

Status VerifyChunk(const StateEntry& e, const TensorChunk& c) {
  const std::string where = "tensor " + e.fqn + " chunk " + c.box.ToString();
  if (c.view.dtype != e.dtype) {
    return InvalidArgument(where + ": view dtype " + std::string(DTypeName(c.view.dtype)) +
                           " differs from the entry's " + std::string(DTypeName(e.dtype)));
  }
  if (c.view.shape != c.box.lengths) {
    return InvalidArgument(where + ": view shape " + c.view.shape.ToString() +
                           " differs from the box lengths");
  }
  if (c.view.memory != MemoryKind::kHost) {
    return InvalidArgument(where + ": only host memory can be verified");
  }
  const int width_bits = DTypeBits(e.dtype);
  if (width_bits % 8 != 0) {
    return InvalidArgument(where + ": sub-byte dtype " + std::string(DTypeName(e.dtype)) +
                           " has no byte pattern");
  }
  if (!c.box.WithinShape(e.global_shape)) {
    return InvalidArgument(where + " is not inside global shape " + e.global_shape.ToString());
  }
  if (c.box.Empty()) return OkStatus();
  if (c.view.data == nullptr) return InvalidArgument(where + ": null buffer");

  const uint64_t width = static_cast<uint64_t>(width_bits / 8);
  const uint64_t seed = PatternSeed(e.fqn);
  const std::byte* data = c.view.bytes();
  std::array<std::byte, 64 * 1024> expected;  // compared piecewise: memcmp does the work
  Status status;
  ForEachRun(e.global_shape, c.box,
             [&](const Shape& coord, uint64_t flat, uint64_t local, uint64_t run) {
               const uint64_t run_bytes = run * width;
               for (uint64_t done = 0; done < run_bytes;) {
                 const uint64_t n = std::min<uint64_t>(expected.size(), run_bytes - done);
                 FillBytes(seed, flat * width + done, expected.data(), n);
                 const std::byte* got = data + local * width + done;
                 if (std::memcmp(got, expected.data(), n) != 0) {
                   uint64_t k = 0;
                   while (got[k] == expected[k]) ++k;
                   const uint64_t byte_in_run = done + k;
                   Shape at = coord;
                   if (at.rank() > 0)
                     at[at.rank() - 1] += static_cast<int64_t>(byte_in_run / width);
                   status = DataLoss(where + ": element " + at.ToString() + " (flat " +
                                     std::to_string(flat + byte_in_run / width) + ") byte " +
                                     std::to_string(byte_in_run % width) + " is " + Hex(got[k]) +
                                     ", expected " + Hex(expected[k]));
                   return false;
                 }
                 done += n;
               }
               return true;
             });
  return status;
}

}  // namespace

std::span<const std::byte> ExpectedBytesEntry(std::string_view fqn) {
  if (fqn == kOptimParamGroups) return ParamGroupsPayload();
  if (fqn == kTrainStep) return TrainStepPayload();
  return {};
}

uint64_t PatternSeed(std::string_view fqn) { return XXH3_64bits(fqn.data(), fqn.size()); }

std::byte PatternByte(std::string_view fqn, uint64_t element, int element_bytes,
                      int byte_in_element) {
  std::byte b;
  FillBytes(PatternSeed(fqn), element * element_bytes + byte_in_element, &b, 1);
  return b;
}

Status FillPattern(std::string_view fqn, DType dtype, const Shape& global_shape, const Box& box,
                   std::span<std::byte> out) {
  const std::string where = "tensor " + std::string(fqn) + " chunk " + box.ToString();
  if (DTypeBits(dtype) % 8 != 0) {
    return InvalidArgument(where + ": sub-byte dtype " + std::string(DTypeName(dtype)) +
                           " has no byte pattern");
  }
  if (!box.WithinShape(global_shape)) {
    return InvalidArgument(where + " is not inside global shape " + global_shape.ToString());
  }
  const uint64_t width = static_cast<uint64_t>(DTypeBits(dtype) / 8);
  if (out.size() != box.NumElements() * width) {
    return InvalidArgument(where + ": buffer of " + std::to_string(out.size()) +
                           " bytes, expected " + std::to_string(box.NumElements() * width));
  }
  const uint64_t seed = PatternSeed(fqn);
  ForEachRun(global_shape, box, [&](const Shape&, uint64_t flat, uint64_t local, uint64_t run) {
    FillBytes(seed, flat * width, out.data() + local * width, run * width);
    return true;
  });
  return OkStatus();
}

Result<OwnedStateDict> PopulateStateDict(const ModelSpec& model, const LayoutSpec& layout,
                                         int rank) {
  return Build(model, layout, rank, Fill::kPattern);
}

Result<OwnedStateDict> MakeEmptyLike(const ModelSpec& model, const LayoutSpec& layout, int rank) {
  return Build(model, layout, rank, Fill::kZero);
}

Status VerifyStateDict(const StateDict& sd) {
  for (const StateEntry& e : sd.entries()) {
    if (e.kind == StateEntry::Kind::kBytes) {
      const std::span<const std::byte> want = ExpectedBytesEntry(e.fqn);
      if (want.empty()) continue;  // not ours to check
      if (!std::equal(want.begin(), want.end(), e.bytes.begin(), e.bytes.end())) {
        return DataLoss("bytes entry " + e.fqn + ": payload of " + std::to_string(e.bytes.size()) +
                        " bytes does not match the expected " + std::to_string(want.size()) +
                        " bytes");
      }
      continue;
    }
    for (const TensorChunk& c : e.chunks) DCP_RETURN_IF_ERROR(VerifyChunk(e, c));
  }
  return OkStatus();
}

}  // namespace dcp::workload
