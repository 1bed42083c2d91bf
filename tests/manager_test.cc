// The checkpoint manager: retention as a pure function, steps/latest/resume on disk, the lock,
// crashes at every storage operation (including lost unsynced renames), several ranks.
#include "dcp/manager.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "dcp/checkpoint.h"
#include "manager/manager.h"
#include "storage/file_system.h"
#include "storage/lease_lock.h"
#include "test_util.h"
#include "testfs/fault_file_system.h"
#include "testfs/forwarding_file_system.h"

namespace dcp {
namespace {

using testing::TempDir;

// ---- Retention, pure ------------------------------------------------------------------------

std::vector<int64_t> Remove(std::vector<int64_t> steps, std::optional<int64_t> latest,
                            RetentionPolicy p, std::set<int64_t> keeps = {}) {
  return StepsToRemove(steps, latest, p, keeps);
}

TEST(Retention, KeepLastRemovesOlderSteps) {
  EXPECT_EQ(Remove({1, 2, 3, 4, 5}, 5, {.keep_last = 2}), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(Remove({5, 3, 1, 4, 2}, 5, {.keep_last = 3}), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Remove({1, 2}, 2, {.keep_last = 5}), (std::vector<int64_t>{}));
}

TEST(Retention, NoPolicyKeepsEverything) { EXPECT_TRUE(Remove({1, 2, 3, 4}, 4, {}).empty()); }

TEST(Retention, NothingRemovedWithoutADurableLatest) {
  EXPECT_TRUE(Remove({1, 2, 3}, std::nullopt, {.keep_last = 1}).empty());
  // `latest` names a step that is not complete: nothing is known to be durable.
  EXPECT_TRUE(Remove({1, 2, 3}, 7, {.keep_last = 1}).empty());
}

TEST(Retention, OnlyStepsOlderThanLatestGo) {
  // A step newer than latest (its latest update was lost) is never removed, nor is latest.
  EXPECT_EQ(Remove({1, 2, 3, 4}, 2, {.keep_last = 1}), (std::vector<int64_t>{1}));
}

TEST(Retention, NewestStepNeverRemoved) {
  EXPECT_EQ(Remove({1, 2, 3}, 3, {.keep_last = 0}), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Remove({3}, 3, {.keep_last = 0}), (std::vector<int64_t>{}));
  // keep_every alone keeps its multiples and the newest step.
  EXPECT_EQ(Remove({1, 2, 3, 4, 5}, 5, {.keep_every = 2}), (std::vector<int64_t>{1, 3}));
}

TEST(Retention, KeepEveryAndKeepLastCombine) {
  EXPECT_EQ(Remove({100, 200, 300, 400, 500, 600, 700}, 700, {.keep_last = 2, .keep_every = 300}),
            (std::vector<int64_t>{100, 200, 400, 500}));
}

TEST(Retention, KeptOnDemandStays) {
  EXPECT_EQ(Remove({1, 2, 3, 4, 5}, 5, {.keep_last = 1}, {2}), (std::vector<int64_t>{1, 3, 4}));
}

TEST(StepNames, ZeroPaddedAndParsed) {
  EXPECT_EQ(StepDirName(100), "step_000000100");
  EXPECT_EQ(StepDirName(12345678901), "step_12345678901");
  EXPECT_EQ(ParseStepDirName("step_000000100"), 100);
  EXPECT_EQ(ParseStepDirName("step_12345678901"), 12345678901);
  EXPECT_FALSE(ParseStepDirName("step_100"));
  EXPECT_FALSE(ParseStepDirName("step_0000001000x"));
  EXPECT_FALSE(ParseStepDirName("step_0000000100"));  // not the canonical spelling
  EXPECT_FALSE(ParseStepDirName("latest"));
}

// ---- A small sharded state whose values depend on the step ----------------------------------

constexpr int64_t kRows = 8, kCols = 16;

struct State {
  std::vector<float> w;  // this rank's rows
  StateDict sd;
  int rank, world;

  State(int r, int n) : rank(r), world(n) {
    const int64_t rows = kRows / n;
    w.resize(static_cast<size_t>(rows * kCols));
    sd.add("w", TensorView(w.data(), DType::kF32, Shape{rows, kCols}),
           Chunk{Shape{kRows, kCols}, Shape{rows * r, 0}});
    sd.add_bytes("step", std::string_view("none"));
  }
  float Value(int64_t step, size_t i) const {
    return static_cast<float>(step * 1000 + static_cast<int64_t>(rank) * 10000000 +
                              static_cast<int64_t>(i));
  }
  void Fill(int64_t step) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = Value(step, i);
    std::string s = std::to_string(step);
    auto& b = sd.mutable_bytes(1);
    b.assign(reinterpret_cast<const std::byte*>(s.data()),
             reinterpret_cast<const std::byte*>(s.data()) + s.size());
  }
  void Clear() {
    std::fill(w.begin(), w.end(), -1.0f);
    sd.mutable_bytes(1).clear();
  }
  // Every value is the one of `step`: a load of one step, never a mix.
  ::testing::AssertionResult Holds(int64_t step) const {
    for (size_t i = 0; i < w.size(); ++i) {
      if (w[i] != Value(step, i)) {
        return ::testing::AssertionFailure() << "rank " << rank << " w[" << i << "] = " << w[i]
                                             << ", step " << step << " wrote " << Value(step, i);
      }
    }
    const auto& b = sd.find("step")->bytes;
    std::string s(reinterpret_cast<const char*>(b.data()), b.size());
    if (s != std::to_string(step)) {
      return ::testing::AssertionFailure() << "bytes entry says step " << s << ", want " << step;
    }
    return ::testing::AssertionSuccess();
  }
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<int64_t> LatestRecord(const std::string& root) {
  std::string s = ReadFile(root + "/latest");
  if (s.empty()) return std::nullopt;
  return std::stoll(s);
}

std::vector<int64_t> StepDirsOnDisk(const std::string& root) {
  std::vector<int64_t> out;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    if (auto s = ParseStepDirName(e.path().filename().string())) out.push_back(*s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Steps 1..n under `root` by a manager that keeps everything, closed afterwards.
void SaveSteps(const std::string& root, State& st, int64_t n) {
  CheckpointManager mgr(root, RetentionPolicy{});
  for (int64_t step = 1; step <= n; ++step) {
    st.Fill(step);
    mgr.Save(step, st.sd);
  }
}

// ---- One process ----------------------------------------------------------------------------

TEST(Manager, SavesRetainsAndResumes) {
  TempDir d;
  State st(0, 1);
  {
    CheckpointManager mgr(d.path(), RetentionPolicy{.keep_last = 2});
    EXPECT_FALSE(mgr.latest_step());
    for (int64_t step = 10; step <= 50; step += 10) {
      st.Fill(step);
      mgr.Save(step, st.sd);
      EXPECT_EQ(mgr.latest_step(), step);
      EXPECT_EQ(LatestRecord(d.path()), step);
    }
    EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{40, 50}));
    EXPECT_EQ(StepDirsOnDisk(d.path()), (std::vector<int64_t>{40, 50}));
    EXPECT_TRUE(std::filesystem::exists(d.path() + "/step_000000050/dcp.metadata"));
    st.Clear();
    mgr.Load(st.sd, 40);
    EXPECT_TRUE(st.Holds(40));
    EXPECT_THROW(mgr.Load(st.sd, 30), Error);
    EXPECT_THROW(mgr.Save(50, st.sd), Error);  // not newer
  }
  CheckpointManager again(d.path(), RetentionPolicy{.keep_last = 2});
  EXPECT_EQ(again.latest_step(), 50);
  st.Clear();
  again.Load(st.sd);
  EXPECT_TRUE(st.Holds(50));
}

// Settings that would delete everything but the newest step are refused, naming how to keep
// everything (issue 19: keep_last 0 or -1 and keep_every 0 or -5 all deleted every older step).
TEST(Manager, RetentionSettingsThatDeleteEverythingAreRefused) {
  TempDir d;
  for (RetentionPolicy p : {RetentionPolicy{.keep_last = 0}, RetentionPolicy{.keep_last = -1},
                            RetentionPolicy{.keep_every = 0}, RetentionPolicy{.keep_every = -5},
                            RetentionPolicy{.keep_last = 2, .keep_every = 0}}) {
    try {
      CheckpointManager mgr(d.path(), p);
      ADD_FAILURE() << "accepted keep_last=" << p.keep_last.value_or(99)
                    << " keep_every=" << p.keep_every.value_or(99);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("unset"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(ValidateRetention({.keep_last = 1, .keep_every = 1}).ok());
  EXPECT_TRUE(ValidateRetention({}).ok());
  CheckpointManager ok(d.path(), RetentionPolicy{.keep_last = 1});  // the root is not held
}

// Planted symlinks are never written through: a lock file that is a symlink is refused, and a
// `latest.tmp` symlink planted while the manager runs is replaced, its target untouched
// (issue 19: the lock text and latest went through such links).
TEST(Manager, PlantedSymlinksAreNeverWrittenThrough) {
  TempDir d;
  const std::string target = d.path() + "/precious";
  std::ofstream(target) << "keep";
  std::filesystem::create_directories(d.path() + "/root");
  ASSERT_EQ(::symlink(target.c_str(), (d.path() + "/root/.dcp-manager.lock").c_str()), 0);
  try {
    CheckpointManager mgr(d.path() + "/root", RetentionPolicy{});
    ADD_FAILURE() << "a symlinked lock file was used";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("symlink"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ReadFile(target), "keep");
  std::filesystem::remove(d.path() + "/root/.dcp-manager.lock");

  State st(0, 1);
  CheckpointManager mgr(d.path() + "/root", RetentionPolicy{});
  ASSERT_EQ(::symlink(target.c_str(), (d.path() + "/root/latest.tmp").c_str()), 0);
  st.Fill(1);
  mgr.Save(1, st.sd);
  EXPECT_EQ(ReadFile(target), "keep");
  EXPECT_FALSE(std::filesystem::is_symlink(d.path() + "/root/latest"));
  EXPECT_EQ(LatestRecord(d.path() + "/root"), 1);
}

TEST(Manager, KeepEveryAndKeepOnDemand) {
  TempDir d;
  State st(0, 1);
  CheckpointManager mgr(d.path(), RetentionPolicy{.keep_last = 1, .keep_every = 4});
  for (int64_t step = 1; step <= 9; ++step) {
    if (step == 3) mgr.Keep(3);
    st.Fill(step);
    mgr.Save(step, st.sd);
  }
  EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{3, 4, 8, 9}));
  EXPECT_EQ(StepDirsOnDisk(d.path()), (std::vector<int64_t>{3, 4, 8, 9}));
}

TEST(Manager, AsyncSavesRetainAfterCommit) {
  TempDir d;
  State st(0, 1);
  CheckpointManager mgr(d.path(), RetentionPolicy{.keep_last = 2});
  mgr.PrepareAsyncSave(st.sd);  // the staging memory ahead of the first save
  for (int64_t step = 1; step <= 5; ++step) {
    st.Fill(step);
    mgr.AsyncSave(step, st.sd);
    st.Fill(step + 100);  // training overwrites the state: the save holds its staged copy
  }
  mgr.Wait();
  EXPECT_EQ(mgr.latest_step(), 5);
  EXPECT_EQ(LatestRecord(d.path()), 5);
  EXPECT_EQ(StepDirsOnDisk(d.path()), (std::vector<int64_t>{4, 5}));
  st.Clear();
  mgr.Load(st.sd);
  EXPECT_TRUE(st.Holds(5));
}

TEST(Manager, FailedAsyncSaveLeavesLatestAndKeptSteps) {
  TempDir d;
  State st(0, 1);
  testfs::FaultFileSystem ffs(storage::PosixFileSystem());
  auto mgr = manager::NewManager(d.path(), {.policy = {.keep_last = 2}}, ffs);
  for (int64_t step = 1; step <= 3; ++step) {
    st.Fill(step);
    mgr->AsyncSave(step, st.sd);
  }
  mgr->Wait();
  ffs.FailAt(ffs.ops() + 3);  // a few operations into step 4's save, before its commit
  st.Fill(4);
  mgr->AsyncSave(4, st.sd);
  EXPECT_THROW(mgr->Wait(), Error);
  EXPECT_EQ(mgr->latest_step(), 3);
  EXPECT_EQ(mgr->steps(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(LatestRecord(d.path()), 3);
  mgr.reset();
  CheckpointManager again(d.path(), RetentionPolicy{.keep_last = 2});
  EXPECT_EQ(again.steps(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(StepDirsOnDisk(d.path()), (std::vector<int64_t>{2, 3}));  // step 4 cleaned up
}

// Issue 19's crash loop: the newest step's data has flipped bytes at the same size (it looks
// complete); resume falls back to the previous step, says why, and marks the step bad on disk,
// so the next job resumes from the good step at once.
TEST(Manager, ResumeFallsBackPastACorruptStep) {
  TempDir d;
  State st(0, 1);
  SaveSteps(d.path(), st, 3);
  const std::string step3 = d.path() + "/step_000000003/";
  for (const auto& f : testing::ListFiles(step3, "data-")) {
    testing::FlipByte(step3 + f, std::filesystem::file_size(step3 + f) - 1);
  }
  {
    CheckpointManager mgr(d.path(), RetentionPolicy{});
    EXPECT_EQ(mgr.latest_step(), 3);  // sizes are right: it looks complete
    st.Clear();
    LoadResult r = mgr.Load(st.sd);
    EXPECT_EQ(r.step, 2);
    EXPECT_NE(r.fell_back.find("step 3"), std::string::npos) << r.fell_back;
    EXPECT_TRUE(st.Holds(2));
    EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(LatestRecord(d.path()), 2);
    EXPECT_TRUE(std::filesystem::exists(step3 + "dcp.bad"));  // marked, not deleted
    auto info = inspect_root(d.path());
    ASSERT_EQ(info.steps.size(), 3u);
    EXPECT_FALSE(info.steps[2].complete);
    EXPECT_NE(info.steps[2].problem.find("marked bad"), std::string::npos) << info.steps[2].problem;
    // An explicit step is not replaced by another one.
    try {
      mgr.Load(st.sd, 3);
      ADD_FAILURE() << "loaded a bad step";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kNotFound);
    }
  }
  CheckpointManager again(d.path(), RetentionPolicy{});  // a later job: straight to step 2
  EXPECT_EQ(again.latest_step(), 2);
}

TEST(Manager, ResumeTrustsTheDiskNotLatest) {
  TempDir d;
  State st(0, 1);
  SaveSteps(d.path(), st, 4);
  // Step 4 damaged (a data file short), `latest` pointing at a step that does not exist, and
  // a directory of a save that never committed.
  for (const auto& f : testing::ListFiles(d.path() + "/step_000000004", "data-")) {
    testing::TruncateFile(d.path() + "/step_000000004/" + f, 3);
  }
  std::ofstream(d.path() + "/latest") << "7\n";
  std::filesystem::create_directories(d.path() + "/step_000000009");
  std::ofstream(d.path() + "/step_000000009/data-x-r00000.safetensors") << "partial";

  auto info = inspect_root(d.path());
  ASSERT_EQ(info.steps.size(), 5u);
  EXPECT_FALSE(info.steps[3].complete);
  EXPECT_NE(info.steps[3].problem.find("bytes"), std::string::npos) << info.steps[3].problem;
  EXPECT_FALSE(info.steps[4].complete);
  EXPECT_EQ(info.latest, 3);
  EXPECT_EQ(info.latest_record, 7);

  CheckpointManager mgr(d.path(), RetentionPolicy{});
  EXPECT_EQ(mgr.latest_step(), 3);
  EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(LatestRecord(d.path()), 3);  // repaired
  // The save that never committed is cleaned up; the damaged step is left for a person.
  EXPECT_EQ(StepDirsOnDisk(d.path()), (std::vector<int64_t>{1, 2, 3, 4}));
  st.Clear();
  mgr.Load(st.sd);
  EXPECT_TRUE(st.Holds(3));
}

TEST(Manager, PruneAppliesThePolicy) {
  TempDir d;
  State st(0, 1);
  {
    CheckpointManager mgr(d.path(), RetentionPolicy{});
    for (int64_t step = 1; step <= 6; ++step) {
      st.Fill(step);
      mgr.Save(step, st.sd);
    }
  }
  CheckpointManager mgr(d.path(), RetentionPolicy{.keep_last = 2, .keep_every = 3});
  EXPECT_EQ(mgr.Prune(/*dry_run=*/true), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(StepDirsOnDisk(d.path()).size(), 6u);
  EXPECT_EQ(mgr.Prune(), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(StepDirsOnDisk(d.path()), (std::vector<int64_t>{3, 5, 6}));
  EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{3, 5, 6}));
}

// ---- The lock -------------------------------------------------------------------------------

std::string Host() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

TEST(ManagerLock, SecondManagerOnOneRootRefused) {
  TempDir d;
  CheckpointManager first(d.path(), RetentionPolicy{});
  try {
    CheckpointManager second(d.path(), RetentionPolicy{});
    FAIL() << "a second manager on one root was allowed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("is in use by manager"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(getpid())), std::string::npos) << e.what();
  }
}

TEST(ManagerLock, ReleasedOnDestruction) {
  TempDir d;
  { CheckpointManager first(d.path(), RetentionPolicy{}); }
  CheckpointManager second(d.path(), RetentionPolicy{});
  EXPECT_NE(ReadFile(d.path() + "/.dcp-manager.lock").find(std::to_string(getpid())),
            std::string::npos);
}

TEST(ManagerLock, StaleLockOfDeadProcessTakenOver) {
  TempDir d;
  pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);  // `child` is now a dead pid
  const int64_t now = storage::NowUnixMs();
  std::ofstream(d.path() + "/.dcp-manager.lock")
      << storage::EncodeLockHolder({"manager", "ab", Host(), child, now, now});
  CheckpointManager mgr(d.path(), RetentionPolicy{});
  auto holder = storage::DecodeLockHolder(ReadFile(d.path() + "/.dcp-manager.lock"));
  ASSERT_TRUE(holder.ok());
  EXPECT_EQ(holder->pid, getpid());
}

TEST(ManagerLock, LockOfAnotherHostRefused) {
  TempDir d;
  const int64_t now = storage::NowUnixMs();
  std::ofstream(d.path() + "/.dcp-manager.lock")
      << storage::EncodeLockHolder({"manager", "ab", "some-other-host-xyz", 4242, now, now});
  try {
    CheckpointManager mgr(d.path(), RetentionPolicy{});
    FAIL() << "a lock of another host was ignored";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("some-other-host-xyz"), std::string::npos) << e.what();
  }
  // A person who knows that job is gone: dcp unlock, or break_lock.
  const auto removed = unlock(d.path());
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_NE(removed[0].find("process 4242 on host some-other-host-xyz"), std::string::npos)
      << removed[0];
  std::ofstream(d.path() + "/.dcp-manager.lock")
      << storage::EncodeLockHolder({"manager", "ab", "some-other-host-xyz", 4242, now, now});
  ManagerOptions o;
  o.break_lock = true;
  CheckpointManager mgr(d.path(), o);
}

// A live manager of this host is not unlocked by hand: it holds the kernel lock.
TEST(ManagerLock, UnlockRefusesALiveHolderOfThisHost) {
  TempDir d;
  CheckpointManager first(d.path(), RetentionPolicy{});
  try {
    unlock(d.path());
    FAIL() << "a live manager's lock was removed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("is alive"), std::string::npos) << e.what();
  }
  try {
    unlock(d.path() + "/nothing-here");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kNotFound);
  }
}

// ---- File recycling ---------------------------------------------------------------------------

// The one tensor data file of a one-rank step, and its inode.
std::string DataFileOf(const std::string& step_dir) {
  for (const auto& e : std::filesystem::directory_iterator(step_dir)) {
    const std::string n = e.path().filename().string();
    if (n.ends_with(".safetensors")) return e.path().string();
  }
  return {};
}
ino_t Inode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

TEST(ManagerRecycle, RetiredFilesBecomeTheNextSavesAndHoldOnlyItsBytes) {
  TempDir d;
  // A larger state first, so the recycled file is longer than what overwrites it.
  std::vector<float> big(4096);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) + 0.5f;
  StateDict large;
  large.add("big", TensorView(big.data(), DType::kF32, Shape{64, 64}),
            Chunk{Shape{64, 64}, {0, 0}});
  State st(0, 1);
  CheckpointManager mgr(d.path(), RetentionPolicy{.keep_last = 1});
  SaveResult r1 = mgr.Save(1, large);
  EXPECT_FALSE(r1.file_recycled);  // nothing retired yet
  const std::string file1 = DataFileOf(mgr.step_dir(1));
  const ino_t inode1 = Inode(file1);
  const uint64_t size1 = std::filesystem::file_size(file1);
  st.Fill(2);
  EXPECT_FALSE(mgr.Save(2, st.sd).file_recycled);
  // Step 1 is retired: its data file waits in the recycle directory.
  const std::string pooled = d.path() + "/.recycle/r00000.safetensors";
  ASSERT_TRUE(std::filesystem::exists(pooled));
  EXPECT_EQ(Inode(pooled), inode1);
  EXPECT_FALSE(std::filesystem::exists(mgr.step_dir(1)));
  EXPECT_EQ(inspect_root(d.path()).recycle_files, 1u);

  st.Fill(3);
  EXPECT_TRUE(mgr.Save(3, st.sd).file_recycled);
  const std::string file3 = DataFileOf(mgr.step_dir(3));
  EXPECT_EQ(Inode(file3), inode1);  // the same blocks, renamed and overwritten
  const uint64_t size3 = std::filesystem::file_size(file3);
  EXPECT_LT(size3, size1);  // cut to the new bytes: no tail of step 1
  EXPECT_EQ(read_metadata(mgr.step_dir(3)).files.at(0).size, size3);
  // Every checksum of the recycled step verifies, and it loads.
  const VerifyResult v = verify(mgr.step_dir(3));
  EXPECT_GT(v.chunks, 0u);
  st.Clear();
  mgr.Load(st.sd);
  EXPECT_TRUE(st.Holds(3));
  // Step 2 (kept until step 3 was durable) is retired in its turn; its file waits.
  EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{3}));
  EXPECT_TRUE(std::filesystem::exists(pooled));
}

TEST(ManagerRecycle, KeptStepsAreNeverRecycled) {
  TempDir d;
  State st(0, 1);
  CheckpointManager mgr(d.path(), RetentionPolicy{.keep_last = 2, .keep_every = 3});
  int recycled = 0;
  for (int64_t step = 1; step <= 8; ++step) {
    st.Fill(step);
    recycled += mgr.Save(step, st.sd).file_recycled ? 1 : 0;
  }
  EXPECT_GT(recycled, 0);  // files were recycled around the kept steps
  // Every kept step still loads its own bytes after its neighbours' files were recycled.
  for (int64_t step : mgr.steps()) {
    st.Clear();
    mgr.Load(st.sd, step);
    EXPECT_TRUE(st.Holds(step)) << "step " << step;
    EXPECT_GT(verify(mgr.step_dir(step)).chunks, 0u);
  }
  EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{3, 6, 7, 8}));
}

