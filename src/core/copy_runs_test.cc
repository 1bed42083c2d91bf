#include "core/copy_runs.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace dcp {
namespace {

CopyRuns MakeOk(DType dtype, const Box& src, const Box& dst, const Box& region) {
  auto r = CopyRuns::Make(dtype, src, dst, region);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : CopyRuns();
}

TEST(CopyRunsTest, WholeChunkIsOneRun) {
  const Box b{Shape{4, 6}, Shape{4, 6}};
  CopyRuns runs = MakeOk(DType::kF32, b, b, b);
  EXPECT_EQ(runs.num_runs(), 1u);
  EXPECT_EQ(runs.run_bytes(), 4u * 6 * 4);
  EXPECT_EQ(runs.total_bytes(), 96u);
  EXPECT_EQ(runs.src_offset(0), 0u);
  EXPECT_EQ(runs.dst_offset(0), 0u);
}

TEST(CopyRunsTest, RowSlabOfTwoDimChunkIsOneRun) {
  // Rows 2..4 of an [8, 6] chunk into a destination holding exactly those rows.
  const Box src{Shape{0, 0}, Shape{8, 6}};
  const Box region{Shape{2, 0}, Shape{3, 6}};
  CopyRuns runs = MakeOk(DType::kF32, src, region, region);
  EXPECT_EQ(runs.num_runs(), 1u);
  EXPECT_EQ(runs.run_bytes(), 3u * 6 * 4);
  EXPECT_EQ(runs.src_offset(0), 2u * 6 * 4);
  EXPECT_EQ(runs.dst_offset(0), 0u);
}

TEST(CopyRunsTest, ColumnSlabIsOneRunPerRow) {
  // Columns 2..4 of a [4, 6] F32 chunk (offset [10, 0] in the global tensor) into a
  // destination chunk [10..14) x [2..5).
  const Box src{Shape{10, 0}, Shape{4, 6}};
  const Box dst{Shape{10, 2}, Shape{4, 3}};
  CopyRuns runs = MakeOk(DType::kF32, src, dst, dst);
  ASSERT_EQ(runs.num_runs(), 4u);
  EXPECT_EQ(runs.run_bytes(), 12u);
  for (uint64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(runs.src_offset(r), 8 + r * 24) << r;
    EXPECT_EQ(runs.dst_offset(r), r * 12) << r;
  }
}

TEST(CopyRunsTest, ThreeDimWithInnerDimsFullyCoveredMerges) {
  const Box src{Shape{0, 0, 0}, Shape{4, 3, 5}};
  const Box region{Shape{1, 0, 0}, Shape{2, 3, 5}};
  CopyRuns runs = MakeOk(DType::kF64, src, region, region);
  EXPECT_EQ(runs.num_runs(), 1u);
  EXPECT_EQ(runs.run_bytes(), 2u * 3 * 5 * 8);
  EXPECT_EQ(runs.src_offset(0), 1u * 3 * 5 * 8);

  // Only the last dimension is full: rows j = 1..2 of each i are still contiguous, so
  // one run per i.
  const Box part{Shape{1, 1, 0}, Shape{2, 2, 5}};
  CopyRuns runs2 = MakeOk(DType::kF64, src, part, part);
  ASSERT_EQ(runs2.num_runs(), 2u);
  EXPECT_EQ(runs2.run_bytes(), 2u * 5 * 8);
  EXPECT_EQ(runs2.src_offset(0), (1u * 15 + 1 * 5) * 8);
  EXPECT_EQ(runs2.src_offset(1), (2u * 15 + 1 * 5) * 8);
  EXPECT_EQ(runs2.dst_offset(0), 0u);
  EXPECT_EQ(runs2.dst_offset(1), 80u);

  // Middle dimension partial and last dimension partial: one run per (i, j).
  const Box corner{Shape{1, 1, 1}, Shape{2, 2, 3}};
  CopyRuns runs4 = MakeOk(DType::kF64, src, corner, corner);
  ASSERT_EQ(runs4.num_runs(), 4u);
  EXPECT_EQ(runs4.run_bytes(), 24u);
  EXPECT_EQ(runs4.src_offset(1), (1u * 15 + 2 * 5 + 1) * 8);
  EXPECT_EQ(runs4.src_offset(2), (2u * 15 + 1 * 5 + 1) * 8);
  EXPECT_EQ(runs4.dst_offset(3), 3u * 24);

  // Inner dims full in the source but not in the (wider) destination: no merge.
  const Box wide_dst{Shape{0, 0, 0}, Shape{4, 3, 7}};
  CopyRuns runs3 = MakeOk(DType::kF64, src, wide_dst, src);
  EXPECT_EQ(runs3.num_runs(), 12u);
  EXPECT_EQ(runs3.run_bytes(), 40u);
  EXPECT_EQ(runs3.dst_offset(1), 7u * 8);
}

TEST(CopyRunsTest, ZeroDimIsOneRunOfElementSize) {
  const Box scalar = Box::Whole(Shape());
  CopyRuns f32 = MakeOk(DType::kF32, scalar, scalar, scalar);
  EXPECT_EQ(f32.num_runs(), 1u);
  EXPECT_EQ(f32.run_bytes(), 4u);
  EXPECT_EQ(f32.src_offset(0), 0u);
  EXPECT_EQ(f32.dst_offset(0), 0u);
  CopyRuns f64 = MakeOk(DType::kF64, scalar, scalar, scalar);
  EXPECT_EQ(f64.total_bytes(), 8u);
}

TEST(CopyRunsTest, EmptyRegionHasNoRuns) {
  const Box src{Shape{0, 0}, Shape{4, 6}};
  CopyRuns runs = MakeOk(DType::kF32, src, src, Box{Shape{4, 0}, Shape{0, 6}});
  EXPECT_EQ(runs.num_runs(), 0u);
  EXPECT_EQ(runs.total_bytes(), 0u);
  EXPECT_EQ(runs.FirstRunEndingAfter(0), 0u);
}

TEST(CopyRunsTest, SubByteRegionOnWholeBytesWorks) {
  // F4 [4, 4]: 2 bytes per row. Columns 2..3 are the second byte of each row.
  const Box src{Shape{0, 0}, Shape{4, 4}};
  const Box dst{Shape{0, 2}, Shape{4, 2}};
  CopyRuns runs = MakeOk(DType::kF4, src, dst, dst);
  ASSERT_EQ(runs.num_runs(), 4u);
  EXPECT_EQ(runs.run_bytes(), 1u);
  for (uint64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(runs.src_offset(r), 1 + 2 * r);
    EXPECT_EQ(runs.dst_offset(r), r);
  }
  // The whole chunk is one run of 8 bytes.
  EXPECT_EQ(MakeOk(DType::kF4, src, src, src).total_bytes(), 8u);
}

TEST(CopyRunsTest, SubByteRegionSplittingAByteIsInvalidArgument) {
  const Box src{Shape{0, 0}, Shape{4, 4}};
  for (const Box& region : {Box{Shape{0, 1}, Shape{4, 2}},  // starts mid-byte
                            Box{Shape{0, 0}, Shape{4, 3}},  // ends mid-byte
                            Box{Shape{0, 0}, Shape{1, 1}}}) {
    auto r = CopyRuns::Make(DType::kF4, src, region, region);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << region.ToString();
    EXPECT_NE(r.status().message().find("whole bytes"), std::string::npos) << r.status().message();
  }
  // F4 [3, 3] rows are 1.5 bytes: a column slab of whole-byte width still splits bytes.
  const Box odd{Shape{0, 0}, Shape{3, 3}};
  const Box two_cols{Shape{0, 0}, Shape{3, 2}};
  EXPECT_EQ(CopyRuns::Make(DType::kF4, odd, two_cols, two_cols).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(CopyRunsTest, FirstRunEndingAfter) {
  // Column slab: source runs [8, 20), [32, 44), [56, 68), [80, 92).
  const Box src{Shape{0, 0}, Shape{4, 6}};
  const Box dst{Shape{0, 2}, Shape{4, 3}};
  CopyRuns runs = MakeOk(DType::kF32, src, dst, dst);
  EXPECT_EQ(runs.FirstRunEndingAfter(0), 0u);
  EXPECT_EQ(runs.FirstRunEndingAfter(8), 0u);
  EXPECT_EQ(runs.FirstRunEndingAfter(19), 0u);
  EXPECT_EQ(runs.FirstRunEndingAfter(20), 1u);
  EXPECT_EQ(runs.FirstRunEndingAfter(25), 1u);
  EXPECT_EQ(runs.FirstRunEndingAfter(43), 1u);
  EXPECT_EQ(runs.FirstRunEndingAfter(44), 2u);
  EXPECT_EQ(runs.FirstRunEndingAfter(67), 2u);
  EXPECT_EQ(runs.FirstRunEndingAfter(68), 3u);
  EXPECT_EQ(runs.FirstRunEndingAfter(91), 3u);
  EXPECT_EQ(runs.FirstRunEndingAfter(92), 4u);
  EXPECT_EQ(runs.FirstRunEndingAfter(1000), 4u);
}

// Row-major element index of global coordinate `g` within box `b`.
uint64_t IndexIn(const Box& b, const std::vector<int64_t>& g) {
  uint64_t idx = 0;
  for (int d = 0; d < b.rank(); ++d) {
    idx = idx * static_cast<uint64_t>(b.lengths[d]) + static_cast<uint64_t>(g[d] - b.offsets[d]);
  }
  return idx;
}

// Calls f(coords) for every element of `region`, row-major.
template <typename F>
void ForEachElement(const Box& region, F f) {
  if (region.NumElements() == 0) return;
  std::vector<int64_t> g(region.offsets.begin(), region.offsets.end());
  while (true) {
    f(g);
    int d = region.rank() - 1;
    for (; d >= 0; --d) {
      if (++g[d] < region.offsets[d] + region.lengths[d]) break;
      g[d] = region.offsets[d];
    }
    if (d < 0) return;
  }
}

// A random box inside [0, shape) with at least one element per dimension.
Box RandomBox(std::mt19937& rng, const Shape& shape) {
  Box b{Shape::Zeros(shape.rank()), Shape::Zeros(shape.rank())};
  for (int d = 0; d < shape.rank(); ++d) {
    int64_t lo = std::uniform_int_distribution<int64_t>(0, shape[d] - 1)(rng);
    int64_t hi = std::uniform_int_distribution<int64_t>(lo + 1, shape[d])(rng);
    b.offsets[d] = lo;
    b.lengths[d] = hi - lo;
  }
  return b;
}

TEST(CopyRunsTest, RandomBoxesMatchElementByElementCopy) {
  const uint32_t seed = 777;
  std::cout << "[ seed ] " << seed << "\n";
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const DType dtypes[] = {DType::kU8, DType::kBF16, DType::kF32, DType::kF64, DType::kF4};
  int checked = 0, sub_byte_checked = 0, sub_byte_rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const DType dt = dtypes[trial % 5];
    const int bits = DTypeBits(dt);
    const int rank = std::uniform_int_distribution<int>(0, 4)(rng);
    Shape shape;
    for (int d = 0; d < rank; ++d)
      shape.push_back(std::uniform_int_distribution<int64_t>(1, 7)(rng));
    const Box src = RandomBox(rng, shape);
    const Box dst = RandomBox(rng, shape);
    auto region = Intersect(src, dst);
    if (!region) continue;
    // Sometimes copy only part of the intersection.
    if (trial % 3 == 0) {
      Box sub = RandomBox(rng, region->lengths);
      for (int d = 0; d < rank; ++d) sub.offsets[d] += region->offsets[d];
      region = sub;
    }
    SCOPED_TRACE("trial " + std::to_string(trial) + " " + std::string(DTypeName(dt)) + " src " +
                 src.ToString() + " dst " + dst.ToString() + " region " + region->ToString());
    auto made = CopyRuns::Make(dt, src, dst, *region);
    if (bits % 8 != 0) {
      if (!made.ok()) {
        // Only sub-byte dtypes may be rejected, and only with the whole-bytes error.
        EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
        ++sub_byte_rejected;
        continue;
      }
      ++sub_byte_checked;
    }
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    const CopyRuns& runs = made.value();
    const uint64_t src_bytes = (src.NumElements() * bits + 7) / 8;
    const uint64_t dst_bytes = (dst.NumElements() * bits + 7) / 8;
    std::vector<uint8_t> s(src_bytes), got(dst_bytes, 0xAB), want(dst_bytes, 0xAB);
    for (auto& x : s) x = static_cast<uint8_t>(rng());
    EXPECT_EQ(runs.total_bytes() * 8, region->NumElements() * bits);
    for (uint64_t r = 0; r < runs.num_runs(); ++r) {
      ASSERT_LE(runs.src_offset(r) + runs.run_bytes(), src_bytes);
      ASSERT_LE(runs.dst_offset(r) + runs.run_bytes(), dst_bytes);
      std::memcpy(got.data() + runs.dst_offset(r), s.data() + runs.src_offset(r), runs.run_bytes());
    }
    // Reference: bit by bit (covers sub-byte dtypes).
    ForEachElement(*region, [&](const std::vector<int64_t>& g) {
      const uint64_t si = IndexIn(src, g) * bits, di = IndexIn(dst, g) * bits;
      for (int k = 0; k < bits; ++k) {
        const uint64_t sb = si + k, db = di + k;
        const int bit = (s[sb / 8] >> (sb % 8)) & 1;
        want[db / 8] = static_cast<uint8_t>((want[db / 8] & ~(1 << (db % 8))) | (bit << (db % 8)));
      }
    });
    ASSERT_EQ(got, want);
    // Runs are in increasing source order, which FirstRunEndingAfter relies on.
    for (uint64_t r = 1; r < runs.num_runs(); ++r) {
      ASSERT_LT(runs.src_offset(r - 1), runs.src_offset(r));
    }
    if (runs.num_runs() > 0) {
      const uint64_t last = runs.num_runs() - 1;
      EXPECT_EQ(runs.FirstRunEndingAfter(runs.src_offset(last)), last);
      EXPECT_EQ(runs.FirstRunEndingAfter(runs.src_offset(last) + runs.run_bytes()),
                runs.num_runs());
    }
    ++checked;
  }
  EXPECT_GT(checked, 1000);
  EXPECT_GT(sub_byte_checked, 20);
  EXPECT_GT(sub_byte_rejected, 20);
}

}  // namespace
}  // namespace dcp
