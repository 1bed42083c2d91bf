// The comm conformance checks against the MPI backend, with real processes:
//   mpirun -np 4 --oversubscribe comm_mpi_test
// Runs with any world size >= 1 (the group and timeout checks need >= 2). Exits non-zero if
// any check fails on any rank.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi/mpi_comm_internal.h"
#include "dcp/comm.h"
#include "dcp/mpi_comm.h"

namespace dcp {
namespace {

using namespace std::chrono_literals;

int g_rank = 0;
int g_failures = 0;

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "[rank %d] %s:%d: CHECK failed: %s\n", g_rank, __FILE__, __LINE__, \
                   #cond);                                                                    \
      ++g_failures;                                                                           \
    }                                                                                         \
  } while (0)

#define CHECK_OK(expr)                                                                     \
  do {                                                                                     \
    const ::dcp::Status check_s_ = (expr);                                                 \
    if (!check_s_.ok()) {                                                                  \
      std::fprintf(stderr, "[rank %d] %s:%d: %s: %s\n", g_rank, __FILE__, __LINE__, #expr, \
                   check_s_.ToString().c_str());                                           \
      ++g_failures;                                                                        \
    }                                                                                      \
  } while (0)

std::string Label(int rank) { return "rank-" + std::to_string(rank) + std::string(rank * 7, 'x'); }

std::string Pattern(size_t size, int seed) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    s[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
  }
  return s;
}

std::span<std::byte> Bytes(std::string& s) { return std::as_writable_bytes(std::span(s)); }

void TestAllGatherGatherBroadcast(Comm& c) {
  const int n = c.size();
  auto all = c.AllGather(Label(c.rank()));
  CHECK_OK(all.status());
  if (all.ok()) {
    CHECK(static_cast<int>(all->size()) == n);
    for (int r = 0; r < n && r < static_cast<int>(all->size()); ++r) CHECK((*all)[r] == Label(r));
  }
  const int root = n - 1;
  auto got = c.Gather(Label(c.rank()), root);
  CHECK_OK(got.status());
  if (got.ok() && c.rank() == root) {
    CHECK(static_cast<int>(got->size()) == n);
    for (int r = 0; r < n && r < static_cast<int>(got->size()); ++r) CHECK((*got)[r] == Label(r));
  } else if (got.ok()) {
    CHECK(got->empty());
  }
  CHECK(c.Gather("x", n).status().code() == StatusCode::kInvalidArgument);

  std::string data = c.rank() == root ? "" : "stale";
  CHECK_OK(c.Broadcast(data, root));
  CHECK(data.empty());
  const std::string big = Pattern(3 << 20, 5);
  data = c.rank() == root ? big : "short";
  CHECK_OK(c.Broadcast(data, root));
  CHECK(data == big);
}

void TestIBroadcast(Comm& c) {
  const int root = c.size() - 1;
  const std::string a = Pattern(1 << 20, 1), b = Pattern(4097, 2);
  std::string buf_a = c.rank() == root ? a : std::string(a.size(), '\0');
  std::string buf_b = c.rank() == 0 ? b : std::string(b.size(), '\0');
  auto ra = c.IBroadcast(Bytes(buf_a), root);
  auto rb = c.IBroadcast(Bytes(buf_b), 0);
  CHECK_OK(ra.status());
  CHECK_OK(rb.status());
  if (!ra.ok() || !rb.ok()) return;
  CHECK_OK((*ra)->Wait());
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto done = (*rb)->Test();
    CHECK_OK(done.status());
    if (!done.ok() || *done) break;
    std::this_thread::yield();
  }
  CHECK_OK((*rb)->Wait());
  CHECK(buf_a == a);
  CHECK(buf_b == b);
  auto empty = c.IBroadcast({}, 0);
  CHECK_OK(empty.status());
  if (empty.ok()) CHECK_OK((*empty)->Wait());
}