TEST(ManagerRecycle, OffDeletesRetiredFilesAndEmptiesThePool) {
  TempDir d;
  State st(0, 1);
  {
    CheckpointManager on(d.path(), RetentionPolicy{.keep_last = 1});
    for (int64_t step = 1; step <= 2; ++step) {
      st.Fill(step);
      on.Save(step, st.sd);
    }
  }
  ASSERT_TRUE(std::filesystem::exists(d.path() + "/.recycle/r00000.safetensors"));
  CheckpointManager off(d.path(), {.policy = {.keep_last = 1}, .recycle_files = false});
  EXPECT_FALSE(std::filesystem::exists(d.path() + "/.recycle"));
  for (int64_t step = 3; step <= 4; ++step) {
    st.Fill(step);
    EXPECT_FALSE(off.Save(step, st.sd).file_recycled);
  }
  EXPECT_FALSE(std::filesystem::exists(d.path() + "/.recycle"));
  EXPECT_EQ(off.steps(), (std::vector<int64_t>{4}));
}

TEST(ManagerRecycle, FourRanksEachOverwriteTheirOwnFile) {
  TempDir d;
  testing::RunRanks(4, [&](const std::shared_ptr<Comm>& comm) {
    State st(comm->rank(), comm->size());
    CheckpointManager mgr(d.path(), RetentionPolicy{.keep_last = 1}, comm);
    for (int64_t step = 1; step <= 4; ++step) {
      st.Fill(step);
      SaveResult r;
      if (step % 2) {
        r = mgr.Save(step, st.sd);
        EXPECT_EQ(r.file_recycled, step >= 3) << "rank " << comm->rank() << " step " << step;
      } else {
        mgr.AsyncSave(step, st.sd);
      }
    }
    mgr.Wait();
    st.Clear();
    mgr.Load(st.sd);
    EXPECT_TRUE(st.Holds(4));
  });
  EXPECT_GT(verify(d.path() + "/step_000000004").chunks, 0u);
  EXPECT_EQ(inspect_root(d.path()).recycle_files, 4u);
}

