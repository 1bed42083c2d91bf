// The compare-and-swap of a small file without flock: of callers racing on one version
// exactly one wins, and what it wrote is what is left.
#include "storage/posix_cas.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace dcp::storage {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Scratch {
  Scratch() {
    dir = std::filesystem::temp_directory_path() / ("dcp-cas-test-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~Scratch() { std::filesystem::remove_all(dir); }
  std::filesystem::path dir;
};

TEST(PosixCas, CreatesOnlyIfAbsentAndReplacesOnlyTheVersionSeen) {
  Scratch s;
  const std::string path = (s.dir / "lock").string();
  auto v1 = PosixWriteIfVersion(path, "one", "");
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  EXPECT_EQ(*v1, ContentVersion("one"));
  EXPECT_EQ(PosixWriteIfVersion(path, "again", "").status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(PosixWriteIfVersion(path, "two", ContentVersion("other")).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(Slurp(path), "one");  // a mismatch changes nothing
  auto v2 = PosixWriteIfVersion(path, "two", *v1);
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_EQ(Slurp(path), "two");
  EXPECT_EQ(PosixRemoveIfVersion(path, *v1).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(PosixRemoveIfVersion(path, *v2).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(PosixWriteIfVersion(path, "three", *v2).status().code(), StatusCode::kNotFound);
  // Nothing is left beside it: no file moved aside, no new file unplaced.
  EXPECT_TRUE(std::filesystem::is_empty(s.dir));
}

TEST(PosixCas, OfCallersRacingOnOneVersionExactlyOneWins) {
  Scratch s;
  const std::string path = (s.dir / "lock").string();
  for (int round = 0; round < 50; ++round) {
    const std::string start = "start " + std::to_string(round);
    std::filesystem::remove(path);
    ASSERT_TRUE(PosixWriteIfVersion(path, start, "").ok());
    constexpr int kCallers = 6;
    std::atomic<int> ready{0};
    std::atomic<int> won{-1};
    std::atomic<int> wins{0};
    std::vector<std::thread> callers;
    for (int i = 0; i < kCallers; ++i) {
      callers.emplace_back([&, i] {
        ready.fetch_add(1);
        while (ready.load() < kCallers) std::this_thread::yield();
        auto v = PosixWriteIfVersion(path, "taken by " + std::to_string(i), ContentVersion(start));
        if (v.ok()) {
          wins.fetch_add(1);
          won = i;
        } else {
          EXPECT_TRUE(v.status().code() == StatusCode::kFailedPrecondition ||
                      v.status().code() == StatusCode::kNotFound)
              << v.status().ToString();
        }
      });
    }
    for (auto& t : callers) t.join();
    ASSERT_EQ(wins.load(), 1) << "round " << round;
    EXPECT_EQ(Slurp(path), "taken by " + std::to_string(won.load()));
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(s.dir), {}), 1);
  }
}

// Sets the modification time of `p` `seconds` back.
void Age(const std::filesystem::path& p, int seconds) {
  std::filesystem::last_write_time(
      p, std::filesystem::file_time_type::clock::now() - std::chrono::seconds(seconds));
}

// A claim is held while its writer changes the file: a fresh one (a writer at work) refuses
// the change; one a dead writer left long ago is passed over at once, and of the callers that
// found it stale exactly one changes the file; then no claim is left.
TEST(PosixCas, AClaimLeftByADeadWriterIsPassedOverByOneCaller) {
  Scratch s;
  const std::string path = (s.dir / "lock").string();
  for (int round = 0; round < 20; ++round) {
    std::filesystem::remove(path);
    auto v = PosixWriteIfVersion(path, "held " + std::to_string(round), "");
    ASSERT_TRUE(v.ok());
    const std::filesystem::path claim = path + ".claim." + *v;
    std::ofstream(claim) << "";
    if (round == 0) {
      EXPECT_EQ(PosixWriteIfVersion(path, "mine", *v).status().code(),
                StatusCode::kFailedPrecondition);
      EXPECT_EQ(Slurp(path), "held 0");
    }
    Age(claim, 3600);
    constexpr int kCallers = 6;
    std::atomic<int> ready{0}, wins{0}, won{-1};
    std::vector<std::thread> callers;
    for (int i = 0; i < kCallers; ++i) {
      callers.emplace_back([&, i] {
        ready.fetch_add(1);
        while (ready.load() < kCallers) std::this_thread::yield();
        auto mine = PosixWriteIfVersion(path, "mine " + std::to_string(i), *v);
        if (mine.ok()) {
          wins.fetch_add(1);
          won = i;
        }
      });
    }
    for (auto& t : callers) t.join();
    ASSERT_EQ(wins.load(), 1) << "round " << round;
    EXPECT_EQ(Slurp(path), "mine " + std::to_string(won.load()));
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(s.dir), {}), 1)
        << "claims left beside the file";
  }
}

// File times come from each client's clock on Lustre: a claim is judged by watching it. A
// fresh one is a writer at work (refused at once); one whose time is 10 s or more off either
// way (dead, or a client clock running behind or ahead) is watched: passed over once seen
// unchanged for the observation period, taken anew when its writer releases it meanwhile.
TEST(PosixCas, AClaimIsJudgedByWatchingItNotByItsTime) {
  Scratch s;
  const std::string path = (s.dir / "lock").string();
  ClaimObservationForTest() = std::chrono::milliseconds(300);
  auto v = PosixWriteIfVersion(path, "held", "");
  ASSERT_TRUE(v.ok());
  const std::filesystem::path claim = path + ".claim." + *v;
  std::ofstream(claim) << "";
  EXPECT_EQ(PosixWriteIfVersion(path, "mine", *v).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Slurp(path), "held");

  // Dated an hour ahead: watched, then passed over.
  std::filesystem::last_write_time(
      claim, std::filesystem::file_time_type::clock::now() + std::chrono::hours(1));
  const auto t0 = std::chrono::steady_clock::now();
  auto mine = PosixWriteIfVersion(path, "mine", *v);
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
  EXPECT_EQ(Slurp(path), "mine");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(s.dir), {}), 1)
      << "claims left beside the file";

  // 30 s old (a clock behind) and released by its writer while watched: taken anew.
  ClaimObservationForTest() = std::chrono::seconds(5);
  const std::filesystem::path claim2 = path + ".claim." + *mine;
  std::ofstream(claim2) << "";
  Age(claim2, 30);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::filesystem::remove(claim2);
  });
  auto again = PosixWriteIfVersion(path, "again", *mine);
  writer.join();
  ClaimObservationForTest() = std::chrono::milliseconds(0);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(Slurp(path), "again");
}

// Claims on versions the file no longer has are litter (a writer died mid-change) and go; one
// on its current version (a writer at work) stays. A change sweeps them.
TEST(PosixCas, ClaimsOnVersionsGoneAreSwept) {
  Scratch s;
  const std::string path = (s.dir / "lock").string();
  auto v = PosixWriteIfVersion(path, "held", "");
  ASSERT_TRUE(v.ok());
  for (const char* litter : {".claim.h1-3", ".claim.h1-3.after.77", ".claim.h2-4"}) {
    std::ofstream(path + litter) << "";
  }
  std::ofstream(path + ".claim." + *v) << "";
  std::ofstream(s.dir / "other.claim.h1-3") << "";  // another file's
  SweepClaims(path);
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(s.dir))
    left.push_back(e.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"lock", "lock.claim." + *v, "other.claim.h1-3"}));
  std::filesystem::remove(path + ".claim." + *v);
  std::ofstream(path + ".claim.h9-9") << "";
  ASSERT_TRUE(PosixWriteIfVersion(path, "next", *v).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".claim.h9-9"));
}

}  // namespace
}  // namespace dcp::storage
