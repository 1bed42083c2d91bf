#include "workload/populate.h"

#include <gtest/gtest.h>

#include <cstring>

namespace dcp::workload {
namespace {

ModelSpec SmallQwen() {
  auto m = MakeModel("qwen3-30b-a3b", 1, 1.0 / 64, DType::kBF16);
  EXPECT_TRUE(m.ok());
  return std::move(m).value();
}

LayoutSpec Layout(const char* text) {
  auto l = ParseLayout(text);
  EXPECT_TRUE(l.ok()) << text;
  return std::move(l).value();
}

// Row-major offset (in elements) of global coordinate `at` inside `box`.
uint64_t LocalIndex(const Box& box, const Shape& at) {
  uint64_t idx = 0;
  for (int d = 0; d < box.rank(); ++d) {
    idx = idx * box.lengths[d] + static_cast<uint64_t>(at[d] - box.offsets[d]);
  }
  return idx;
}

// A deliberately naive reference resharder: copies every element of every overlap.
void CopyOverlaps(const StateDict& src, StateDict& dst) {
  for (size_t i = 0; i < dst.size(); ++i) {
    const StateEntry& de = dst.entries()[i];
    const StateEntry* se = src.find(de.fqn);
    if (se == nullptr) continue;  // e.g. an expert this source rank does not own
    if (de.kind == StateEntry::Kind::kBytes) {
      dst.mutable_bytes(i) = se->bytes;
      continue;
    }
    const size_t width = DTypeBits(de.dtype) / 8;
    for (const TensorChunk& dc : de.chunks) {
      for (const TensorChunk& sc : se->chunks) {
        std::optional<Box> o = Intersect(dc.box, sc.box);
        if (!o && !(dc.box.rank() == 0 && sc.box.rank() == 0)) continue;
        const Box overlap = o.value_or(dc.box);
        Shape at = overlap.offsets;
        for (uint64_t n = 0; n < overlap.NumElements(); ++n) {
          std::memcpy(dc.view.bytes() + LocalIndex(dc.box, at) * width,
                      sc.view.bytes() + LocalIndex(sc.box, at) * width, width);
          for (int d = overlap.rank() - 1; d >= 0; --d) {
            if (++at[d] < overlap.offsets[d] + overlap.lengths[d]) break;
            at[d] = overlap.offsets[d];
          }
        }
      }
    }
  }
}

TEST(PatternTest, DependsOnFqnAndGlobalPositionOnly) {
  // Element 5 of a [4, 3] tensor is [1, 2]; its bytes are the same whichever chunk holds it.
  const Shape shape = {4, 3};
  std::vector<std::byte> whole(12 * 2), part(2 * 2);
  ASSERT_TRUE(FillPattern("w", DType::kBF16, shape, Box::Whole(shape), whole).ok());
  ASSERT_TRUE(FillPattern("w", DType::kBF16, shape, Box{{1, 1}, {2, 1}}, part).ok());
  EXPECT_EQ(part[2], whole[7 * 2]);  // [2, 1] = flat 7
  EXPECT_EQ(part[0], whole[4 * 2]);  // [1, 1] = flat 4
  EXPECT_EQ(part[1], whole[4 * 2 + 1]);
  for (int e = 0; e < 12; ++e) {
    for (int b = 0; b < 2; ++b) EXPECT_EQ(whole[e * 2 + b], PatternByte("w", e, 2, b));
  }
  std::vector<std::byte> other(12 * 2);
  ASSERT_TRUE(FillPattern("v", DType::kBF16, shape, Box::Whole(shape), other).ok());
  EXPECT_NE(whole, other);
  // Neighbouring elements differ, so a shifted copy is caught.
  EXPECT_NE(std::vector(whole.begin(), whole.begin() + 12),
            std::vector(whole.begin() + 2, whole.begin() + 14));
}

TEST(PatternTest, FillPatternRejectsBadArguments) {
  std::vector<std::byte> buf(8);
  EXPECT_EQ(FillPattern("w", DType::kF32, {4}, Box{{2}, {3}}, buf).code(),
            StatusCode::kInvalidArgument);  // outside the shape
  EXPECT_EQ(FillPattern("w", DType::kF32, {4}, Box{{0}, {3}}, buf).code(),
            StatusCode::kInvalidArgument);  // 12 bytes needed
  EXPECT_EQ(FillPattern("w", DType::kF4, {16}, Box{{0}, {16}}, buf).code(),
            StatusCode::kInvalidArgument);  // sub-byte
}

TEST(PopulateTest, HoldsLayoutChunksAndBytesEntries) {
  const ModelSpec model = SmallQwen();
  const LayoutSpec layout = Layout("tp2,ep2");
  auto owned = PopulateStateDict(model, layout, 3);
  ASSERT_TRUE(owned.ok()) << owned.status().ToString();
  auto chunks = ChunksForRank(model, layout, 3);
  ASSERT_TRUE(chunks.ok());
  EXPECT_EQ(owned->buffers.size(), chunks->size());
  uint64_t bytes = 0;
  for (const auto& [i, box] : *chunks) {
    const StateEntry* e = owned->sd.find(model.tensors[i].fqn);
    ASSERT_NE(e, nullptr);
    ASSERT_EQ(e->chunks.size(), 1u);
    EXPECT_EQ(e->chunks[0].box, box);
    EXPECT_EQ(e->global_shape, model.tensors[i].shape);
    bytes += box.NumElements() * 2;
  }
  EXPECT_EQ(owned->tensor_bytes, bytes);
  const StateEntry* step = owned->sd.find(kTrainStep);
  const StateEntry* groups = owned->sd.find(kOptimParamGroups);
  ASSERT_TRUE(step && groups);
  EXPECT_EQ(step->kind, StateEntry::Kind::kBytes);
  EXPECT_EQ(step->bytes.size(), 8u);
  EXPECT_GT(groups->bytes.size(), 50u);
  EXPECT_EQ(owned->sd.size(), chunks->size() + 2);
  EXPECT_TRUE(VerifyStateDict(owned->sd).ok());

  // Moving keeps the views valid: they point into heap blocks, not into the struct.
  OwnedStateDict moved = std::move(owned).value();
  EXPECT_TRUE(VerifyStateDict(moved.sd).ok());
}

TEST(PopulateTest, EveryLayoutVerifies) {
  const ModelSpec model = SmallQwen();
  for (const char* text : {"dp4", "tp2,dp2", "tp4", "ep4", "tp2,ep2"}) {
    const LayoutSpec layout = Layout(text);
    for (int r = 0; r < layout.WorldSize(); ++r) {
      auto owned = PopulateStateDict(model, layout, r);
      ASSERT_TRUE(owned.ok());
      Status s = VerifyStateDict(owned->sd);
      EXPECT_TRUE(s.ok()) << text << " rank " << r << ": " << s.ToString();
    }
  }
}

TEST(PopulateTest, ReshardedIntoAnyLayoutVerifies) {
  const ModelSpec model = SmallQwen();
  const LayoutSpec from = Layout("tp2,ep2");
  std::vector<OwnedStateDict> src;
  for (int r = 0; r < from.WorldSize(); ++r) {
    auto owned = PopulateStateDict(model, from, r);
    ASSERT_TRUE(owned.ok());
    src.push_back(std::move(owned).value());
  }
  for (const char* to_text : {"dp2", "tp4", "ep4", "tp2,dp2"}) {
    const LayoutSpec to = Layout(to_text);
    for (int r = 0; r < to.WorldSize(); ++r) {
      auto dst = MakeEmptyLike(model, to, r);
      ASSERT_TRUE(dst.ok());
      EXPECT_EQ(VerifyStateDict(dst->sd).code(), StatusCode::kDataLoss);
      for (const OwnedStateDict& s : src) CopyOverlaps(s.sd, dst->sd);
      Status st = VerifyStateDict(dst->sd);
      EXPECT_TRUE(st.ok()) << to_text << " rank " << r << ": " << st.ToString();
    }
  }
}

TEST(PopulateTest, MakeEmptyLikeIsZeroedWithEmptyBytesEntries) {
  const ModelSpec model = SmallQwen();
  const LayoutSpec layout = Layout("tp4");
  auto dst = MakeEmptyLike(model, layout, 1);
  auto src = PopulateStateDict(model, layout, 1);
  ASSERT_TRUE(dst.ok() && src.ok());
  ASSERT_EQ(dst->sd.size(), src->sd.size());
  EXPECT_EQ(dst->tensor_bytes, src->tensor_bytes);
  for (size_t i = 0; i < dst->sd.size(); ++i) {
    const StateEntry& d = dst->sd.entries()[i];
    const StateEntry& s = src->sd.entries()[i];
    EXPECT_EQ(d.fqn, s.fqn);
    if (d.kind == StateEntry::Kind::kBytes) {
      EXPECT_TRUE(d.bytes.empty());
      continue;
    }
    ASSERT_EQ(d.chunks.size(), 1u);
    EXPECT_EQ(d.chunks[0].box, s.chunks[0].box);
    const TensorView& v = d.chunks[0].view;
    for (uint64_t b = 0; b < v.NumBytes(); ++b) ASSERT_EQ(v.bytes()[b], std::byte{0});
  }
  const Status s = VerifyStateDict(dst->sd);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
}

TEST(VerifyTest, ReportsFirstMismatchWithCoordinate) {
  ModelSpec model;
  model.name = "custom";
  model.tensors = {{"a", DType::kF32, {6, 5}, 0, -1}, {"b", DType::kBF16, {7, 3}, 1, -1}};
  const LayoutSpec layout = Layout("tp2");
  auto owned = PopulateStateDict(model, layout, 1);
  ASSERT_TRUE(owned.ok());
  ASSERT_TRUE(VerifyStateDict(owned->sd).ok());
  // "b" rank 1 holds columns [2, 3) (3 split 2 -> 2, 1): box {[0, 2], [7, 1]}. Flip byte 1
  // of its local element 4 = global [4, 2] = flat 14.
  const StateEntry* b = owned->sd.find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->chunks[0].box, (Box{{0, 2}, {7, 1}}));
  b->chunks[0].view.bytes()[4 * 2 + 1] ^= std::byte{0x40};
  const Status s = VerifyStateDict(owned->sd);
  ASSERT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("tensor b chunk {offsets [0, 2], lengths [7, 1]}"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("element [4, 2] (flat 14) byte 1"), std::string::npos) << s.message();
}

TEST(VerifyTest, ReportsElementWithinLongRun) {
  const Shape shape = {3, 40000};  // runs longer than the 64 KiB comparison window
  std::vector<std::byte> buf(3 * 40000 * 4);
  ASSERT_TRUE(FillPattern("x", DType::kF32, shape, Box::Whole(shape), buf).ok());
  StateDict sd;
  sd.add("x", TensorView(buf.data(), DType::kF32, shape));
  ASSERT_TRUE(VerifyStateDict(sd).ok());
  buf[(40000 + 39999) * 4 + 3] ^= std::byte{1};
  const Status s = VerifyStateDict(sd);
  EXPECT_NE(s.message().find("element [1, 39999] (flat 79999) byte 3"), std::string::npos)
      << s.message();
}

TEST(VerifyTest, ScalarsAndOddOffsets) {
  ModelSpec model;
  model.name = "custom";
  model.tensors = {{"s", DType::kF64, Shape{}, -1, -1}, {"u", DType::kU8, {5, 3}, 0, -1}};
  for (int r = 0; r < 4; ++r) {
    auto owned = PopulateStateDict(model, Layout("tp4"), r);
    ASSERT_TRUE(owned.ok());
    EXPECT_TRUE(VerifyStateDict(owned->sd).ok());
    const StateEntry* s = owned->sd.find("s");
    ASSERT_NE(s, nullptr);
    for (int k = 0; k < 8; ++k) {
      EXPECT_EQ(s->chunks[0].view.bytes()[k], PatternByte("s", 0, 8, k));
    }
  }
}

TEST(VerifyTest, BytesEntriesAndMalformedChunks) {
  StateDict sd;
  sd.add_bytes(kTrainStep, ExpectedBytesEntry(kTrainStep));
  sd.add_bytes("user.blob", std::string_view("anything"));  // unknown: not checked
  EXPECT_TRUE(VerifyStateDict(sd).ok());
  sd.mutable_bytes(0)[0] ^= std::byte{1};
  const Status s = VerifyStateDict(sd);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("train.step"), std::string::npos);

