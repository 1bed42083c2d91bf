#include "dcp/format.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace dcp {
namespace {

TEST(HumanBytesTest, BinaryUnits) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1024), "1.0 KiB");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(uint64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(HumanBytes((uint64_t{1} << 20) - 1), "1.0 MiB");  // never "1024.0 KiB"
  EXPECT_EQ(HumanBytes(~uint64_t{0}), "16.0 EiB");
}

TEST(Hex16Test, SixteenLowercaseDigits) {
  EXPECT_EQ(Hex16(0), "0000000000000000");
  EXPECT_EQ(Hex16(0xABCDEFULL), "0000000000abcdef");
  EXPECT_EQ(Hex16(~uint64_t{0}), "ffffffffffffffff");
}

}  // namespace
}  // namespace dcp
