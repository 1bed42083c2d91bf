// The memory tier in one process (a world of one host): steps in memory and in the root,
// the tier's retention and budget, restore from memory or from the root, the drain at the end.
// Several hosts, lost hosts and damaged copies: ctest mpi.memory_tier (tests/mpi/tier_test.sh).
#include "dcp/memory_tier.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>

#include "dcp/manager.h"
#include "test_util.h"
#include "tier/memory_tier.h"

namespace dcp {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// A tensor and a bytes entry whose values say which step wrote them.
struct StepState {
  std::vector<int32_t> w = std::vector<int32_t>(4096);
  StateDict sd;
  StepState() {
    sd.add("w", TensorView(w.data(), DType::kI32, Shape{64, 64}));
    sd.add_bytes("step", std::string_view("-"));
  }
  void Fill(int64_t step) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<int32_t>(step * 100000 + i);
    const std::string s = std::to_string(step);
    sd.mutable_bytes(1).assign(reinterpret_cast<const std::byte*>(s.data()),
                               reinterpret_cast<const std::byte*>(s.data() + s.size()));
  }
  bool Holds(int64_t step) const {
    for (size_t i = 0; i < w.size(); ++i) {
      if (w[i] != static_cast<int32_t>(step * 100000 + i)) return false;
    }
    const auto& b = sd.find("step")->bytes;
    return std::string(reinterpret_cast<const char*>(b.data()), b.size()) == std::to_string(step);
  }
};

ManagerOptions WithTier(const std::string& tier_dir, int64_t persist_every,
                        bool persist_at_exit = false) {
  ManagerOptions o;
  MemoryTierOptions t;
  t.dir = tier_dir;
  t.persist_every = persist_every;
  t.persist_at_exit = persist_at_exit;
  o.memory_tier = t;
  return o;
}

std::vector<std::string> TierSteps(const std::string& tier_dir, const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(tier::HostTierDir(tier_dir, root))) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void SaveSteps(CheckpointManager& mgr, StepState& st, std::initializer_list<int64_t> steps) {
  for (int64_t s : steps) {
    st.Fill(s);
    mgr.Save(s, st.sd);
  }
}

// Loads the newest step into `st`: it must be `step`, from memory or not, with its exact data.
LoadResult ExpectLoads(CheckpointManager& mgr, StepState& st, int64_t step, bool from_memory) {
  st.Fill(0);
  LoadResult r = mgr.Load(st.sd);
  EXPECT_EQ(r.step, step);
  EXPECT_EQ(r.from_memory, from_memory);
  EXPECT_TRUE(st.Holds(step));
  return r;
}

TEST(MemoryTier, RecentStepsInMemoryEveryNthInTheRootRestoreFromMemory) {
  TempDir d;
  const std::string root = d.Sub("ckpt"), tier_dir = d.Sub("shm");
  StepState st;
  {
    CheckpointManager mgr(root, WithTier(tier_dir, 2));
    for (int64_t s = 1; s <= 3; ++s) {
      st.Fill(s);
      s == 2 ? mgr.Save(s, st.sd) : (mgr.AsyncSave(s, st.sd), SaveResult());
    }
    mgr.Wait();
    EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{2}));            // persist_every 2
    EXPECT_EQ(mgr.memory_steps(), (std::vector<int64_t>{2, 3}));  // keep_last 2
    EXPECT_EQ(mgr.latest_step(), 3);
    EXPECT_THROW(mgr.Save(3, st.sd), Error);  // not newer than step 3 in memory
  }
  EXPECT_EQ(TierSteps(tier_dir, root),
            (std::vector<std::string>{"step_000000002", "step_000000003"}));
  // A new job finds step 3 in memory.
  {
    CheckpointManager mgr(root, WithTier(tier_dir, 2));
    EXPECT_EQ(mgr.latest_step(), 3);
    LoadResult r = ExpectLoads(mgr, st, 3, /*from_memory=*/true);
    EXPECT_EQ(r.files_from_storage, 0u);
  }
  // The host lost its memory: step 2 from the root.
  fs::remove_all(tier_dir);
  {
    CheckpointManager mgr(root, WithTier(tier_dir, 2));
    EXPECT_EQ(mgr.latest_step(), 2);
    ExpectLoads(mgr, st, 2, /*from_memory=*/false);
  }
}

