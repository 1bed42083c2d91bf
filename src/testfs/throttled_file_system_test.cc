#include "testfs/throttled_file_system.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace dcp::testfs {
namespace {

double Elapsed(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Lower bounds only: a loaded machine can make reads slower, never faster than the cap.
TEST(BandwidthLimiterTest, ReservationsQueueBehindEachOther) {
  auto l = BandwidthLimiter::InProcess(100e6);  // 100 MB/s
  const auto t0 = std::chrono::steady_clock::now();
  int64_t end = 0;
  for (int i = 0; i < 5; ++i) end = l->Reserve(4'000'000);  // 5 x 40 ms
  BandwidthLimiter::WaitUntil(end);
  EXPECT_GE(Elapsed(t0), 0.19);
}

TEST(BandwidthLimiterTest, SharedLimiterIsOneBudgetForAllWhoOpenIt) {
  const std::string path = "/tmp/dcp-limiter-test-" + std::to_string(getpid());
  auto a = BandwidthLimiter::Shared(path, 100e6);
  auto b = BandwidthLimiter::Shared(path, 100e6);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const auto t0 = std::chrono::steady_clock::now();
  (*a)->Reserve(10'000'000);
  const int64_t end = (*b)->Reserve(10'000'000);  // queued behind a's 100 ms
  BandwidthLimiter::WaitUntil(end);
  EXPECT_GE(Elapsed(t0), 0.19);
  ::unlink(path.c_str());
}

TEST(ThrottledFileSystemTest, ReadsAreCappedAndCorrect) {
  const std::string path = "/tmp/dcp-throttle-test-" + std::to_string(getpid());
  std::vector<std::byte> data(8'000'000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 7);
  {
    auto f = storage::PosixFileSystem().NewWritableFile(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Append(data).ok());
    ASSERT_TRUE((*f)->Close().ok());
  }
  auto limiter = BandwidthLimiter::InProcess(40e6);  // 8 MB in >= 0.2 s
  ThrottledFileSystem fs(storage::PosixFileSystem(), *limiter, 1'000'000);
  auto f = fs.OpenReadable(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->size(), data.size());
  std::vector<std::byte> got(data.size());
  const auto t0 = std::chrono::steady_clock::now();
  // Two readers share the budget.
  std::thread other([&] {
    std::vector<std::byte> half(data.size() / 2);
    EXPECT_TRUE((*f)->ReadAt(0, half).ok());
  });
  ASSERT_TRUE((*f)->ReadAt(0, got).ok());
  other.join();
  EXPECT_GE(Elapsed(t0), 0.29);  // 12 MB at 40 MB/s
  EXPECT_EQ(got, data);
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace dcp::testfs
