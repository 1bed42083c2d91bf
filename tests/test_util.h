// Helpers shared by the module tests.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/thread_comm.h"
#include "dcp/comm.h"

namespace dcp::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs a shell command; returns its exit code and puts stdout+stderr in *output.
int RunCommand(const std::string& cmd, std::string* output);

// Files of `dir` whose names start with `prefix`.
std::vector<std::string> ListFiles(const std::string& dir, const std::string& prefix = "");

void FlipByte(const std::string& path, uint64_t offset);

// Runs `body` as `n` ranks, each a thread with its own ThreadComm (timeout 120 s), and
// joins them.
void RunRanks(int n, const std::function<void(const std::shared_ptr<Comm>&)>& body);
void TruncateFile(const std::string& path, uint64_t size);

}  // namespace dcp::testing
