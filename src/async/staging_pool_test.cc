#include "async/staging_pool.h"

#include <gtest/gtest.h>

#include <chrono>

namespace dcp::async {
namespace {

using namespace std::chrono_literals;

// A buffer that is never released (its save is stuck) must not make the next Acquire wait
// forever: it fails with kDeadlineExceeded naming the busy bytes and the cap.
TEST(StagingPool, AcquireGivesUpWhenBuffersStayBusy) {
  StagingPool pool(NewHostAllocator(), 1 << 20);
  auto held = pool.Acquire(600000);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  auto next = pool.Acquire(600000, 100ms);  // would need more than the cap: waits, then fails
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), StatusCode::kDeadlineExceeded) << next.status().ToString();
  EXPECT_NE(next.status().message().find("max_staging_bytes"), std::string::npos)
      << next.status().message();
  EXPECT_EQ(pool.stats().waiting, 0u);
  // Once released, the same request is served.
  pool.Release(held->id);
  auto again = pool.Acquire(600000, 100ms);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  pool.Release(again->id);
}

}  // namespace
}  // namespace dcp::async
