#include "async/async_saver.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <thread>

#include "async/staging_pool.h"
#include "checkpoint/metadata_io.h"
#include "dcp/checkpoint.h"
#include "test_util.h"
#include "testfs/fault_file_system.h"
#include "testfs/forwarding_file_system.h"

namespace dcp::async {
namespace {

using namespace std::chrono_literals;
using dcp::testing::TempDir;

// A few tensors (one in two chunks) and a bytes entry, over owned memory.
struct Model {
  std::vector<float> a = std::vector<float>(1 << 16), b1 = std::vector<float>(3000),
                     b2 = std::vector<float>(5000);
  std::vector<int64_t> c = std::vector<int64_t>(777);
  StateDict sd;

  explicit Model(float seed = 1) {
    for (size_t i = 0; i < a.size(); ++i) a[i] = seed * 0.5f + static_cast<float>(i);
    for (size_t i = 0; i < b1.size(); ++i) b1[i] = seed - static_cast<float>(i);
    for (size_t i = 0; i < b2.size(); ++i) b2[i] = seed + 1e-3f * static_cast<float>(i);
    for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<int64_t>(seed) * 1000003 + i;
    sd.add("a", TensorView(a.data(), DType::kF32, {256, 256}));
    sd.add("b", TensorView(b1.data(), DType::kF32, {3, 1000}), Chunk{{8, 1000}, {0, 0}});
    sd.add("b", TensorView(b2.data(), DType::kF32, {5, 1000}), Chunk{{8, 1000}, {3, 0}});
    sd.add("c", TensorView(c.data(), DType::kI64, {777}));
    sd.add_bytes("optim", "{\"lr\": 0.001, \"seed\": " + std::to_string(seed) + "}");
  }
  Model(const Model&) = delete;

