#include "planner/load_plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace dcp::planner {
namespace {

metadata::StoredChunk Stored(const Box& box, uint32_t file, uint64_t offset, DType dtype) {
  const uint64_t len = *DTypeBytes(dtype, box.NumElements());
  return metadata::StoredChunk{box, file, offset, len, 0};
}

// "w": F32 [4, 6] stored as two row halves, rows 0..1 in file 0 at 0, rows 2..3 in file 1
// at 100. "v": F32 [8] whole in file 0 at 48. "extra": bytes in file 1 at 0.
metadata::Metadata SampleMetadata() {
  metadata::Metadata md;
  md.files = {{"data_0", 1000}, {"data_1", 1000}};
  metadata::TensorMeta v{"v", DType::kF32, Shape{8}, {}};
  v.chunks = {Stored(Box::Whole(Shape{8}), 0, 48, DType::kF32)};
  metadata::TensorMeta w{"w", DType::kF32, Shape{4, 6}, {}};
  w.chunks = {Stored(Box{Shape{0, 0}, Shape{2, 6}}, 0, 0, DType::kF32),
              Stored(Box{Shape{2, 0}, Shape{2, 6}}, 1, 100, DType::kF32)};
  md.tensors = {v, w};
  md.bytes = {metadata::BytesMeta{"extra", 1, 0, 5, 0}};
  return md;
}

Result<LocalLoadPlan> Plan(const StateDict& sd, const metadata::Metadata& md,
                           bool allow_partial = false) {
  return PlanLoad(sd, md, allow_partial, "/ckpt/step_1");
}

void ExpectError(const Result<LocalLoadPlan>& r, StatusCode code,
                 const std::vector<std::string>& parts) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  for (const std::string& p : parts) {
    EXPECT_NE(r.status().message().find(p), std::string::npos)
        << "'" << p << "' not in: " << r.status().message();
  }
}

TEST(PlanLoadTest, OneReadPerIntersectionWithTheRightRegion) {
  const metadata::Metadata md = SampleMetadata();
  // Columns 2..4 of "w" (all rows): intersects both stored row halves.
  std::vector<float> cols(4 * 3);
  StateDict sd;
  sd.add("w", TensorView(cols.data(), DType::kF32, Shape{4, 3}), Chunk{Shape{4, 6}, Shape{0, 2}});
  auto r = Plan(sd, md);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->reads.size(), 2u);
  EXPECT_EQ(r->reads[0].entry, 0u);
  EXPECT_EQ(r->reads[0].dst_chunk, 0u);
  EXPECT_EQ(r->reads[0].tensor, 1u);
  EXPECT_EQ(r->reads[0].stored, 0u);
  EXPECT_EQ(r->reads[0].region, (Box{Shape{0, 2}, Shape{2, 3}}));
  EXPECT_EQ(r->reads[1].tensor, 1u);
  EXPECT_EQ(r->reads[1].stored, 1u);
  EXPECT_EQ(r->reads[1].region, (Box{Shape{2, 2}, Shape{2, 3}}));
  EXPECT_TRUE(r->bytes.empty());
  EXPECT_TRUE(r->skipped.empty());
}

TEST(PlanLoadTest, DestinationInsideOneStoredChunkIsOneRead) {
  const metadata::Metadata md = SampleMetadata();
  std::vector<float> a(6), b(2);
  StateDict sd;
  sd.add("w", TensorView(a.data(), DType::kF32, Shape{1, 6}), Chunk{Shape{4, 6}, Shape{3, 0}});
  sd.add("v", TensorView(b.data(), DType::kF32, Shape{2}), Chunk{Shape{8}, Shape{6}});
  sd.add_bytes("extra");
  auto r = Plan(sd, md);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->reads.size(), 2u);
  // Sorted by (file, offset): "v" (file 0, 48) before "w" rows 2..3 (file 1, 100).
  EXPECT_EQ(r->reads[0].entry, 1u);
  EXPECT_EQ(r->reads[0].tensor, 0u);
  EXPECT_EQ(r->reads[0].region, (Box{Shape{6}, Shape{2}}));
  EXPECT_EQ(r->reads[1].entry, 0u);
  EXPECT_EQ(r->reads[1].stored, 1u);
  EXPECT_EQ(r->reads[1].region, (Box{Shape{3, 0}, Shape{1, 6}}));
  ASSERT_EQ(r->bytes.size(), 1u);
  EXPECT_EQ(r->bytes[0].entry, 2u);
  EXPECT_EQ(r->bytes[0].bytes, 0u);
}

