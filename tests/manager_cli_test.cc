// `dcp ls` and `dcp prune` end to end over a manager's root.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "dcp/manager.h"
#include "storage/lease_lock.h"
#include "test_util.h"

namespace dcp {
namespace {

int Cli(const std::string& args, std::string* out) {
  return testing::RunCommand(std::string(DCP_CLI_PATH) + " " + args, out);
}

std::vector<std::string> StepDirs(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) == 0) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Steps 1..5 saved, keeping everything, and the directory of a save that never committed.
void MakeRoot(const std::string& root) {
  std::vector<float> w(32);
  StateDict sd;
  sd.add("w", TensorView(w.data(), DType::kF32, Shape{32}));
  CheckpointManager mgr(root, RetentionPolicy{});
  for (int64_t step = 1; step <= 5; ++step) {
    std::fill(w.begin(), w.end(), static_cast<float>(step));
    mgr.Save(step, sd);
  }
  std::filesystem::create_directories(root + "/step_000000006");
  std::ofstream(root + "/step_000000006/data-0-r00000.safetensors") << "partial";
}

TEST(ManagerCli, LsShowsStepsLatestAndRetention) {
  testing::TempDir d;
  MakeRoot(d.path());
  std::string out;
  ASSERT_EQ(Cli("ls " + d.path() + " --keep-last 2 --keep-every 2", &out), 0) << out;
  // The step-5 row (not just any "5"): the step, then its state.
  EXPECT_NE(out.find("\n5 "), std::string::npos) << out;
  EXPECT_NE(out.find("complete (latest: a resume loads it)"), std::string::npos) << out;
  EXPECT_NE(out.find("INCOMPLETE"), std::string::npos) << out;
  EXPECT_NE(out.find("6 steps, 5 complete"), std::string::npos) << out;
  EXPECT_NE(out.find("latest record: 5"), std::string::npos) << out;
  EXPECT_NE(out.find("retention would remove: 1 3\n"), std::string::npos) << out;
  EXPECT_EQ(StepDirs(d.path()).size(), 6u);  // ls changes nothing
}

TEST(ManagerCli, PruneDryRunThenPrune) {
  testing::TempDir d;
  MakeRoot(d.path());
  std::string out;
  ASSERT_EQ(Cli("prune " + d.path() + " --keep-last 2 --dry-run", &out), 0) << out;
  EXPECT_NE(out.find("would remove step_000000001\nwould remove step_000000002\nwould remove "
                     "step_000000003\nwould remove 3 steps"),
            std::string::npos)
      << out;
  EXPECT_EQ(StepDirs(d.path()).size(), 6u);
  ASSERT_EQ(Cli("prune " + d.path() + " --keep-last 2 --keep-every 3", &out), 0) << out;
  EXPECT_NE(out.find("removed 2 steps"), std::string::npos) << out;
  // The incomplete step 6 went too (the manager cleans it up).
  EXPECT_EQ(StepDirs(d.path()),
            (std::vector<std::string>{"step_000000003", "step_000000004", "step_000000005"}));
}

TEST(ManagerCli, PruneRefusedWhileAManagerHoldsTheRoot) {
  testing::TempDir d;
  MakeRoot(d.path());
  CheckpointManager job(d.path(), RetentionPolicy{});
  std::string out;
  EXPECT_EQ(Cli("prune " + d.path() + " --keep-last 1", &out), 1) << out;
  EXPECT_NE(out.find("dcp prune: checkpoint root"), std::string::npos) << out;
  EXPECT_NE(out.find("is in use by manager"), std::string::npos) << out;
  EXPECT_EQ(StepDirs(d.path()).size(), 5u);
  std::string unlock_out;
  EXPECT_EQ(Cli("unlock " + d.path(), &unlock_out), 1) << unlock_out;
  EXPECT_NE(unlock_out.find("is alive"), std::string::npos) << unlock_out;
}

// dcp unlock: a lock left by a job on another host that is gone, removed by a person.
TEST(ManagerCli, UnlockRemovesALockOfAGoneHost) {
  testing::TempDir d;
  MakeRoot(d.path());
  const int64_t now = storage::NowUnixMs();
  std::ofstream(d.path() + "/.dcp-manager.lock")
      << storage::EncodeLockHolder({"manager", "77", "gone-host", 4242, now, now});
  std::string out;
  EXPECT_EQ(Cli("prune " + d.path() + " --keep-last 1", &out), 1) << out;
  EXPECT_NE(out.find("dcp unlock " + d.path() + "/.dcp-manager.lock"), std::string::npos) << out;
  EXPECT_EQ(Cli("unlock " + d.path(), &out), 0) << out;
  EXPECT_NE(out.find("removed " + d.path() +
                     "/.dcp-manager.lock (held by manager 77 of process "
                     "4242 on host gone-host"),
            std::string::npos)
      << out;
  EXPECT_EQ(Cli("prune " + d.path() + " --keep-last 1", &out), 0) << out;
  EXPECT_EQ(Cli("unlock " + d.path(), &out), 1) << out;
  EXPECT_NE(out.find("holds no dcp lock"), std::string::npos) << out;
}

}  // namespace
}  // namespace dcp
