#include "comm_conformance.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <span>
#include <thread>
#include <vector>

namespace dcp::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Longer than any timeout a caller gives these checks: reaching it means a hang, not slowness.
constexpr auto kHangGuard = 60s;

std::string Label(int rank) { return "rank-" + std::to_string(rank) + std::string(rank * 7, 'x'); }

std::span<std::byte> Bytes(std::string& s) { return std::as_writable_bytes(std::span(s)); }

}  // namespace

std::string Pattern(size_t size, int seed) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i)
    s[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
  return s;
}

void CheckRankAndSize(Comm& c, int expected_size, std::string_view expected_backend) {
  EXPECT_EQ(c.size(), expected_size);
  EXPECT_EQ(c.backend(), expected_backend);
  ASSERT_GE(c.rank(), 0);
  ASSERT_LT(c.rank(), c.size());
  auto all = c.AllGather(std::to_string(c.rank()));
  DCP_ASSERT_OK(all.status());
  ASSERT_EQ(static_cast<int>(all->size()), c.size());
  for (int r = 0; r < c.size(); ++r) EXPECT_EQ((*all)[r], std::to_string(r));
}

void CheckAllGatherIsInRankOrder(Comm& c) {
  const int n = c.size();
  auto all = c.AllGather(Label(c.rank()));
  DCP_ASSERT_OK(all.status());
  ASSERT_EQ(static_cast<int>(all->size()), n);
  for (int r = 0; r < n; ++r) EXPECT_EQ((*all)[r], Label(r));
}

void CheckGatherToNonZeroRoot(Comm& c) {
  const int n = c.size();
  const int root = n - 1;
  auto got = c.Gather(Label(c.rank()), root);
  DCP_ASSERT_OK(got.status());
  if (c.rank() != root) {
    EXPECT_TRUE(got->empty());
    return;
  }
  ASSERT_EQ(static_cast<int>(got->size()), n);
  for (int r = 0; r < n; ++r) EXPECT_EQ((*got)[r], Label(r));
}

void CheckGatherRejectsBadRoot(Comm& c) {
  EXPECT_EQ(c.Gather("x", c.size()).status().code(), StatusCode::kInvalidArgument);
  std::string s;
  EXPECT_EQ(c.Broadcast(s, -1).code(), StatusCode::kInvalidArgument);
}

void CheckBroadcastEmptyAndLarge(Comm& c) {
  const int root = c.size() - 1;
  const std::string big = Pattern(3 << 20, 5);
  std::string data = c.rank() == root ? "" : "stale";
  DCP_ASSERT_OK(c.Broadcast(data, root));
  EXPECT_EQ(data, "");
  data = c.rank() == root ? big : "short";
  DCP_ASSERT_OK(c.Broadcast(data, root));
  EXPECT_TRUE(data == big) << "rank " << c.rank() << " got " << data.size() << " bytes";
}

void CheckIBroadcastPipelined(Comm& c) {
  const int root = c.size() - 1;
  const std::string a = Pattern(1 << 20, 1), b = Pattern(4097, 2);
  std::string buf_a = c.rank() == root ? a : std::string(a.size(), '\0');
  std::string buf_b = c.rank() == 0 ? b : std::string(b.size(), '\0');
  // Two in flight at once, the second polled with Test() and the first waited for.
  auto ra = c.IBroadcast(Bytes(buf_a), root);
  DCP_ASSERT_OK(ra.status());
  auto rb = c.IBroadcast(Bytes(buf_b), 0);
  DCP_ASSERT_OK(rb.status());
  DCP_ASSERT_OK((*ra)->Wait());
  // Test() until it says done, for a while; Wait() below (bounded by the timeout) decides.
  const auto poll_until = Clock::now() + 10s;
  while (Clock::now() < poll_until) {
    auto done = (*rb)->Test();
    DCP_ASSERT_OK(done.status());
    if (*done) break;
    std::this_thread::yield();
  }
  DCP_ASSERT_OK((*rb)->Wait());
  DCP_ASSERT_OK((*rb)->Wait());  // idempotent after completion
  EXPECT_TRUE(buf_a == a);
  EXPECT_TRUE(buf_b == b);
  // A zero-length broadcast completes too.
  auto empty = c.IBroadcast({}, 0);
  DCP_ASSERT_OK(empty.status());
  DCP_ASSERT_OK((*empty)->Wait());
}