void TestManyConsecutive(Comm& c) {
  const int n = c.size();
  for (int i = 0; i < 300; ++i) {
    const int root = i % n;
    const std::string tag = std::to_string(i) + "/" + std::to_string(c.rank());
    auto expect = [&](int r) { return std::to_string(i) + "/" + std::to_string(r); };
    switch (i % 4) {
      case 0: {
        auto all = c.AllGather(tag);
        CHECK_OK(all.status());
        if (all.ok()) {
          for (int r = 0; r < n; ++r) CHECK((*all)[r] == expect(r));
        }
        break;
      }
      case 1: {
        auto got = c.Gather(tag, root);
        CHECK_OK(got.status());
        if (got.ok() && c.rank() == root) {
          for (int r = 0; r < n; ++r) CHECK((*got)[r] == expect(r));
        }
        break;
      }
      case 2: {
        std::string data = tag;
        CHECK_OK(c.Broadcast(data, root));
        CHECK(data == expect(root));
        break;
      }
      case 3:
        CHECK_OK(c.Barrier());
        break;
    }
  }
}

// Groups of equal parity: (0,2) and (1,3) at 4 ranks, used interleaved with the world.
void TestGroups(Comm& c) {
  const int n = c.size();
  std::vector<int> members;
  for (int r = c.rank() % 2; r < n; r += 2) members.push_back(r);
  auto g = c.CreateGroup(members);
  CHECK_OK(g.status());
  if (!g.ok()) return;
  Comm& group = **g;
  CHECK(group.rank() == c.rank() / 2);
  CHECK(group.size() == static_cast<int>(members.size()));
  for (int i = 0; i < 6; ++i) {
    auto sub = group.AllGather("g" + std::to_string(c.rank()));
    CHECK_OK(sub.status());
    if (sub.ok()) {
      for (size_t k = 0; k < members.size(); ++k)
        CHECK((*sub)[k] == "g" + std::to_string(members[k]));
    }
    std::string w = "w" + std::to_string(c.rank());
    CHECK_OK(c.Broadcast(w, i % n));
    CHECK(w == "w" + std::to_string(i % n));
    const int sub_root = i % group.size();
    std::string s = "s" + std::to_string(c.rank());
    CHECK_OK(group.Broadcast(s, sub_root));
    CHECK(s == "s" + std::to_string(members[sub_root]));
    CHECK_OK(group.Barrier());
    CHECK_OK(c.Barrier());
  }
  std::vector<int> everyone(n);
  for (int r = 0; r < n; ++r) everyone[r] = r;
  auto world = c.CreateGroup(everyone);
  CHECK_OK(world.status());
  if (world.ok()) {
    CHECK((*world)->rank() == c.rank());
    CHECK_OK((*world)->Barrier());
  }
  CHECK(c.CreateGroup({n}).status().code() == StatusCode::kInvalidArgument);
}

void TestAgree(Comm& c) {
  CHECK_OK(AgreeOnStatus(c, OkStatus()));
  const int failing = c.size() - 1;
  Status all = AgreeOnStatus(c, c.rank() == failing ? NotFound("tensor w missing") : OkStatus());
  CHECK(all.code() == StatusCode::kNotFound);
  if (c.size() > 1) {
    CHECK(all.message() == "rank " + std::to_string(failing) + ": tensor w missing");
  }
}

// Counts beyond the int limits, simulated with tiny limits: chunked broadcasts, all-gather by
// per-rank broadcasts, point-to-point gather.
void TestChunkedPaths(Comm& world) {
  auto c = MpiCommWithLimits(MPI_COMM_WORLD, MpiLimits{.max_count = 1000, .chunk = 777});
  c->set_timeout(20s);
  const int n = c->size();
  std::string mine = Pattern(3000 + 17 * c->rank(), c->rank());
  auto all = c->AllGather(mine);
  CHECK_OK(all.status());
  if (all.ok()) {
    for (int r = 0; r < n; ++r) CHECK((*all)[r] == Pattern(3000 + 17 * r, r));
  }
  auto got = c->Gather(mine, n - 1);
  CHECK_OK(got.status());
  if (got.ok() && c->rank() == n - 1) {
    for (int r = 0; r < n; ++r) CHECK((*got)[r] == Pattern(3000 + 17 * r, r));
  }
  const std::string big = Pattern(10000, 9);
  std::string data = c->rank() == 0 ? big : "";
  CHECK_OK(c->Broadcast(data, 0));
  CHECK(data == big);
  std::string buf = c->rank() == 0 ? big : std::string(big.size(), '\0');
  auto req = c->IBroadcast(Bytes(buf), 0);
  CHECK_OK(req.status());
  if (req.ok()) CHECK_OK((*req)->Wait());
  CHECK(buf == big);
  CHECK_OK(world.Barrier());
}

