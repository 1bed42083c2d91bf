// One conformance suite for every in-process comm backend: local, threads and file (ranks as
// threads over a temporary directory), each at several world sizes.
#include "dcp/comm.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include "comm/thread_comm.h"

namespace dcp {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

#define DCP_ASSERT_OK(expr)                                  \
  do {                                                       \
    const ::dcp::Status dcp_test_s_ = (expr);                \
    ASSERT_TRUE(dcp_test_s_.ok()) << dcp_test_s_.ToString(); \
  } while (0)

struct Backend {
  std::string kind;  // "local", "threads" or "file"
  int n;
  // How ctest and gtest print it.
  friend void PrintTo(const Backend& b, std::ostream* os) { *os << b.kind << b.n; }
};

std::string Label(int rank) { return "rank-" + std::to_string(rank) + std::string(rank * 7, 'x'); }

// A payload whose bytes depend on position and seed, so misplaced chunks are caught.
std::string Pattern(size_t size, int seed) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i)
    s[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
  return s;
}

class CommTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam().kind == "file") {
      std::string tmpl = (fs::temp_directory_path() / "dcp-comm-test-XXXXXX").string();
      ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
      dir_ = tmpl;
    }
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  int n() const { return GetParam().n; }

  std::vector<std::shared_ptr<Comm>> MakeComms() {
    const Backend& b = GetParam();
    std::vector<std::shared_ptr<Comm>> comms;
    if (b.kind == "local") {
      comms.push_back(LocalComm());
    } else if (b.kind == "threads") {
      comms = MakeThreadComms(b.n);
    } else {
      for (int r = 0; r < b.n; ++r) comms.push_back(FileComm(dir_, r, b.n));
    }
    return comms;
  }

  // Runs `fn` on one thread per rank, each with its own Comm. A generous timeout turns a bug
  // into a failure instead of a hang.
  void RunRanks(const std::function<void(Comm&)>& fn,
                std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    auto comms = MakeComms();
    ASSERT_EQ(static_cast<int>(comms.size()), n());
    std::vector<std::jthread> threads;
    for (auto& c : comms) {
      c->set_timeout(timeout);
      threads.emplace_back([&fn, c] { fn(*c); });
    }
  }

  std::string dir_;
};

TEST_P(CommTest, RankAndSize) {
  std::atomic<int> sum{0};
  RunRanks([&](Comm& c) {
    EXPECT_EQ(c.size(), n());
    EXPECT_EQ(c.backend(), GetParam().kind);
    sum += c.rank();
  });
  EXPECT_EQ(sum, n() * (n() - 1) / 2);
}

TEST_P(CommTest, AllGatherIsInRankOrder) {
  RunRanks([&](Comm& c) {
    auto all = c.AllGather(Label(c.rank()));
    DCP_ASSERT_OK(all.status());
    ASSERT_EQ(static_cast<int>(all->size()), n());
    for (int r = 0; r < n(); ++r) EXPECT_EQ((*all)[r], Label(r));
  });
}

TEST_P(CommTest, GatherToNonZeroRoot) {
  const int root = n() - 1;
  RunRanks([&](Comm& c) {
    auto got = c.Gather(Label(c.rank()), root);
    DCP_ASSERT_OK(got.status());
    if (c.rank() != root) {
      EXPECT_TRUE(got->empty());
      return;
    }
    ASSERT_EQ(static_cast<int>(got->size()), n());
    for (int r = 0; r < n(); ++r) EXPECT_EQ((*got)[r], Label(r));
  });
}

TEST_P(CommTest, GatherRejectsBadRoot) {
  RunRanks([&](Comm& c) {
    EXPECT_EQ(c.Gather("x", n()).status().code(), StatusCode::kInvalidArgument);
    std::string s;
    EXPECT_EQ(c.Broadcast(s, -1).code(), StatusCode::kInvalidArgument);
  });
}

TEST_P(CommTest, BroadcastEmptyAndLarge) {
  const int root = n() - 1;
  const std::string big = Pattern(3 << 20, 5);
  RunRanks([&](Comm& c) {
    std::string data = c.rank() == root ? "" : "stale";
    DCP_ASSERT_OK(c.Broadcast(data, root));
    EXPECT_EQ(data, "");
    data = c.rank() == root ? big : "short";
    DCP_ASSERT_OK(c.Broadcast(data, root));
    EXPECT_TRUE(data == big) << "rank " << c.rank() << " got " << data.size() << " bytes";
  });
}