// ---- Crashes at every storage operation -----------------------------------------------------

// Over a FaultFileSystem: a rename whose directory was not fsynced afterwards is undone by a
// crash (the old target comes back), as on a real file system.
class LossyRenameFs final : public testfs::ForwardingFileSystem {
 public:
  explicit LossyRenameFs(testfs::FaultFileSystem& f) : ForwardingFileSystem(f), f_(f) {}
  Status Rename(const std::string& from, const std::string& to) override {
    std::optional<std::string> old;
    if (auto r = storage::ReadWholeFile(storage::PosixFileSystem(), to); r.ok()) old = *r;
    Status s = f_.Rename(from, to);
    std::lock_guard lock(mu_);
    if (s.ok()) pending_.push_back({from, to, old});
    return s;
  }
  Status SyncDir(const std::string& dir) override {
    Status s = f_.SyncDir(dir);
    std::lock_guard lock(mu_);
    if (s.ok()) {
      std::erase_if(pending_, [&](const Pending& p) {
        return std::filesystem::path(p.to).parent_path().string() == dir;
      });
    }
    return s;
  }
  // A recycled file's rename is lost like any other (the file goes back to the recycle
  // directory, with whatever was overwritten).
  Result<std::unique_ptr<storage::WritableFile>> ReuseFile(const std::string& from,
                                                           const std::string& to) override {
    auto f = f_.ReuseFile(from, to);
    std::lock_guard lock(mu_);
    if (f.ok()) {
      pending_.push_back({from, to, std::nullopt});
      ++reused_;
    }
    return f;
  }