// The last rank never joins a barrier: the others fail with kDeadlineExceeded in about the
// timeout, and the communicator then refuses calls. The late rank joins afterwards so that
// MPI's orphaned barrier completes before finalize.
void TestTimeout(Comm& world) {
  if (world.size() < 2) return;
  auto c = MpiComm(MPI_COMM_WORLD);
  c->set_timeout(200ms);
  const int absent = world.size() - 1;
  if (world.rank() != absent) {
    auto start = std::chrono::steady_clock::now();
    Status s = c->Barrier();
    auto took = std::chrono::steady_clock::now() - start;
    CHECK(s.code() == StatusCode::kDeadlineExceeded);
    CHECK(s.message().find("Barrier") != std::string::npos);
    CHECK(took >= 190ms);
    CHECK(took < 60s);  // a hang guard, not a timing test
    CHECK(c->Barrier().code() == StatusCode::kFailedPrecondition);
    std::fprintf(stderr, "[rank %d] expected timeout: %s\n", g_rank, s.ToString().c_str());
  }
  // CreateGroup waits for its members with a timeout too, naming the absent one.
  auto g = MpiComm(MPI_COMM_WORLD);
  g->set_timeout(200ms);
  if (world.rank() == 0) {
    auto sub = g->CreateGroup({0, absent});
    CHECK(sub.status().code() == StatusCode::kDeadlineExceeded);
    CHECK(sub.status().message().find("rank(s) " + std::to_string(absent)) != std::string::npos);
    std::fprintf(stderr, "[rank %d] expected timeout: %s\n", g_rank,
                 sub.status().ToString().c_str());
  }
  CHECK_OK(world.Barrier());
  if (world.rank() == absent) {
    c->set_timeout(20s);
    CHECK_OK(c->Barrier());  // completes the others' abandoned barrier
  }
  CHECK_OK(world.Barrier());
}

int Run(int argc, char** argv) {
  try {
    EnsureMpiInitialized(&argc, &argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  auto world = MpiComm();
  world->set_timeout(60s);
  g_rank = world->rank();
  CHECK(world->backend() == "mpi");

  const std::vector<std::pair<const char*, std::function<void(Comm&)>>> tests = {
      {"AllGatherGatherBroadcast", TestAllGatherGatherBroadcast},
      {"IBroadcast", TestIBroadcast},
      {"ManyConsecutive", TestManyConsecutive},
      {"Groups", TestGroups},
      {"AgreeOnStatus", TestAgree},
      {"ChunkedPaths", TestChunkedPaths},
      {"Timeout", TestTimeout},
  };
  for (const auto& [name, fn] : tests) {
    int before = g_failures;
    fn(*world);
    if (g_rank == 0 || g_failures != before) {
      std::fprintf(stderr, "[rank %d] %s: %s\n", g_rank, name,
                   g_failures == before ? "ok" : "FAILED");
    }
  }
  // Every rank learns whether all passed, so mpirun's exit code reflects any failure.
  Status mine =
      g_failures == 0 ? OkStatus() : Internal(std::to_string(g_failures) + " checks failed");
  Status all = AgreeOnStatus(*world, mine);
  if (g_rank == 0)
    std::fprintf(stderr, "comm_mpi_test: %s\n", all.ok() ? "PASSED" : all.ToString().c_str());
  world.reset();
  return all.ok() ? 0 : 1;
}

}  // namespace
}  // namespace dcp

int main(int argc, char** argv) { return dcp::Run(argc, argv); }
