// Parallel copying for staging: a fixed set of std::jthread workers that, with the calling
// thread, copy one list of (source, destination, size) pieces split into equal byte ranges;
// a large job with non-temporal stores (past the caches: see copy_threads.cc).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace dcp::async {

struct CopyPiece {
  const std::byte* src;
  std::byte* dst;
  uint64_t size;
};

class CopyThreads {
 public:
  // `threads` >= 1 copiers in all: the caller and threads - 1 workers.
  explicit CopyThreads(int threads);
  // Joins the workers (std::jthread).
  ~CopyThreads();
  CopyThreads(const CopyThreads&) = delete;
  CopyThreads& operator=(const CopyThreads&) = delete;

  // Copies every piece; thread k of n takes bytes [total*k/n, total*(k+1)/n) of the pieces
  // laid end to end, so large pieces are split and small ones batched. Uses fewer threads
  // when there is too little to copy for each to be worth waking. Returns the thread count.
  // One call at a time.
  int Copy(const std::vector<CopyPiece>& pieces);

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  void CopyRange(int k, int n);
  void WorkerLoop(std::stop_token stop, int index);

  // The current job, published under mu_ by bumping generation_.
  const std::vector<CopyPiece>* pieces_ = nullptr;
  std::vector<uint64_t> starts_;  // byte offset of each piece in the concatenation
  uint64_t total_ = 0;
  int active_ = 0;  // threads copying this job, the caller included

  std::mutex mu_;  // guards generation_, remaining_, and the job fields when published
  std::condition_variable_any wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;
  int remaining_ = 0;                  // workers still copying the current job
  std::vector<std::jthread> workers_;  // last: joined before the fields above go away
};

}  // namespace dcp::async