  // Unsynced data is cut back, then unsynced renames are undone, newest first.
  int Crash() {
    f_.SimulateCrash();
    std::lock_guard lock(mu_);
    int undone = 0;
    for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
      std::error_code ec;
      std::filesystem::rename(it->to, it->from, ec);
      if (it->old) std::ofstream(it->to, std::ios::binary) << *it->old;
      ++undone;
    }
    pending_.clear();
    return undone;
  }
  int reused() const { return reused_; }

 private:
  struct Pending {
    std::string from, to;
    std::optional<std::string> old;
  };
  testfs::FaultFileSystem& f_;
  std::mutex mu_;
  std::vector<Pending> pending_;
  int reused_ = 0;  // data files recycled
};

struct SweepResult {
  int64_t total_ops = 0;
  int crashes = 0;
  int renames_undone = 0;
  int files_recycled = 0;  // in the run without a crash
};

// Runs "save steps 1..n" through a file system failing at operation `fail_at` (-1: never),
// crashes, then checks what a fresh manager resumes. Returns the operations counted.
int64_t CrashAndResume(int64_t fail_at, bool async, const RetentionPolicy& policy, int n,
                       SweepResult* sweep, bool recycle = true) {
  TempDir d;
  State st(0, 1);
  testfs::FaultFileSystem ffs(storage::PosixFileSystem());
  LossyRenameFs fs(ffs);
  ffs.FailAt(fail_at);
  int64_t last_ok = -1;  // the newest step whose save returned
  int64_t tried = 0;
  try {
    auto mgr = manager::NewManager(d.path(), {.policy = policy, .recycle_files = recycle}, fs);
    for (int64_t step = 1; step <= n; ++step) {
      tried = step;
      st.Fill(step);
      if (async) {
        mgr->AsyncSave(step, st.sd);
        mgr->Wait();
      } else {
        mgr->Save(step, st.sd);
      }
      last_ok = step;
    }
  } catch (const Error&) {
  }
  const int64_t ops = ffs.ops();
  if (fail_at >= 0) {
    ++sweep->crashes;
    sweep->renames_undone += fs.Crash();
  } else {
    sweep->files_recycled = fs.reused();
  }
  const std::string where =
      "failing at operation " + std::to_string(fail_at) + (async ? " (async)" : " (sync)");
  CheckpointManager mgr(d.path(), {.policy = policy, .recycle_files = recycle});
  auto latest = mgr.latest_step();
  if (last_ok < 0 && !latest) return ops;  // crashed before any step was durable
  EXPECT_TRUE(latest.has_value()) << where;
  if (!latest) return ops;
  EXPECT_GE(*latest, last_ok) << where;
  EXPECT_LE(*latest, tried) << where;
  st.Clear();
  mgr.Load(st.sd);
  EXPECT_TRUE(st.Holds(*latest)) << where;
  // Never fewer good steps than the policy promises: every step it keeps of those up to the
  // resumed one is complete.
  std::vector<int64_t> saved;
  for (int64_t s = 1; s <= *latest; ++s) saved.push_back(s);
  auto gone = StepsToRemove(saved, *latest, policy);
  auto have = mgr.steps();
  for (int64_t s : saved) {
    if (std::find(gone.begin(), gone.end(), s) != gone.end()) continue;
    EXPECT_TRUE(std::find(have.begin(), have.end(), s) != have.end())
        << where << ": step " << s << " should have been kept";
  }
  // Only complete steps remain as directories (incomplete ones were cleaned up).
  EXPECT_EQ(StepDirsOnDisk(d.path()), have) << where;
  return ops;
}