TEST(PlanLoadTest, SeveralDestinationChunksOfOneEntry) {
  const metadata::Metadata md = SampleMetadata();
  std::vector<float> a(4), b(4);
  StateDict sd;
  sd.add("v", TensorView(a.data(), DType::kF32, Shape{4}), Chunk{Shape{8}, Shape{4}});
  sd.add("v", TensorView(b.data(), DType::kF32, Shape{4}), Chunk{Shape{8}, Shape{0}});
  auto r = Plan(sd, md);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->reads.size(), 2u);
  // Same stored chunk: ties broken by destination chunk index.
  EXPECT_EQ(r->reads[0].dst_chunk, 0u);
  EXPECT_EQ(r->reads[0].region, (Box{Shape{4}, Shape{4}}));
  EXPECT_EQ(r->reads[1].dst_chunk, 1u);
  EXPECT_EQ(r->reads[1].region, (Box{Shape{0}, Shape{4}}));
}

TEST(PlanLoadTest, TheSameDestinationBoxTwiceIsRejected) {
  const metadata::Metadata md = SampleMetadata();
  std::vector<float> a(8), b(8);
  StateDict sd;
  sd.add("v", TensorView(a.data(), DType::kF32, Shape{8}));
  sd.add("v", TensorView(b.data(), DType::kF32, Shape{8}));
  ExpectError(Plan(sd, md), StatusCode::kInvalidArgument, {"'v'", "added twice"});
}

TEST(PlanLoadTest, SubByteCopiesThatSplitABytesAreRejectedAtPlanning) {
  metadata::Metadata md;
  md.files = {{"f", 100}};
  metadata::TensorMeta t{"f4", DType::kF4, Shape{2, 4}, {}};
  t.chunks = {Stored(Box::Whole(Shape{2, 4}), 0, 0, DType::kF4)};
  md.tensors = {t};
  std::vector<std::byte> mem(1);
  StateDict sd;
  sd.add("f4", TensorView(mem.data(), DType::kF4, Shape{1, 2}), Chunk{Shape{2, 4}, Shape{0, 1}});
  ExpectError(Plan(sd, md), StatusCode::kInvalidArgument, {"'f4'", "whole bytes"});
}

