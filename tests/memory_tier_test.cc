// The memory tier in one process (a world of one host): steps in memory and in the root,
// the tier's retention and budget, restore from memory or from the root, the drain at the end.
// Several hosts, lost hosts and damaged copies: ctest mpi.memory_tier (tests/mpi/tier_test.sh).
#include "dcp/memory_tier.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <memory>
#include <random>
#include <set>

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

// A save of `step` that fails writing its first data file (a full tmpfs, stood in for by a
// file-size limit): nothing of it is committed.
void FailingSave(CheckpointManager& mgr, StepState& st, int64_t step) {
  struct rlimit before {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = before;
  small.rlim_cur = 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  st.Fill(step);
  EXPECT_THROW(mgr.Save(step, st.sd), Error);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &before), 0);
  std::signal(SIGXFSZ, old_handler);
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
    FailingSave(mgr, st, 2);
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

// Retention and the manager's account as a property: random sequences of saves, failed saves,
// damaged memory copies and restarts (seeded). Model: the committed memory copies (the tier
// keeps the newest keep_last = 2, failed saves never count), the damaged ones, the root's
// steps (every persist_every-th). A restart loads exactly the newest step of the root and the
// undamaged memory copies, with its data; the manager then answers that step as latest, never
// lists a step it passed over, and the next step saves.
TEST(MemoryTier, RetentionAndTheAccountHoldOverRandomSequences) {
  int fallbacks = 0, failed_saves = 0;
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    TempDir d;
    const std::string root = d.Sub("ckpt"), tier_dir = d.Sub("shm");
    const int64_t persist_every = seed - 1;  // 0 (never), 1 (every step), 2
    StepState st;
    std::set<int64_t> memory, damaged, durable;
    int64_t next = 1;
    auto mgr = std::make_unique<CheckpointManager>(root, WithTier(tier_dir, persist_every));
    for (int op = 0; op < 24; ++op) {
      const int roll = static_cast<int>(rng() % 10);
      if (roll < 5) {  // a save
        st.Fill(next);
        mgr->Save(next, st.sd);
        memory.insert(next);
        damaged.erase(next);  // a step passed over, saved again
        while (memory.size() > 2) memory.erase(memory.begin());
        if (persist_every > 0 && next % persist_every == 0) durable.insert(next);
        EXPECT_EQ(mgr->latest_step(), next);
        ++next;
      } else if (roll < 6) {  // a save that fails: nothing changes
        const std::optional<int64_t> before = mgr->latest_step();
        FailingSave(*mgr, st, next);
        EXPECT_EQ(mgr->latest_step(), before);
        ++failed_saves;
      } else if (roll < 8 && !memory.empty()) {  // the newest memory copy damaged
        const int64_t victim = *memory.rbegin();
        char name[32];
        std::snprintf(name, sizeof(name), "/step_%09lld", static_cast<long long>(victim));
        const std::string dir = tier::HostTierDir(tier_dir, root) + name;
        for (const auto& f : testing::ListFiles(dir, "data-")) {
          testing::FlipByte(dir + "/" + f, 200);
        }
        damaged.insert(victim);
      } else {  // a restart
        mgr.reset();
        mgr = std::make_unique<CheckpointManager>(root, WithTier(tier_dir, persist_every));
        std::set<int64_t> loadable = durable;
        for (int64_t s : memory) {
          if (!damaged.count(s)) loadable.insert(s);
        }
        if (loadable.empty()) {
          st.Fill(0);
          EXPECT_THROW(mgr->Load(st.sd), Error);
          continue;
        }
        const int64_t expect = *loadable.rbegin();
        st.Fill(0);
        LoadResult r = mgr->Load(st.sd);
        EXPECT_EQ(r.step, expect) << r.fell_back;
        EXPECT_TRUE(st.Holds(expect));
        EXPECT_EQ(mgr->latest_step(), expect);
        if (!memory.empty() && *memory.rbegin() > expect) ++fallbacks;
        // What the restore passed over (damaged, newer than what it loaded) is gone from the
        // account; the training goes on from the step loaded.
        for (auto it = memory.begin(); it != memory.end();) {
          it = *it > expect ? memory.erase(it) : std::next(it);
        }
        for (int64_t s : mgr->memory_steps()) EXPECT_TRUE(memory.count(s)) << s;
        next = expect + 1;
      }
    }
  }
  EXPECT_GT(fallbacks, 0);  // the sequences reach what they are for
  EXPECT_GT(failed_saves, 0);
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