void Sweep(bool async, const RetentionPolicy& policy, bool recycle = true) {
  SweepResult sweep;
  const int n = 5;
  const int64_t total = CrashAndResume(-1, async, policy, n, &sweep, recycle);
  ASSERT_GT(total, 5 * n);
  // With recycling, later saves did overwrite retired files (so crashes hit them).
  if (recycle) {
    EXPECT_GT(sweep.files_recycled, 0);
  } else {
    EXPECT_EQ(sweep.files_recycled, 0);
  }
  for (int64_t k = 0; k < total; ++k) CrashAndResume(k, async, policy, n, &sweep, recycle);
  EXPECT_EQ(sweep.crashes, total);
  // The sweep did reach the lossy cases: renames before their directory fsync.
  EXPECT_GT(sweep.renames_undone, 0);
  std::printf(
      "crash sweep (%s, recycling %s): %lld operations, %d crashes, %d renames undone, "
      "%d files recycled without a crash\n",
      async ? "async" : "sync", recycle ? "on" : "off", static_cast<long long>(total),
      sweep.crashes, sweep.renames_undone, sweep.files_recycled);
}

TEST(ManagerCrash, EveryOperationOfSyncSaves) { Sweep(false, {.keep_last = 2}); }

TEST(ManagerCrash, EveryOperationOfSyncSavesWithoutRecycling) {
  Sweep(false, {.keep_last = 2}, /*recycle=*/false);
}

