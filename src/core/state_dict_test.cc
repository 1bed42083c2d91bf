#include "dcp/state_dict.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "dcp/status.h"

namespace dcp {
namespace {

TEST(ShapeTest, MoreThanEightDimensionsThrowInEveryBuild) {
  Shape s = Shape::Zeros(kMaxDims);
  EXPECT_EQ(s.rank(), kMaxDims);
  EXPECT_THROW(s.push_back(1), Error);
  EXPECT_THROW(Shape::Zeros(kMaxDims + 1), Error);
  EXPECT_THROW((Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}), Error);
  try {
    Shape::Zeros(12);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("12 dimensions"), std::string::npos) << e.what();
  }
}

TEST(TensorViewTest, SizesThatOverflowThrow) {
  EXPECT_EQ(TensorView(nullptr, DType::kBF16, {3, 5}).NumBytes(), 30u);
  EXPECT_EQ(TensorView(nullptr, DType::kF4, {3}).NumBytes(), 2u);  // sub-byte: rounded up
  // 2^62 elements of 8 bytes: the element count fits, the byte count does not.
  EXPECT_THROW(TensorView(nullptr, DType::kF64, {int64_t{1} << 31, int64_t{1} << 31}).NumBytes(),
               Error);
  EXPECT_THROW(TensorView(nullptr, DType::kU8, {int64_t{1} << 40, int64_t{1} << 40}).NumElements(),
               Error);
  EXPECT_THROW(TensorView(nullptr, DType::kU8, {-1}).NumBytes(), Error);
}

TEST(StateDictTest, EntriesKeepTheirNamesAndOnlyBytesPayloadsChange) {
  StateDict sd;
  float x[2] = {1, 2};
  sd.add("w", TensorView(x, DType::kF32, {2}));
  sd.add_bytes("opt", "abc");
  sd.add_empty("e", DType::kBF16, {4, 4});
  ASSERT_EQ(sd.size(), 3u);
  EXPECT_EQ(sd.find("e")->global_shape, (Shape{4, 4}));
  EXPECT_TRUE(sd.find("e")->chunks.empty());
  sd.mutable_bytes(1).assign(2, std::byte{7});
  EXPECT_EQ(sd.find("opt")->bytes.size(), 2u);
  EXPECT_THROW(sd.mutable_bytes(0), Error);  // a tensor entry
  EXPECT_THROW(sd.mutable_bytes(3), Error);  // out of range
  sd.add_bytes("opt", "replaced");
  EXPECT_EQ(sd.find("opt")->bytes.size(), 8u);
  EXPECT_THROW(sd.add_bytes("w", "x"), Error);  // a tensor cannot become bytes
}

}  // namespace
}  // namespace dcp
