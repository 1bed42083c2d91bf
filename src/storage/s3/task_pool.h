// A fixed set of threads running queued tasks: the parallel parts of S3 uploads and reads.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "dcp/status.h"

namespace dcp::storage::s3 {

class TaskPool {
 public:
  explicit TaskPool(int threads);
  ~TaskPool();
  void Submit(std::function<void()> task);

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// Tasks of one caller: waits for all of them, keeps the first error, and bounds how many are
// in flight (Admit blocks while `limit` are).
class TaskGroup {
 public:
  TaskGroup(TaskPool& pool, size_t limit) : pool_(pool), limit_(limit) {}
  ~TaskGroup() { (void)Wait(); }
  void Run(std::function<Status()> task);
  Status Wait();
  Status first_error();

 private:
  TaskPool& pool_;
  size_t limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t running_ = 0;
  Status error_;
};

}  // namespace dcp::storage::s3