TEST(ManagerCrash, EveryOperationOfAsyncSavesKeepEvery) {
  Sweep(true, {.keep_last = 1, .keep_every = 2});
}

// ---- Several ranks --------------------------------------------------------------------------

TEST(ManagerMultiRank, FourRanksSyncAndAsync) {
  TempDir d;
  testing::RunRanks(4, [&](const std::shared_ptr<Comm>& comm) {
    State st(comm->rank(), comm->size());
    {
      CheckpointManager mgr(d.path(), RetentionPolicy{.keep_last = 2}, comm);
      for (int64_t step = 1; step <= 6; ++step) {
        st.Fill(step);
        if (step % 2) {
          mgr.Save(step, st.sd);
        } else {
          mgr.AsyncSave(step, st.sd);
        }
      }
      mgr.Wait();
      EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{5, 6}));
    }
    CheckpointManager again(d.path(), RetentionPolicy{.keep_last = 2}, comm);
    EXPECT_EQ(again.latest_step(), 6);
    st.Clear();
    again.Load(st.sd);
    EXPECT_TRUE(st.Holds(6));
  });
  EXPECT_EQ(StepDirsOnDisk(d.path()), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(LatestRecord(d.path()), 6);
}

// Two ranks over one failing file system: whichever rank's operation fails (the count is
// shared, so it may be either), every rank gets the error, none hangs, and after the crash
// both ranks resume the same complete step with every step the policy keeps.
TEST(ManagerMultiRank, CrashAtEveryOperationOfTwoRanks) {
  const RetentionPolicy policy{.keep_last = 2};
  const int n = 4;
  int64_t total = -1;
  int crashes = 0;
  for (int64_t fail_at = -1; total < 0 || fail_at < total; ++fail_at) {
    TempDir d;
    testfs::FaultFileSystem ffs(storage::PosixFileSystem());
    LossyRenameFs fs(ffs);
    ffs.FailAt(fail_at);
    std::atomic<int64_t> last_ok{INT64_MAX};  // the newest step whose save returned, all ranks
    testing::RunRanks(2, [&](const std::shared_ptr<Comm>& comm) {
      State st(comm->rank(), comm->size());
      int64_t mine = 0;
      try {
        auto mgr = manager::NewManager(d.path(), {.policy = policy, .comm = comm}, fs);
        for (int64_t step = 1; step <= n; ++step) {
          st.Fill(step);
          if (step % 2) {
            mgr->Save(step, st.sd);
          } else {
            mgr->AsyncSave(step, st.sd);
            mgr->Wait();
          }
          mine = step;
        }
      } catch (const Error&) {
      }
      int64_t cur = last_ok.load();
      while (mine < cur && !last_ok.compare_exchange_weak(cur, mine)) {
      }
    });
    if (fail_at < 0) {
      total = ffs.ops();
      ASSERT_EQ(last_ok.load(), n);
      continue;
    }
    ++crashes;
    fs.Crash();
    const std::string where = "failing at operation " + std::to_string(fail_at);
    testing::RunRanks(2, [&](const std::shared_ptr<Comm>& comm) {
      CheckpointManager mgr(d.path(), policy, comm);
      auto latest = mgr.latest_step();
      if (!latest) {
        EXPECT_EQ(last_ok.load(), 0) << where;
        return;
      }
      EXPECT_GE(*latest, last_ok.load()) << where;
      State st(comm->rank(), comm->size());
      st.Clear();
      mgr.Load(st.sd);
      EXPECT_TRUE(st.Holds(*latest)) << where;
      if (*latest >= 2) {
        auto have = mgr.steps();
        EXPECT_TRUE(std::find(have.begin(), have.end(), *latest - 1) != have.end())
            << where << ": step " << *latest - 1 << " should have been kept";
      }
    });
  }
  EXPECT_EQ(crashes, total);
  EXPECT_GT(total, 4 * n);
}