  std::vector<std::byte> buf(16);
  StateDict bad;
  bad.add("w", TensorView(buf.data(), DType::kF32, {4}), Chunk{{4}, {2}});  // past the end
  EXPECT_EQ(VerifyStateDict(bad).code(), StatusCode::kInvalidArgument);
  StateDict null_data;
  null_data.add("w", TensorView(nullptr, DType::kF32, {4}));
  EXPECT_EQ(VerifyStateDict(null_data).code(), StatusCode::kInvalidArgument);
}

TEST(PopulateTest, RefusesStateLargerThanMemory) {
  EXPECT_GT(PhysicalMemoryBytes(), 0u);
  EXPECT_TRUE(CheckFitsInMemory(800, "x", 1000).ok());
  Status big = CheckFitsInMemory(uint64_t{901} << 20, "rank 0's state", uint64_t{1000} << 20);
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("rank 0's state needs 901 MiB, more than this machine's memory"),
            std::string::npos)
      << big.ToString();
  // dense-500b at full width on one rank: ~929 GiB at 126 layers; 4096 layers are ~30 TiB, more
  // than any machine this runs on. Refused before a byte is allocated.
  auto model = MakeModel("dense-500b", 4096);
  ASSERT_TRUE(model.ok());
  auto layout = ParseLayout("dp1");
  ASSERT_TRUE(layout.ok());
  auto sd = PopulateStateDict(*model, *layout, 0);
  ASSERT_FALSE(sd.ok());
  EXPECT_EQ(sd.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(sd.status().message().find("more than this machine's memory"), std::string::npos)
      << sd.status().ToString();
  EXPECT_FALSE(MakeEmptyLike(*model, *layout, 0).ok());
}

}  // namespace
}  // namespace dcp::workload
