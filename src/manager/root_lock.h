// The lock of a manager's root (file system roots; an object store's root takes a save lock).
#pragma once

#include <string>

#include "dcp/status.h"

namespace dcp::manager {

// The lock file: flock() keeps a second manager of this host out (released by the kernel when
// a process dies), its content (host pid) names the holder, and keeps out managers of other
// hosts, which flock cannot see on every shared file system.
class RootLock {
 public:
  ~RootLock() { Release(); }
  // kFailedPrecondition naming the holder when another manager holds `root`.
  Status Acquire(const std::string& root);
  void Release();

 private:
  // The lock file's content: "host pid", or empty when free.
  std::string ReadRaw();
  struct Holder {
    std::string host;  // empty: free
    long pid = 0;
  };
  static Holder Parse(const std::string& raw);

  std::string path_;
  int fd_ = -1;
};

}  // namespace dcp::manager
