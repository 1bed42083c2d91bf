#include "storage/s3/fetch_buffers.h"

#include <gtest/gtest.h>

namespace dcp::storage::s3 {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(FetchBuffers, AFreedBufferServesTheNextExtentOfItsSizeWhileAFileIsOpen) {
  FetchBuffers pool(64 * kMiB);
  pool.FileOpened();
  FetchBuffers::Buffer a = pool.Take(16 * kMiB - 100);
  EXPECT_EQ(a.capacity, 16 * kMiB);  // whole MiB
  std::byte* mem = a.data.get();
  pool.Give(std::move(a));
  EXPECT_EQ(pool.kept_bytes(), 16 * kMiB);
  FetchBuffers::Buffer b = pool.Take(13 * kMiB);  // within a quarter: reused
  EXPECT_EQ(b.data.get(), mem);
  EXPECT_EQ(pool.kept_bytes(), 0u);
  pool.Give(std::move(b));
  FetchBuffers::Buffer c = pool.Take(12 * kMiB);  // 16 MiB would waste over a quarter
  EXPECT_NE(c.data.get(), mem);
  EXPECT_EQ(c.capacity, 12 * kMiB);
  FetchBuffers::Buffer d = pool.Take(17 * kMiB);  // too small
  EXPECT_NE(d.data.get(), mem);
  EXPECT_EQ(pool.kept_bytes(), 16 * kMiB);
  pool.FileClosed();  // the last file: nothing kept
  EXPECT_EQ(pool.kept_bytes(), 0u);
  pool.Give(std::move(c));  // no file open: freed
  EXPECT_EQ(pool.kept_bytes(), 0u);
}

TEST(FetchBuffers, AnExtentOfOddSizeReusesTheBufferItsSizeGot) {
  FetchBuffers pool(64 * kMiB);
  pool.FileOpened();
  FetchBuffers::Buffer a = pool.Take(kMiB + kMiB / 5);
  EXPECT_EQ(a.capacity, 2 * kMiB);
  std::byte* mem = a.data.get();
  pool.Give(std::move(a));
  EXPECT_EQ(pool.Take(kMiB + kMiB / 5).data.get(), mem);
  pool.FileClosed();
}

TEST(FetchBuffers, KeepsAtMostItsBoundDroppingTheOldestAndNoSmallBuffers) {
  FetchBuffers pool(40 * kMiB);
  pool.FileOpened();
  pool.FileOpened();
  auto a = pool.Take(16 * kMiB), b = pool.Take(16 * kMiB), c = pool.Take(16 * kMiB);
  std::byte* oldest = a.data.get();
  auto small = pool.Take(4096);
  EXPECT_EQ(small.capacity, 4096u);
  pool.Give(std::move(a));
  pool.Give(std::move(b));
  pool.Give(std::move(c));  // a third would pass 40 MiB: the first goes
  pool.Give(std::move(small));
  EXPECT_EQ(pool.kept_bytes(), 32 * kMiB);
  auto d = pool.Take(16 * kMiB), e = pool.Take(16 * kMiB);
  EXPECT_NE(d.data.get(), oldest);
  EXPECT_NE(e.data.get(), oldest);
  EXPECT_EQ(pool.kept_bytes(), 0u);
  pool.Give(std::move(d));
  pool.Give(std::move(e));
  pool.FileClosed();  // one file still open: kept
  EXPECT_EQ(pool.kept_bytes(), 32 * kMiB);
  pool.FileClosed();
  EXPECT_EQ(pool.kept_bytes(), 0u);
}

TEST(FetchBuffers, TakesTheSmallestThatFitsAndEvictsAsManyAsItMust) {
  FetchBuffers pool(24 * kMiB);
  pool.FileOpened();
  auto a = pool.Take(8 * kMiB), b = pool.Take(8 * kMiB), c = pool.Take(8 * kMiB);
  std::byte* newest = c.data.get();
  pool.Give(std::move(a));
  pool.Give(std::move(b));
  pool.Give(std::move(c));
  pool.Give(pool.Take(25 * kMiB));  // over the bound: never kept
  EXPECT_EQ(pool.kept_bytes(), 24 * kMiB);
  pool.Give(pool.Take(16 * kMiB));  // room for it: the two oldest go
  EXPECT_EQ(pool.kept_bytes(), 24 * kMiB);
  // For 7 MiB the 16 MiB one is too large (over 8.75 MiB): the 8 MiB one, the newest, serves.
  EXPECT_EQ(pool.Take(7 * kMiB).data.get(), newest);
  EXPECT_EQ(pool.kept_bytes(), 16 * kMiB);
  pool.FileClosed();
}

TEST(FetchBuffers, PrefersTheSmallerOfTwoThatFit) {
  FetchBuffers pool(64 * kMiB);
  pool.FileOpened();
  auto big = pool.Take(20 * kMiB), small = pool.Take(17 * kMiB);
  std::byte* want = small.data.get();
  pool.Give(std::move(big));  // older: a first fit would take it
  pool.Give(std::move(small));
  EXPECT_EQ(pool.Take(17 * kMiB).data.get(), want);
  pool.FileClosed();
}

}  // namespace
}  // namespace dcp::storage::s3