// The corrupt-step fallback with several ranks: only rank 1's file of step 3 is damaged, and
// every rank falls back to step 2 alike, with the same reason (issue 19 item 5).
TEST(ManagerMultiRank, EveryRankFallsBackPastACorruptStepAlike) {
  TempDir d;
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& comm) {
    State st(comm->rank(), 2);
    CheckpointManager mgr(d.path(), RetentionPolicy{}, comm);
    for (int64_t step = 1; step <= 3; ++step) {
      st.Fill(step);
      mgr.Save(step, st.sd);
    }
  });
  const std::string step3 = d.path() + "/step_000000003/";
  const auto files = testing::ListFiles(step3, "data-");
  bool flipped = false;
  for (const auto& f : files) {
    if (f.find("-r00001.") != std::string::npos) {
      testing::FlipByte(step3 + f, std::filesystem::file_size(step3 + f) - 1), flipped = true;
    }
  }
  ASSERT_TRUE(flipped) << "no data file of rank 1 in step 3";
  std::vector<LoadResult> results(2);
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& comm) {
    State st(comm->rank(), 2);
    CheckpointManager mgr(d.path(), RetentionPolicy{}, comm);
    st.Clear();
    results[comm->rank()] = mgr.Load(st.sd);
    EXPECT_TRUE(st.Holds(2)) << "rank " << comm->rank();
  });
  for (const LoadResult& r : results) {
    EXPECT_EQ(r.step, 2);
    EXPECT_EQ(r.fell_back, results[0].fell_back);
  }
  EXPECT_NE(results[0].fell_back.find("step 3"), std::string::npos) << results[0].fell_back;
  EXPECT_TRUE(std::filesystem::exists(step3 + "dcp.bad"));
}

TEST(ManagerMultiRank, LockRefusalReachesEveryRank) {
  TempDir d;
  CheckpointManager holder(d.path(), RetentionPolicy{});
  std::atomic<int> refused{0};
  testing::RunRanks(3, [&](const std::shared_ptr<Comm>& comm) {
    try {
      CheckpointManager mgr(d.path(), RetentionPolicy{}, comm);
    } catch (const Error& e) {
      if (e.code() == StatusCode::kFailedPrecondition) ++refused;
    }
  });
  EXPECT_EQ(refused.load(), 3);
}

}  // namespace
}  // namespace dcp