TEST(PlanLoadTest, MissingKeyIsNotFoundUnlessPartial) {
  const metadata::Metadata md = SampleMetadata();
  std::vector<float> a(8), b(3);
  StateDict sd;
  sd.add("v", TensorView(a.data(), DType::kF32, Shape{8}));
  sd.add("missing", TensorView(b.data(), DType::kF32, Shape{3}));
  sd.add_bytes("missing_bytes");
  ExpectError(Plan(sd, md), StatusCode::kNotFound, {"/ckpt/step_1", "'missing'"});

  auto r = Plan(sd, md, /*allow_partial=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->skipped, (std::vector<uint32_t>{1, 2}));
  ASSERT_EQ(r->reads.size(), 1u);
  EXPECT_EQ(r->reads[0].entry, 0u);
  EXPECT_TRUE(r->bytes.empty());
}

TEST(PlanLoadTest, DtypeMismatchIsInvalidArgument) {
  const metadata::Metadata md = SampleMetadata();
  std::vector<uint16_t> a(8);
  StateDict sd;
  sd.add("v", TensorView(a.data(), DType::kBF16, Shape{8}));
  ExpectError(Plan(sd, md), StatusCode::kInvalidArgument,
              {"/ckpt/step_1", "'v'", "dtype mismatch", "F32", "BF16"});
}

TEST(PlanLoadTest, GlobalShapeMismatchIsInvalidArgument) {
  const metadata::Metadata md = SampleMetadata();
  std::vector<float> a(9);
  StateDict sd;
  sd.add("v", TensorView(a.data(), DType::kF32, Shape{9}));
  ExpectError(Plan(sd, md), StatusCode::kInvalidArgument,
              {"'v'", "global shape mismatch", "[8]", "[9]"});
}

TEST(PlanLoadTest, TensorVersusBytesMismatchIsInvalidArgumentEitherWay) {
  const metadata::Metadata md = SampleMetadata();
  std::vector<float> a(5);
  StateDict tensor_dst;
  tensor_dst.add("extra", TensorView(a.data(), DType::kF32, Shape{5}));
  ExpectError(Plan(tensor_dst, md), StatusCode::kInvalidArgument,
              {"'extra'", "bytes in the checkpoint, a tensor in the destination"});
  StateDict bytes_dst;
  bytes_dst.add_bytes("v");
  ExpectError(Plan(bytes_dst, md), StatusCode::kInvalidArgument,
              {"'v'", "tensor in the checkpoint, bytes in the destination"});
}

TEST(PlanLoadTest, DestinationChunkOutsideGlobalShapeIsInvalidArgument) {
  const metadata::Metadata md = SampleMetadata();
  std::vector<float> a(4);
  StateDict sd;
  sd.add("v", TensorView(a.data(), DType::kF32, Shape{4}), Chunk{Shape{8}, Shape{6}});
  ExpectError(Plan(sd, md), StatusCode::kInvalidArgument, {"'v'", "outside the global shape"});
}

TEST(PlanLoadTest, DestinationNotCoveredByStoredChunks) {
  metadata::Metadata md = SampleMetadata();
  md.tensors[1].chunks.pop_back();  // rows 2..3 of "w" were never stored
  std::vector<float> ok(12), all(24);
  StateDict top;
  top.add("w", TensorView(ok.data(), DType::kF32, Shape{2, 6}), Chunk{Shape{4, 6}, Shape{0, 0}});
  EXPECT_TRUE(Plan(top, md).ok());
  StateDict whole;
  whole.add("w", TensorView(all.data(), DType::kF32, Shape{4, 6}));
  ExpectError(Plan(whole, md), StatusCode::kInvalidArgument,
              {"/ckpt/step_1", "'w'", "not covered", "12 of 24"});
}

TEST(PlanLoadTest, ReadsAreSortedByFileThenByteOffset) {
  // "a" stored in four chunks spread over two files out of box order.
  metadata::Metadata md;
  md.files = {{"f0", 100}, {"f1", 100}};
  metadata::TensorMeta a{"a", DType::kU8, Shape{8}, {}};
  a.chunks = {Stored(Box{Shape{0}, Shape{2}}, 1, 40, DType::kU8),
              Stored(Box{Shape{2}, Shape{2}}, 0, 30, DType::kU8),
              Stored(Box{Shape{4}, Shape{2}}, 1, 10, DType::kU8),
              Stored(Box{Shape{6}, Shape{2}}, 0, 20, DType::kU8)};
  metadata::TensorMeta b{"b", DType::kU8, Shape{2}, {}};
  b.chunks = {Stored(Box::Whole(Shape{2}), 0, 0, DType::kU8)};
  md.tensors = {a, b};
  std::vector<uint8_t> ma(8), mb(2);
  StateDict sd;
  sd.add("a", TensorView(ma.data(), DType::kU8, Shape{8}));
  sd.add("b", TensorView(mb.data(), DType::kU8, Shape{2}));
  auto r = Plan(sd, md);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::tuple<uint32_t, uint32_t>> order;  // (tensor, stored)
  for (const ReadItem& it : r->reads) order.emplace_back(it.tensor, it.stored);
  EXPECT_EQ(order,
            (std::vector<std::tuple<uint32_t, uint32_t>>{{1, 0}, {0, 3}, {0, 1}, {0, 2}, {0, 0}}));
}

TEST(PlanLoadTest, ZeroDimTensor) {
  metadata::Metadata md;
  md.files = {{"f0", 8}};
  metadata::TensorMeta s{"step", DType::kI64, Shape(), {}};
  s.chunks = {Stored(Box::Whole(Shape()), 0, 0, DType::kI64)};
  md.tensors = {s};
  int64_t step = 0;
  StateDict sd;
  sd.add("step", TensorView(&step, DType::kI64, Shape()));
  auto r = Plan(sd, md);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->reads.size(), 1u);
  EXPECT_EQ(r->reads[0].region, Box::Whole(Shape()));
  EXPECT_EQ(r->reads[0].region.NumElements(), 1u);
}

TEST(PlanLoadTest, EmptyDestinationChunkHasNoReadsAndNoError) {
  const metadata::Metadata md = SampleMetadata();
  StateDict sd;
  // An uneven split's empty tail: rows [4, 4) of "w", no memory.
  sd.add("w", TensorView(nullptr, DType::kF32, Shape{0, 6}), Chunk{Shape{4, 6}, Shape{4, 0}});
  auto r = Plan(sd, md);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->reads.empty());
}

}  // namespace
}  // namespace dcp::planner
