// FileComm across runs: a job restarted over the directory of an earlier, killed run.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dcp/comm.h"
#include "test_util.h"

namespace dcp {
namespace {

// `n` ranks as threads, each with its own FileComm over `dir`; rank r all-gathers
// `tag`+r after sleeping `delay_ms[r]`. Returns what each rank received.
std::vector<std::vector<std::string>> RunRanks(const std::string& dir, int n,
                                               const std::string& tag, std::vector<int> delay_ms) {
  std::vector<std::vector<std::string>> got(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms[r]));
      auto comm = FileComm(dir, r, n);
      comm->set_timeout(std::chrono::seconds(60));
      auto all = comm->AllGather(tag + std::to_string(r));
      if (all.ok()) got[r] = *all;
      std::string b = r == 1 ? tag + "-broadcast" : "";
      if (comm->Broadcast(b, 1).ok()) got[r].push_back(b);
    });
  }
  for (auto& t : threads) t.join();
  return got;
}

TEST(FileCommTest, ARestartedJobNeverReadsAnEarlierRunsMessages) {
  testing::TempDir d;
  // Run 1, in a child process that dies without cleaning up (as a killed job): its hellos,
  // run file, acks and messages stay in the directory.
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto old = RunRanks(d.path(), 3, "old-", {0, 0, 0});
    _exit(old[2].size() == 4 && old[2][0] == "old-0" ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_FALSE(testing::ListFiles(d.path() + "/.dcp-comm/c0").empty());
  // Run 2 (this process's first FileComm over the directory: the same c0): rank 1 starts late,
  // so rank 0 first sees rank 1's stale hello; ranks 0 and 2 could read stale messages.
  auto got = RunRanks(d.path(), 3, "new-", {0, 300, 0});
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(got[r], (std::vector<std::string>{"new-0", "new-1", "new-2", "new--broadcast"}))
        << "rank " << r;
  }
}

}  // namespace
}  // namespace dcp