void CheckIAllGatherVScattered(Comm& c) {
  const int n = c.size();
  // Rank r's ranges: empty ones, small ones packed together, one over Comm::kInPlaceBytes on
  // even ranks, sizes differing by rank; the last rank of several sends nothing.
  auto sizes_of = [n](int r) {
    if (n > 1 && r == n - 1) return std::vector<size_t>{};
    return std::vector<size_t>{0,    17 + static_cast<size_t>(r),
                               3000, r % 2 == 0 ? (size_t{2} << 20) + 5 : 0,
                               1,    100 * static_cast<size_t>(r)};
  };
  std::vector<std::vector<std::string>> bufs(n);
  std::vector<Comm::Ranges> from(n);
  for (int s = 0; s < n; ++s) {
    const auto sizes = sizes_of(s);
    for (size_t i = 0; i < sizes.size(); ++i) {
      bufs[s].push_back(s == c.rank() ? Pattern(sizes[i], s * 16 + static_cast<int>(i))
                                      : std::string(sizes[i], '\0'));
    }
    for (std::string& b : bufs[s]) from[s].push_back(Bytes(b));
  }
  // This rank's own list in `from` is not touched: it points at a sentinel here.
  const Comm::Ranges mine = from[c.rank()];
  std::string sentinel(3000, 'S');
  from[c.rank()] = {Bytes(sentinel)};
  const std::string b = Pattern(5000, 77);
  std::string buf_b = c.rank() == 0 ? b : std::string(b.size(), '\0');
  // In flight with an IBroadcast; polled with Test(), then waited for.
  auto ra = c.IAllGatherV(mine, from);
  DCP_ASSERT_OK(ra.status());
  auto rb = c.IBroadcast(Bytes(buf_b), 0);
  DCP_ASSERT_OK(rb.status());
  const auto poll_until = Clock::now() + 10s;
  while (Clock::now() < poll_until) {
    auto done = (*ra)->Test();
    DCP_ASSERT_OK(done.status());
    if (*done) break;
    std::this_thread::yield();
  }
  DCP_ASSERT_OK((*ra)->Wait());
  DCP_ASSERT_OK((*rb)->Wait());
  EXPECT_TRUE(buf_b == b);
  for (int s = 0; s < n; ++s) {
    const auto sizes = sizes_of(s);
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_TRUE(bufs[s][i] == Pattern(sizes[i], s * 16 + static_cast<int>(i)))
          << "rank " << c.rank() << " from rank " << s << " range " << i;
    }
  }
  EXPECT_EQ(sentinel, std::string(3000, 'S'));
  // A list per rank is required.
  auto bad = c.IAllGatherV({}, {});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