TEST_P(CommTest, IBroadcastPipelined) {
  const int root = n() - 1;
  const std::string a = Pattern(1 << 20, 1), b = Pattern(4097, 2);
  RunRanks([&](Comm& c) {
    const bool is_root = c.rank() == root;
    std::string buf_a = is_root ? a : std::string(a.size(), '\0');
    std::string buf_b = c.rank() == 0 ? b : std::string(b.size(), '\0');
    auto span = [](std::string& s) { return std::as_writable_bytes(std::span(s)); };
    // Two in flight at once, the second polled with Test() and the first waited for.
    auto ra = c.IBroadcast(span(buf_a), root);
    DCP_ASSERT_OK(ra.status());
    auto rb = c.IBroadcast(span(buf_b), 0);
    DCP_ASSERT_OK(rb.status());
    DCP_ASSERT_OK((*ra)->Wait());
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (true) {
      auto done = (*rb)->Test();
      DCP_ASSERT_OK(done.status());
      if (*done) break;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline);
      std::this_thread::sleep_for(1ms);
    }
    DCP_ASSERT_OK((*rb)->Wait());  // idempotent after completion
    EXPECT_TRUE(buf_a == a);
    EXPECT_TRUE(buf_b == b);
    // A zero-length broadcast completes too.
    auto empty = c.IBroadcast({}, 0);
    DCP_ASSERT_OK(empty.status());
    DCP_ASSERT_OK((*empty)->Wait());
  });
}

TEST_P(CommTest, BarrierSeparatesPhases) {
  std::atomic<int> arrived{0};
  RunRanks([&](Comm& c) {
    for (int round = 1; round <= 5; ++round) {
      ++arrived;
      DCP_ASSERT_OK(c.Barrier());
      EXPECT_GE(arrived.load(), round * n());
      DCP_ASSERT_OK(c.Barrier());  // nobody starts round+1 before everyone checked round
    }
  });
}

TEST_P(CommTest, ManyConsecutiveCollectivesDoNotMix) {
  const int kRounds = GetParam().kind == "file" ? 60 : 300;
  RunRanks([&](Comm& c) {
    for (int i = 0; i < kRounds; ++i) {
      const int root = i % n();
      std::string tag = std::to_string(i) + "/" + std::to_string(c.rank());
      switch (i % 4) {
        case 0: {
          auto all = c.AllGather(tag);
          DCP_ASSERT_OK(all.status());
          for (int r = 0; r < n(); ++r)
            ASSERT_EQ((*all)[r], std::to_string(i) + "/" + std::to_string(r));
          break;
        }
        case 1: {
          auto got = c.Gather(tag, root);
          DCP_ASSERT_OK(got.status());
          if (c.rank() == root) {
            for (int r = 0; r < n(); ++r)
              ASSERT_EQ((*got)[r], std::to_string(i) + "/" + std::to_string(r));
          }
          break;
        }
        case 2: {
          std::string data = tag;
          DCP_ASSERT_OK(c.Broadcast(data, root));
          ASSERT_EQ(data, std::to_string(i) + "/" + std::to_string(root));
          break;
        }
        case 3:
          DCP_ASSERT_OK(c.Barrier());
          break;
      }
    }
  });
  if (GetParam().kind == "file") {
    // Files are removed once every reader is done with them: the directory stays small.
    size_t files = 0;
    if (fs::exists(dir_)) {
      for (const auto& e : fs::recursive_directory_iterator(dir_)) files += e.is_regular_file();
    }
    EXPECT_LE(files, static_cast<size_t>(4 * n())) << "leftover message files in " << dir_;
  }
}

// Groups (0,2) and (1,3) at n=4 (ranks of equal parity), used interleaved with the world.
TEST_P(CommTest, CreateGroupInterleaved) {
  RunRanks([&](Comm& c) {
    std::vector<int> members;
    for (int r = c.rank() % 2; r < n(); r += 2) members.push_back(r);
    const int index = c.rank() / 2;
    auto g = c.CreateGroup(members);
    DCP_ASSERT_OK(g.status());
    Comm& group = **g;
    EXPECT_EQ(group.rank(), index);
    EXPECT_EQ(group.size(), static_cast<int>(members.size()));
    EXPECT_EQ(group.timeout(), c.timeout());
    for (int i = 0; i < 6; ++i) {
      auto sub = group.AllGather("g" + std::to_string(c.rank()));
      DCP_ASSERT_OK(sub.status());
      for (size_t k = 0; k < members.size(); ++k) {
        ASSERT_EQ((*sub)[k], "g" + std::to_string(members[k]));
      }
      std::string w = "w" + std::to_string(c.rank());
      DCP_ASSERT_OK(c.Broadcast(w, i % n()));
      ASSERT_EQ(w, "w" + std::to_string(i % n()));
      const int sub_root = i % group.size();
      std::string s = "s" + std::to_string(c.rank());
      DCP_ASSERT_OK(group.Broadcast(s, sub_root));
      ASSERT_EQ(s, "s" + std::to_string(members[sub_root]));
      DCP_ASSERT_OK(group.Barrier());
      DCP_ASSERT_OK(c.Barrier());
    }
    // Creating the same member list again gives an independent communicator.
    auto again = c.CreateGroup(members);
    DCP_ASSERT_OK(again.status());
    std::string x = index == 0 ? "second" : "";
    DCP_ASSERT_OK((*again)->Broadcast(x, 0));
    EXPECT_EQ(x, "second");
    auto sub = group.AllGather(std::to_string(index));
    DCP_ASSERT_OK(sub.status());
    EXPECT_EQ(sub->back(), std::to_string(group.size() - 1));
    // The world as a group, and invalid member lists.
    std::vector<int> everyone(n());
    for (int r = 0; r < n(); ++r) everyone[r] = r;
    auto world = c.CreateGroup(everyone);
    DCP_ASSERT_OK(world.status());
    EXPECT_EQ((*world)->rank(), c.rank());
    DCP_ASSERT_OK((*world)->Barrier());
    EXPECT_EQ(c.CreateGroup({n()}).status().code(), StatusCode::kInvalidArgument);
    if (n() > 1) {
      int other = (c.rank() + 1) % n();
      EXPECT_EQ(c.CreateGroup({other}).status().code(), StatusCode::kInvalidArgument);
    }
  });
}