  uint64_t Bytes() const { return (a.size() + b1.size() + b2.size()) * 4 + c.size() * 8; }
  void Scribble() {
    std::memset(a.data(), 0xAB, a.size() * 4);
    std::memset(b1.data(), 0xCD, b1.size() * 4);
    std::memset(b2.data(), 0xEF, b2.size() * 4);
    std::memset(c.data(), 0x12, c.size() * 8);
    sd.add_bytes("optim", std::string(5, '\x7f'));  // replaces the payload
  }
};

// Loads `dir` into zeroed memory shaped like Model and compares bitwise with `want`.
void ExpectCheckpointEquals(const std::string& dir, const Model& want) {
  std::vector<float> a(want.a.size()), b(8000);
  std::vector<int64_t> c(want.c.size());
  StateDict sd;
  sd.add("a", TensorView(a.data(), DType::kF32, {256, 256}));
  sd.add("b", TensorView(b.data(), DType::kF32, {8, 1000}));
  sd.add("c", TensorView(c.data(), DType::kI64, {777}));
  sd.add_bytes("optim");
  ASSERT_NO_THROW(load(sd, dir)) << dir;
  EXPECT_EQ(std::memcmp(a.data(), want.a.data(), a.size() * 4), 0);
  EXPECT_EQ(std::memcmp(b.data(), want.b1.data(), want.b1.size() * 4), 0);
  EXPECT_EQ(std::memcmp(b.data() + 3000, want.b2.data(), want.b2.size() * 4), 0);
  EXPECT_EQ(std::memcmp(c.data(), want.c.data(), c.size() * 8), 0);
  EXPECT_EQ(sd.find("optim")->bytes, want.sd.find("optim")->bytes);
}

// The real file system, except that CreateDirs (a save's first storage call) waits until the
// gate is opened: a save that is "slow" for as long as the test wants. Bounded, so a broken
// test fails instead of hanging.
// Polls the saver's own count of Saves blocked by back-pressure (bounded: false after 60 s).
bool WaitUntilWaitingForBuffers(const AsyncSaver& saver) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (saver.pool_stats().waiting == 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// Holds every save at its first directory creation until Open().
class GatedFileSystem final : public testfs::ForwardingFileSystem {
 public:
  void Open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  Status CreateDirs(const std::string& d) override {
    std::unique_lock lock(mu_);
    ++blocked_;
    cv_.notify_all();
    const bool opened = cv_.wait_for(lock, 60s, [&] { return open_; });
    --blocked_;
    if (!opened) return DeadlineExceeded("gate closed");
    return base().CreateDirs(d);
  }
  // Blocks until a save is held at the gate (bounded: false after 60 s).
  bool WaitUntilSomeoneIsBlocked() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 60s, [&] { return blocked_ > 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int blocked_ = 0;  // callers waiting at the gate
};

class ThrowingFileSystem final : public storage::FileSystem {
 public:
  Result<std::unique_ptr<storage::WritableFile>> NewWritableFile(const std::string&) override {
    throw std::runtime_error("boom");
  }
  Result<std::unique_ptr<storage::ReadableFile>> OpenReadable(const std::string&) override {
    throw std::runtime_error("boom");
  }
  Status Rename(const std::string&, const std::string&) override {
    throw std::runtime_error("boom");
  }
  Status SyncDir(const std::string&) override { throw std::runtime_error("boom"); }
  Status Remove(const std::string&) override { throw std::runtime_error("boom"); }
  Status CreateDirs(const std::string&) override { throw std::runtime_error("boom"); }
  Result<std::vector<std::string>> List(const std::string&) override {
    throw std::runtime_error("boom");
  }
  Result<uint64_t> FileSize(const std::string&) override { throw std::runtime_error("boom"); }
};

TEST(AsyncSaver, ValuesChangedAfterSaveReturnsDoNotLeak) {
  TempDir tmp;
  Model m, original;
  GatedFileSystem fs;
  AsyncSaver saver;
  AsyncSave h = SaveWithFileSystem(saver, m.sd, tmp.Sub("ck"), {}, {}, fs);
  m.Scribble();  // the save has not even started persisting
  EXPECT_FALSE(h.Poll());
  fs.Open();
  SaveResult r = h.Get();
  EXPECT_EQ(r.bytes_written, original.Bytes() + original.sd.find("optim")->bytes.size());
  ExpectCheckpointEquals(tmp.Sub("ck"), original);
  EXPECT_EQ(h.staging().bytes_staged, r.bytes_written);
}

// Each entry's nesting path (what load_all rebuilds the state dict from) is saved as a
// synchronous save records it.
TEST(AsyncSaver, EntriesKeepTheirPaths) {
  TempDir tmp;
  Model m;
  m.sd.set_path("a", "[\"model\",\"a\"]");
  m.sd.set_path("optim", "[\"optim\"]");
  AsyncSaver saver;
  saver.Save(m.sd, tmp.Sub("ck")).Get();
  const Metadata md = read_metadata(tmp.Sub("ck"));
  std::map<std::string, std::string> paths;
  for (const auto& t : md.tensors) paths[t.fqn] = t.path;
  for (const auto& b : md.bytes) paths[b.fqn] = b.path;
  EXPECT_EQ(paths["a"], "[\"model\",\"a\"]");
  EXPECT_EQ(paths["optim"], "[\"optim\"]");
  EXPECT_EQ(paths["b"], "");
}

TEST(AsyncSaver, CallbackRunsAfterTheResultAndMayUseTheHandle) {
  TempDir tmp;
  Model m;
  AsyncSaver saver;
  std::promise<std::pair<bool, bool>> seen;
  AsyncSave h = saver.Save(m.sd, tmp.Sub("ck"), {}, [&](const AsyncSave& done) {
    done.Wait();  // must not deadlock
    seen.set_value({done.Poll(), done.status().ok()});
  });
  auto f = seen.get_future();
  ASSERT_EQ(f.wait_for(60s), std::future_status::ready);
  EXPECT_EQ(f.get(), std::make_pair(true, true));
  EXPECT_TRUE(h.Poll());
}

TEST(AsyncSaver, WaitWithTimeoutIsFalseWhileASlowSaveRuns) {
  TempDir tmp;
  Model m;
  GatedFileSystem fs;
  AsyncSaver saver;
  AsyncSave h = SaveWithFileSystem(saver, m.sd, tmp.Sub("ck"), {}, {}, fs);
  EXPECT_FALSE(h.Wait(50ms));
  EXPECT_FALSE(h.Poll());
  fs.Open();
  EXPECT_TRUE(h.Wait(60s));
  EXPECT_TRUE(h.status().ok()) << h.status().ToString();
}

TEST(AsyncSaver, SecondSaveWaitsForTheFirstByDefault) {
  TempDir tmp;
  Model m;
  GatedFileSystem fs;
  AsyncSaver saver;  // default cap: one state dict's worth
  AsyncSave h1 = SaveWithFileSystem(saver, m.sd, tmp.Sub("one"), {}, {}, fs);
  std::atomic<bool> returned{false};
  bool first_committed_when_returned = false;
  AsyncSave h2;
  std::thread second([&] {
    h2 = saver.Save(m.sd, tmp.Sub("two"));
    // The first save's buffer is released once it committed, just before its handle is told.
    first_committed_when_returned =
        checkpoint::ReadMetadata(storage::PosixFileSystem(), tmp.Sub("one")).ok();
    returned = true;
  });
  ASSERT_TRUE(WaitUntilWaitingForBuffers(saver)) << "the second Save never waited for buffers";
  EXPECT_FALSE(returned) << "the second Save did not wait for the first";
  fs.Open();
  second.join();
  EXPECT_TRUE(first_committed_when_returned);
  EXPECT_TRUE(h1.Wait(120s));
  EXPECT_GT(h2.staging().wait_seconds, 0);
  EXPECT_TRUE(h2.staging().reused);  // the first one's buffer, released
  EXPECT_NO_THROW(h2.Get());
  ExpectCheckpointEquals(tmp.Sub("two"), m);
}

TEST(AsyncSaver, StagingOverlapsThePreviousPersistWhenTheCapAllows) {
  TempDir tmp;
  Model m;
  GatedFileSystem fs;
  AsyncSaver saver({.max_staging_bytes = 3 * m.Bytes()});
  AsyncSave h1 = SaveWithFileSystem(saver, m.sd, tmp.Sub("one"), {}, {}, fs);
  AsyncSave h2 = saver.Save(m.sd, tmp.Sub("two"));
  EXPECT_FALSE(h1.Poll()) << "the second Save should not have waited";
  EXPECT_EQ(h2.staging().allocations, 1u);  // a second buffer
  EXPECT_FALSE(h2.Wait(100ms)) << "saves persist one at a time, in order";
  fs.Open();
  EXPECT_NO_THROW(h2.Get());
  EXPECT_TRUE(h1.Poll());
  EXPECT_EQ(saver.pool_stats().allocations, 2u);
  AsyncSave h3 = saver.Save(m.sd, tmp.Sub("three"));
  EXPECT_TRUE(h3.staging().reused);
  EXPECT_NO_THROW(h3.Get());
}

TEST(AsyncSaver, BackPressureWithASmallCap) {
  TempDir tmp;
  Model m;
  GatedFileSystem fs;
  const uint64_t cap = m.Bytes() * 3 / 2 + 8192;  // one state dict, not two
  AsyncSaver saver({.max_staging_bytes = cap, .staging_threads = 2});
  AsyncSave h1 = SaveWithFileSystem(saver, m.sd, tmp.Sub("one"), {}, {}, fs);
  std::atomic<bool> returned{false};
  AsyncSave h2;
  std::thread second([&] {
    h2 = saver.Save(m.sd, tmp.Sub("two"));
    returned = true;
  });
  ASSERT_TRUE(WaitUntilWaitingForBuffers(saver)) << "staging did not wait for buffers";
  EXPECT_FALSE(returned) << "staging did not wait for buffers";
  EXPECT_LE(saver.pool_stats().bytes_allocated, cap);
  fs.Open();
  second.join();
  EXPECT_TRUE(h1.Wait(120s));
  EXPECT_GT(h2.staging().wait_seconds, 0);
  EXPECT_LE(h2.staging().pool_bytes, cap);
  EXPECT_NO_THROW(h2.Get());
}

TEST(AsyncSaver, StateDictLargerThanTheCapFailsNamingSizes) {
  TempDir tmp;
  Model m;
  AsyncSaver saver({.max_staging_bytes = m.Bytes() / 2});
  AsyncSave h = saver.Save(m.sd, tmp.Sub("ck"));
  Status s = h.status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_staging_bytes (" + std::to_string(m.Bytes() / 2) + ")"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("needs "), std::string::npos) << s.message();
  EXPECT_THROW(h.Get(), Error);
  EXPECT_FALSE(std::filesystem::exists(tmp.Sub("ck")));
}

TEST(AsyncSaver, PoolIsReusedOnTheSecondSaveOfTheSameStructure) {
  TempDir tmp;
  Model m;
  AsyncSaver saver;
  AsyncSave h1 = saver.Save(m.sd, tmp.Sub("one"));
  EXPECT_FALSE(h1.staging().reused);
  EXPECT_EQ(h1.staging().allocations, 1u);
  EXPECT_GE(h1.staging().bytes_allocated, m.Bytes());
  EXPECT_NO_THROW(h1.Get());
  Model m2(7);  // other values, same structure
  AsyncSave h2 = saver.Save(m2.sd, tmp.Sub("two"));
  EXPECT_TRUE(h2.staging().reused);
  EXPECT_EQ(h2.staging().allocations, 0u);
  EXPECT_EQ(h2.staging().bytes_allocated, 0u);
  EXPECT_EQ(h2.staging().pool_allocations, 1u);
  EXPECT_NO_THROW(h2.Get());
  EXPECT_TRUE(h2.Get().plan_cache_hit);
  ExpectCheckpointEquals(tmp.Sub("two"), m2);
  EXPECT_EQ(saver.pool_stats().allocations, 1u);
  EXPECT_EQ(saver.pool_stats().bytes_in_use, 0u);
}

TEST(AsyncSaver, PreparedPoolIsUsedByTheFirstSaveWithoutAllocating) {
  TempDir tmp;
  Model m;
  AsyncSaver saver;
  saver.Prepare(m.sd);
  auto ps = saver.pool_stats();
  EXPECT_EQ(ps.allocations, 1u);
  EXPECT_EQ(ps.buffers, 1u);
  EXPECT_GE(ps.bytes_allocated, m.Bytes());
  EXPECT_EQ(ps.bytes_in_use, 0u);
  saver.Prepare(m.sd);  // again: the idle buffer fits, nothing new
  EXPECT_EQ(saver.pool_stats().allocations, 1u);
  AsyncSave h = saver.Save(m.sd, tmp.Sub("one"));
  EXPECT_TRUE(h.staging().reused);
  EXPECT_EQ(h.staging().allocations, 0u);
  EXPECT_EQ(h.staging().bytes_allocated, 0u);
  EXPECT_EQ(h.staging().pool_allocations, 1u);
  EXPECT_EQ(h.staging().pool_bytes, ps.bytes_allocated);
  m.Scribble();  // after Save returned: must not reach the checkpoint
  EXPECT_NO_THROW(h.Get());
  ExpectCheckpointEquals(tmp.Sub("one"), Model());
  EXPECT_EQ(saver.pool_stats().allocations, 1u);
}

TEST(AsyncSaver, SaveLargerThanThePreparedPoolAllocates) {
  TempDir tmp;
  Model m;
  std::vector<float> small(100);
  StateDict tiny;
  tiny.add("x", TensorView(small.data(), DType::kF32, {100}));
  AsyncSaver saver;  // default cap: one state dict's worth
  saver.Prepare(tiny);
  const uint64_t prepared = saver.pool_stats().bytes_allocated;
  ASSERT_LT(prepared, m.Bytes());
  AsyncSave h = saver.Save(m.sd, tmp.Sub("one"));
  EXPECT_FALSE(h.staging().reused);
  EXPECT_EQ(h.staging().allocations, 1u);
  EXPECT_GE(h.staging().bytes_allocated, m.Bytes());
  EXPECT_NO_THROW(h.Get());
  ExpectCheckpointEquals(tmp.Sub("one"), m);
  // Under the default cap the prepared buffer, too small, made room for the new one.
  EXPECT_EQ(saver.pool_stats().buffers, 1u);
  // Preparing for the larger state dict again finds the buffer the save left.
  saver.Prepare(m.sd);
  EXPECT_EQ(saver.pool_stats().allocations, 2u);
}

TEST(AsyncSaver, PrepareBeyondTheCapThrowsNamingSizes) {
  Model m;
  AsyncSaver saver({.max_staging_bytes = m.Bytes() / 2});
  try {
    saver.Prepare(m.sd);
    ADD_FAILURE() << "Prepare did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("max_staging_bytes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(saver.pool_stats().allocations, 0u);
}

TEST(AsyncSaver, PrepareFromACallbackIsRefused) {
  TempDir tmp;
  Model m;
  AsyncSaver saver;
  std::promise<StatusCode> code;
  AsyncSave h = saver.Save(m.sd, tmp.Sub("one"), {}, [&](const AsyncSave&) {
    try {
      saver.Prepare(m.sd);
      code.set_value(StatusCode::kOk);
    } catch (const Error& e) {
      code.set_value(e.code());
    }
  });
  auto f = code.get_future();
  ASSERT_EQ(f.wait_for(120s), std::future_status::ready);
  EXPECT_EQ(f.get(), StatusCode::kFailedPrecondition);
  EXPECT_NO_THROW(h.Get());
}

TEST(AsyncSaver, DestructionWaitsForThePendingSave) {
  TempDir tmp;
  Model m;
  GatedFileSystem fs;
  AsyncSave h;
  std::thread opener;
  {
    AsyncSaver saver;
    h = SaveWithFileSystem(saver, m.sd, tmp.Sub("ck"), {}, {}, fs);
    // The save cannot finish before the gate opens, and the gate opens only once the save
    // is held there: the destructor below has a pending save to wait for.
    opener = std::thread([&] {
      EXPECT_TRUE(fs.WaitUntilSomeoneIsBlocked());
      fs.Open();
    });
  }
  EXPECT_TRUE(h.Poll());
  opener.join();
  EXPECT_NO_THROW(h.Get());
  ExpectCheckpointEquals(tmp.Sub("ck"), m);
}

TEST(AsyncSaver, ExceptionInTheBackgroundBecomesAnError) {
  TempDir tmp;
  Model m;
  ThrowingFileSystem fs;
  AsyncSaver saver;
  AsyncSave h = SaveWithFileSystem(saver, m.sd, tmp.Sub("ck"), {}, {}, fs);
  Status s = h.status();
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("boom"), std::string::npos) << s.message();
  // The saver still works, and reuses the buffer the failed save released.
  AsyncSave ok = saver.Save(m.sd, tmp.Sub("ck"));
  EXPECT_NO_THROW(ok.Get());
  EXPECT_TRUE(ok.staging().reused);
}

TEST(AsyncSaver, FailedSaveKeepsItsErrorAndThePreviousCheckpoint) {
  TempDir tmp;
  Model m, original;
  AsyncSaver saver;
  const std::string ck = tmp.Sub("ck");
  ASSERT_NO_THROW(saver.Save(m.sd, ck).Get());
  auto before = checkpoint::ReadMetadata(storage::PosixFileSystem(), ck);
  ASSERT_TRUE(before.ok());
  testfs::FaultFileSystem fs(storage::PosixFileSystem());
  fs.FailAt(2);
  m.Scribble();
  AsyncSave failed = SaveWithFileSystem(saver, m.sd, ck, {}, {}, fs);
  AsyncSave next = saver.Save(original.sd, tmp.Sub("next"));  // proceeds
  EXPECT_NE(failed.status().message().find("injected failure"), std::string::npos)
      << failed.status().ToString();
  EXPECT_NO_THROW(next.Get());
  auto after = checkpoint::ReadMetadata(storage::PosixFileSystem(), ck);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->save_id, before->save_id);
  ExpectCheckpointEquals(ck, original);
}

TEST(AsyncSaver, SaveFromACallbackIsRefused) {
  TempDir tmp;
  Model m;
  AsyncSaver saver;
  std::promise<StatusCode> code;
  saver.Save(m.sd, tmp.Sub("ck"), {}, [&](const AsyncSave&) {
    try {
      saver.Save(m.sd, tmp.Sub("again"));
      code.set_value(StatusCode::kOk);
    } catch (const Error& e) {
      code.set_value(e.code());
    }
  });
  saver.WaitAll();
  EXPECT_EQ(code.get_future().get(), StatusCode::kFailedPrecondition);
}

TEST(AsyncSaver, StagingThreadsShareTheCpusAmongTorchrunsLocalRanks) {
  // torchrun names the ranks on this node LOCAL_WORLD_SIZE (Open MPI and MPICH have their
  // own names): with as many local ranks as CPUs, each rank stages with one thread, even
  // with bytes enough to keep several busy (more would oversubscribe the cores).
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const std::string cpus = std::to_string(CPU_COUNT(&set));
  const char* before = std::getenv("LOCAL_WORLD_SIZE");
  const std::optional<std::string> saved =
      before ? std::optional<std::string>(before) : std::nullopt;
  ASSERT_EQ(setenv("LOCAL_WORLD_SIZE", cpus.c_str(), 1), 0);
  std::optional<AsyncSaver> saver;
  saver.emplace();  // reads the launcher's environment when built, and only then
  if (saved) {
    setenv("LOCAL_WORLD_SIZE", saved->c_str(), 1);
  } else {
    unsetenv("LOCAL_WORLD_SIZE");
  }
  TempDir tmp;
  std::vector<float> big(size_t{32} << 20 >> 2, 1.0f);  // 32 MiB: four threads' worth
  StateDict sd;
  sd.add("w", TensorView(big.data(), DType::kF32, {static_cast<int64_t>(big.size())}));
  AsyncSave h = saver->Save(sd, tmp.Sub("ck"));
  EXPECT_EQ(h.staging().threads, 1);
  EXPECT_NO_THROW(h.Get());
}

TEST(AsyncSaver, DefaultSaver) {
  TempDir tmp;
  Model m, original;
  AsyncSave h = async_save(m.sd, tmp.Sub("ck"));
  m.Scribble();
  EXPECT_NO_THROW(h.Get());
  ExpectCheckpointEquals(tmp.Sub("ck"), original);
}

TEST(StagingPool, CapsMemoryAndFreesIdleBuffersThatAreTooSmall) {
  StagingPool pool(NewHostAllocator(), 1 << 20);
  auto a = pool.Acquire(100000);
  ASSERT_TRUE(a.ok());
  pool.Release(a->id);
  auto b = pool.Acquire(950000);  // a is too small and must go to make room
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(pool.stats().buffers, 1u);
  EXPECT_LE(pool.stats().bytes_allocated, 1u << 20);
  pool.Release(b->id);
  auto c = pool.Acquire(5000);  // best fit: b, already there
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->allocations, 0u);
  pool.Release(c->id);
  EXPECT_EQ(pool.Acquire(2 << 20).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp::async