void CheckIScatterVParts(Comm& c) {
  const int n = c.size();
  const int root = n - 1;
  const std::string src = Pattern((size_t{3} << 20) + 101, 5);
  // Member m's part: bytes of `src` as (offset, length) pieces, overlapping other members'.
  auto pieces_of = [&](int m) -> std::vector<std::pair<size_t, size_t>> {
    if (m == 0 && n > 2) return {};                           // an empty part
    if (m == 1) return {{7, (size_t{1} << 20) + 9}, {3, 2}};  // large, then out of order
    return {{100u * static_cast<size_t>(m), 5000}, {90000, 17u + static_cast<size_t>(m)}};
  };
  std::vector<uint64_t> part_bytes(n, 0);
  for (int m = 0; m < n; ++m) {
    for (auto [off, len] : pieces_of(m)) part_bytes[m] += m == root ? 0 : len;
  }
  std::string source = c.rank() == root ? src : std::string();
  std::vector<Comm::Ranges> to;
  if (c.rank() == root) {
    for (int m = 0; m < n; ++m) {
      Comm::Ranges& r = to.emplace_back();
      for (auto [off, len] : pieces_of(m)) r.push_back(Bytes(source).subspan(off, len));
    }
  }
  // Received into two ranges splitting the part elsewhere than the root's pieces do.
  std::string got(part_bytes[c.rank()], '\0');
  const size_t half = got.size() / 2;
  Comm::Ranges into{Bytes(got).subspan(0, half), Bytes(got).subspan(half)};
  std::string sentinel(8, 'S');
  if (c.rank() == root) into = {Bytes(sentinel)};
  auto req = c.IScatterV(to, into, part_bytes, root);
  DCP_ASSERT_OK(req.status());
  const auto poll_until = Clock::now() + 10s;
  while (Clock::now() < poll_until) {
    auto done = (*req)->Test();
    DCP_ASSERT_OK(done.status());
    if (*done) break;
    std::this_thread::yield();
  }
  DCP_ASSERT_OK((*req)->Wait());
  if (c.rank() == root) {
    EXPECT_EQ(sentinel, std::string(8, 'S'));
    EXPECT_TRUE(source == src);
  } else {
    std::string want;
    for (auto [off, len] : pieces_of(c.rank())) want += src.substr(off, len);
    EXPECT_TRUE(got == want) << "rank " << c.rank();
  }
  // All parts empty: completes all the same.
  std::vector<Comm::Ranges> none(c.rank() == 0 ? n : 0);
  auto empty = c.IScatterV(none, {}, std::vector<uint64_t>(n, 0), 0);
  DCP_ASSERT_OK(empty.status());
  DCP_ASSERT_OK((*empty)->Wait());
  // One part size per member is required.
  auto bad = c.IScatterV(none, {}, {}, 0);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

void CheckBarrierSeparatesPhases(Comm& c, const std::string& shared_dir) {
  namespace fs = std::filesystem;
  auto mark = [&](int round, int rank) {
    return fs::path(shared_dir) / ("barrier-" + std::to_string(round) + "-" + std::to_string(rank));
  };
  for (int round = 1; round <= 5; ++round) {
    { std::ofstream(mark(round, c.rank())) << "arrived"; }
    ASSERT_TRUE(fs::exists(mark(round, c.rank()))) << "cannot write in " << shared_dir;
    DCP_ASSERT_OK(c.Barrier());
    for (int r = 0; r < c.size(); ++r) {
      EXPECT_TRUE(fs::exists(mark(round, r)))
          << "rank " << r << " passed round " << round << "'s barrier before arriving";
      EXPECT_FALSE(fs::exists(mark(round + 1, r)))
          << "rank " << r << " started round " << round + 1 << " before the second barrier";
    }
    DCP_ASSERT_OK(c.Barrier());  // nobody starts round+1 before everyone checked round
  }
}

void CheckManyConsecutiveCollectivesDoNotMix(Comm& c, int rounds) {
  const int n = c.size();
  for (int i = 0; i < rounds; ++i) {
    const int root = i % n;
    const std::string tag = std::to_string(i) + "/" + std::to_string(c.rank());
    auto expect = [&](int r) { return std::to_string(i) + "/" + std::to_string(r); };
    switch (i % 4) {
      case 0: {
        auto all = c.AllGather(tag);
        DCP_ASSERT_OK(all.status());
        ASSERT_EQ(static_cast<int>(all->size()), n);
        for (int r = 0; r < n; ++r) ASSERT_EQ((*all)[r], expect(r));
        break;
      }
      case 1: {
        auto got = c.Gather(tag, root);
        DCP_ASSERT_OK(got.status());
        if (c.rank() == root) {
          ASSERT_EQ(static_cast<int>(got->size()), n);
          for (int r = 0; r < n; ++r) ASSERT_EQ((*got)[r], expect(r));
        }
        break;
      }
      case 2: {
        std::string data = tag;
        DCP_ASSERT_OK(c.Broadcast(data, root));
        ASSERT_EQ(data, expect(root));
        break;
      }
      case 3:
        DCP_ASSERT_OK(c.Barrier());
        break;
    }
  }
}

void CheckCreateGroupInterleaved(Comm& c) {
  const int n = c.size();
  std::vector<int> members;
  for (int r = c.rank() % 2; r < n; r += 2) members.push_back(r);
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
    ASSERT_EQ(sub->size(), members.size());
    for (size_t k = 0; k < members.size(); ++k) {
      ASSERT_EQ((*sub)[k], "g" + std::to_string(members[k]));
    }
    std::string w = "w" + std::to_string(c.rank());
    DCP_ASSERT_OK(c.Broadcast(w, i % n));
    ASSERT_EQ(w, "w" + std::to_string(i % n));
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
  std::vector<int> everyone(n);
  for (int r = 0; r < n; ++r) everyone[r] = r;
  auto world = c.CreateGroup(everyone);
  DCP_ASSERT_OK(world.status());
  EXPECT_EQ((*world)->rank(), c.rank());
  DCP_ASSERT_OK((*world)->Barrier());
  EXPECT_EQ(c.CreateGroup({n}).status().code(), StatusCode::kInvalidArgument);
  if (n > 1) {
    const int other = (c.rank() + 1) % n;
    EXPECT_EQ(c.CreateGroup({other}).status().code(), StatusCode::kInvalidArgument);
  }
}

void CheckAgreeOnStatusSpreadsOneFailure(Comm& c) {
  const int failing = c.size() - 1;
  DCP_ASSERT_OK(AgreeOnStatus(c, OkStatus()));
  Status mine = c.rank() == failing ? NotFound("tensor w missing") : OkStatus();
  Status all = AgreeOnStatus(c, mine);
  EXPECT_EQ(all.code(), StatusCode::kNotFound);
  if (c.size() == 1) {
    EXPECT_EQ(all.message(), "tensor w missing");
  } else {
    EXPECT_EQ(all.message(), "rank " + std::to_string(failing) + ": tensor w missing");
  }
}

void CheckBarrierTimesOutWhenOneRankIsAbsent(Comm& c) {
  ASSERT_GE(c.size(), 2) << "a world of one has nobody to wait for";
  if (c.rank() == c.size() - 1) return;
  const auto start = Clock::now();
  Status s = c.Barrier();
  const auto took = Clock::now() - start;
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("Barrier"), std::string::npos) << s.message();
  // Not before the timeout (with slack for the clock), and a hang guard, not a timing test.
  EXPECT_GE(took, c.timeout() * 19 / 20);
  EXPECT_LT(took, kHangGuard);
}