TEST_P(CommTest, AgreeOnStatusSpreadsOneFailure) {
  const int failing = n() - 1;
  RunRanks([&](Comm& c) {
    DCP_ASSERT_OK(AgreeOnStatus(c, OkStatus()));
    Status mine = c.rank() == failing ? NotFound("tensor w missing") : OkStatus();
    Status all = AgreeOnStatus(c, mine);
    EXPECT_EQ(all.code(), StatusCode::kNotFound);
    if (n() == 1) {
      EXPECT_EQ(all.message(), "tensor w missing");
    } else {
      EXPECT_EQ(all.message(), "rank " + std::to_string(failing) + ": tensor w missing");
    }
  });
}

// One rank never arrives: the others fail with kDeadlineExceeded in about the timeout, with a
// message naming the operation and the absent rank, instead of hanging.
TEST_P(CommTest, TimeoutNamesOperationAndMissingRank) {
  if (n() == 1) GTEST_SKIP() << "a world of one has nobody to wait for";
  const int absent = n() - 1;
  const std::string absent_str = std::to_string(absent);
  RunRanks(
      [&](Comm& c) {
        if (c.rank() == absent) return;
        auto start = std::chrono::steady_clock::now();
        auto all = c.AllGather("x");
        auto took = std::chrono::steady_clock::now() - start;
        EXPECT_EQ(all.status().code(), StatusCode::kDeadlineExceeded) << all.status().ToString();
        EXPECT_NE(all.status().message().find("AllGather"), std::string::npos);
        EXPECT_NE(all.status().message().find("rank(s) " + absent_str), std::string::npos)
            << all.status().message();
        EXPECT_GE(took, 190ms);
        EXPECT_LT(took, 60s);  // a hang guard, not a timing test
      },
      200ms);
}

TEST_P(CommTest, BroadcastTimesOutWhenRootIsAbsent) {
  if (n() == 1) GTEST_SKIP() << "a world of one has nobody to wait for";
  const int absent = n() - 1;
  RunRanks(
      [&](Comm& c) {
        if (c.rank() == absent) return;
        std::string data;
        auto start = std::chrono::steady_clock::now();
        Status s = c.Broadcast(data, absent);
        EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
        EXPECT_NE(s.message().find("Broadcast"), std::string::npos) << s.message();
        EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);  // no hang
      },
      200ms);
}

// Ranks that call different collectives at the same point fail (mismatch or timeout) instead
// of mixing their data or hanging.
TEST_P(CommTest, MismatchedCollectivesFail) {
  if (n() == 1) GTEST_SKIP() << "needs two ranks";
  RunRanks(
      [&](Comm& c) {
        auto start = std::chrono::steady_clock::now();
        Status s = c.rank() == 0 ? c.AllGather("x").status() : c.Barrier();
        EXPECT_FALSE(s.ok());
        EXPECT_NE(s.message().find(c.rank() == 0 ? "Barrier" : "AllGather"), std::string::npos)
            << s.message();
        EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);  // no hang
      },
      300ms);
}

INSTANTIATE_TEST_SUITE_P(Backends, CommTest,
                         ::testing::Values(Backend{"local", 1}, Backend{"threads", 1},
                                           Backend{"threads", 2}, Backend{"threads", 4},
                                           Backend{"file", 1}, Backend{"file", 2},
                                           Backend{"file", 4}),
                         [](const auto& info) {
                           return info.param.kind + std::to_string(info.param.n);
                         });

}  // namespace
}  // namespace dcp