// A save that failed (a full tmpfs, stood in for by a file-size limit) leaves a step
// directory without metadata: retention neither counts it nor keeps it, so the last good step
// before it stays restorable.
TEST(MemoryTier, RetentionCountsCompleteStepsOnly) {
  TempDir d;
  const std::string root = d.Sub("ckpt"), tier_dir = d.Sub("shm");
  StepState st;
  {
    CheckpointManager mgr(root, WithTier(tier_dir, 0));
    SaveSteps(mgr, st, {1});
    struct rlimit before {};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = before;
    small.rlim_cur = 1024;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    st.Fill(2);
    EXPECT_THROW(mgr.Save(2, st.sd), Error);
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &before), 0);
    std::signal(SIGXFSZ, old_handler);
    SaveSteps(mgr, st, {3});
    EXPECT_EQ(mgr.memory_steps(), (std::vector<int64_t>{1, 3}));
  }
  EXPECT_EQ(TierSteps(tier_dir, root),
            (std::vector<std::string>{"step_000000001", "step_000000003"}));
  fs::remove_all(tier::HostTierDir(tier_dir, root) + "/step_000000003");  // 3 is lost
  CheckpointManager mgr(root, WithTier(tier_dir, 0));
  ExpectLoads(mgr, st, 1, /*from_memory=*/true);
}

TEST(MemoryTier, ANewerStepInTheRootWinsAndADamagedCopyFallsBack) {
  TempDir d;
  const std::string root = d.Sub("ckpt"), tier_dir = d.Sub("shm");
  StepState st;
  {
    CheckpointManager mgr(root, WithTier(tier_dir, 0));
    SaveSteps(mgr, st, {1, 2});
  }
  // Step 3 saved without the tier: the root's step 3 is newer than memory's step 2.
  {
    CheckpointManager mgr(root, RetentionPolicy{});
    SaveSteps(mgr, st, {3});
  }
  {
    CheckpointManager mgr(root, WithTier(tier_dir, 0));
    ExpectLoads(mgr, st, 3, /*from_memory=*/false);
  }
  fs::remove_all(root + "/step_000000003");
  // Step 2's only copy damaged: step 1 from memory, never wrong data.
  const std::string dir = tier::HostTierDir(tier_dir, root) + "/step_000000002";
  for (const auto& f : testing::ListFiles(dir, "data-")) testing::FlipByte(dir + "/" + f, 200);
  {
    CheckpointManager mgr(root, WithTier(tier_dir, 0));
    LoadResult r = ExpectLoads(mgr, st, 1, /*from_memory=*/true);
    EXPECT_NE(r.fell_back.find("step 2 in memory: no intact copy of every file left"),
              std::string::npos)
        << r.fell_back;
    // The account follows the restore: training goes on from step 1, and step 2 may be
    // saved again.
    EXPECT_EQ(mgr.latest_step(), 1);
    EXPECT_EQ(mgr.memory_steps(), (std::vector<int64_t>{1}));
    st.Fill(2);
    EXPECT_NO_THROW(mgr.Save(2, st.sd));
  }
  {  // The damaged copy was marked and replaced: a restart restores the new step 2.
    CheckpointManager mgr(root, WithTier(tier_dir, 0));
    EXPECT_EQ(mgr.latest_step(), 2);
    st.Fill(0);
    LoadResult r = mgr.Load(st.sd);
    EXPECT_EQ(r.step, 2);
    EXPECT_TRUE(r.fell_back.empty()) << r.fell_back;
    EXPECT_TRUE(st.Holds(2));
  }
}

TEST(MemoryTier, OverBudgetStepsGoToTheRootAndTheLastStepIsPersistedAtTheEnd) {
  TempDir d;
  const std::string root = d.Sub("ckpt"), tier_dir = d.Sub("shm");
  StepState st;
  {
    ManagerOptions o = WithTier(tier_dir, 0, /*persist_at_exit=*/true);
    o.memory_tier->max_bytes = 1000;  // less than one step
    CheckpointManager mgr(root, o);
    st.Fill(1);
    mgr.Save(1, st.sd);
    EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{1}));
    EXPECT_TRUE(mgr.memory_steps().empty());
  }
  {
    CheckpointManager mgr(root, WithTier(tier_dir, 0, /*persist_at_exit=*/true));
    st.Fill(2);
    mgr.AsyncSave(2, st.sd);
    EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{1}));
  }  // the end drains step 2
  CheckpointManager mgr(root, RetentionPolicy{});
  EXPECT_EQ(mgr.steps(), (std::vector<int64_t>{1, 2}));
  st.Fill(0);
  EXPECT_EQ(mgr.Load(st.sd).step, 2);
  EXPECT_TRUE(st.Holds(2));
}

TEST(MemoryTier, SettingsThatMakeNoSenseAreRefused) {
  TempDir d;
  ManagerOptions o = WithTier(d.Sub("shm"), 1);
  o.memory_tier->keep_last = 0;
  EXPECT_THROW(CheckpointManager(d.Sub("ckpt"), o), Error);
  o.memory_tier->keep_last = 2;
  o.memory_tier->replicas = -1;
  EXPECT_THROW(CheckpointManager(d.Sub("ckpt"), o), Error);
}

}  // namespace
}  // namespace dcp