void CheckBroadcastTimesOutWhenRootIsAbsent(Comm& c) {
  ASSERT_GE(c.size(), 2) << "a world of one has nobody to wait for";
  const int absent = c.size() - 1;
  if (c.rank() == absent) return;
  std::string data;
  const auto start = Clock::now();
  Status s = c.Broadcast(data, absent);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("Broadcast"), std::string::npos) << s.message();
  EXPECT_LT(Clock::now() - start, kHangGuard);
}

void CheckTimeoutNamesOperationAndMissingRank(Comm& c) {
  ASSERT_GE(c.size(), 2) << "a world of one has nobody to wait for";
  const int absent = c.size() - 1;
  if (c.rank() == absent) return;
  const auto start = Clock::now();
  auto all = c.AllGather("x");
  const auto took = Clock::now() - start;
  EXPECT_EQ(all.status().code(), StatusCode::kDeadlineExceeded) << all.status().ToString();
  EXPECT_NE(all.status().message().find("AllGather"), std::string::npos);
  EXPECT_NE(all.status().message().find("rank(s) " + std::to_string(absent)), std::string::npos)
      << all.status().message();
  EXPECT_GE(took, c.timeout() * 19 / 20);
  EXPECT_LT(took, kHangGuard);
}

void CheckMismatchedCollectivesFail(Comm& c) {
  ASSERT_GE(c.size(), 2) << "needs two ranks";
  const auto start = Clock::now();
  Status s = c.rank() == 0 ? c.AllGather("x").status() : c.Barrier();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(c.rank() == 0 ? "Barrier" : "AllGather"), std::string::npos)
      << s.message();
  EXPECT_LT(Clock::now() - start, kHangGuard);
}

}  // namespace dcp::testing
