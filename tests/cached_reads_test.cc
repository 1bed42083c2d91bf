// A load whose every rank finds the stored chunks it reads in its host's page cache copies
// them from there: no broadcast, no exchange of identities (LoadOptions::broadcast_cached
// forces one); a load from storage that is not cached broadcasts as before; ranks of one host
// share reads of an object store, which no page cache holds for them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include "checkpoint/load.h"
#include "dcp/checkpoint.h"
#include "storage/file_system.h"
#include "test_util.h"
#include "testfs/forwarding_file_system.h"
#include "testfs/throttled_file_system.h"

namespace dcp {
namespace {

using testing::TempDir;

constexpr int64_t kRows = 512, kCols = 512;  // 1 MiB of f32, held whole by every rank

std::vector<float> Pattern(float base) {
  std::vector<float> v(kRows * kCols);
  std::iota(v.begin(), v.end(), base);
  return v;
}

// Every data file's pages out of the page cache; false where they stay (a tmpfs).
bool DropCache(const std::string& dir) {
  bool dropped = true;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    const storage::ByteRange all{0, std::filesystem::file_size(e.path())};
    auto cached = storage::PosixFileSystem().CachedFraction(e.path().string(), std::span(&all, 1));
    if (e.path().extension() == ".safetensors" && cached.value_or(1) > 0.5) dropped = false;
  }
  return dropped;
}

// `want` saved to `dir` by `ranks` ranks, each holding it whole.
void SaveWhole(const std::string& dir, int ranks, const std::vector<float>& want) {
  testing::RunRanks(ranks, [&](const std::shared_ptr<Comm>& c) {
    std::vector<float> w = want;
    StateDict sd;
    sd.add("w", TensorView(w.data(), DType::kF32, Shape{kRows, kCols}));
    save(sd, dir, {.comm = c});
  });
}

// A load of `dir` on `ranks` ranks, each into the whole tensor (checked against `want`), with
// `opts` (its comm set per rank) from `fs`: the total of broadcasts over the ranks.
uint64_t BroadcastsOfLoad(const std::string& dir, int ranks, const std::vector<float>& want,
                          LoadOptions opts, storage::FileSystem& fs) {
  std::vector<uint64_t> broadcasts(static_cast<size_t>(ranks), 0);
  testing::RunRanks(ranks, [&](const std::shared_ptr<Comm>& c) {
    std::vector<float> got(kRows * kCols, 0);
    StateDict sd;
    sd.add("w", TensorView(got.data(), DType::kF32, Shape{kRows, kCols}));
    LoadOptions mine = opts;
    mine.comm = c;
    auto r = checkpoint::Load(sd, dir, mine, fs);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(got, want) << "rank " << c->rank();
    broadcasts[static_cast<size_t>(c->rank())] = r->broadcasts;
  });
  return std::accumulate(broadcasts.begin(), broadcasts.end(), uint64_t{0});
}

TEST(CachedReads, WarmLoadsReadFromThePageCacheColdOnesBroadcast) {
  TempDir d;
  const std::vector<float> want = Pattern(1);
  SaveWhole(d.path(), 4, want);
  // Loads on 4 ranks that broadcast within the host when they broadcast at all.
  auto load_all = [&](bool cached) {
    return BroadcastsOfLoad(d.path(), 4, want,
                            {.broadcast_within_host = true, .broadcast_cached = cached},
                            storage::PosixFileSystem());
  };
  // Just written: in the page cache. Read from there by each rank, unless forced.
  EXPECT_EQ(load_all(false), 0u);
  EXPECT_GT(load_all(true), 0u);
  if (!DropCache(d.path())) GTEST_SKIP() << d.path() << " keeps its pages (a tmpfs)";
  EXPECT_GT(load_all(false), 0u);  // from storage: read once, broadcast
}

// The real file system seen as an object store: reads no page cache keeps for the host.
class AsObjectStore final : public testfs::ForwardingFileSystem {
 public:
  bool IsObjectStore() const override { return true; }
};

// Ranks of one host (no broadcast_within_host): on a file system each reads what it wants
// (the host's page cache makes storage deliver it once); on an object store, where each read
// is a request, and on storage that charges every rank's read, a shard several ranks want is
// still read once and broadcast.
TEST(CachedReads, RanksOfOneHostBroadcastWhereStorageChargesEveryRead) {
  TempDir d;
  const std::vector<float> want = Pattern(3);
  SaveWhole(d.path(), 2, want);
  DropCache(d.path());
  EXPECT_EQ(BroadcastsOfLoad(d.path(), 2, want, {}, storage::PosixFileSystem()), 0u);
  AsObjectStore store;
  EXPECT_GT(BroadcastsOfLoad(d.path(), 2, want, {}, store), 0u);
  // Storage that charges every rank's read (dcp bench --storage-gibps): read once there too.
  auto limiter = testfs::BandwidthLimiter::InProcess(1e12);
  testfs::ThrottledFileSystem throttled(storage::PosixFileSystem(), *limiter);
  EXPECT_GT(BroadcastsOfLoad(d.path(), 2, want, {}, throttled), 0u);
}

}  // namespace
}  // namespace dcp
