#include "storage/s3/task_pool.h"

namespace dcp::storage::s3 {

TaskPool::TaskPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

TaskPool::~TaskPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void TaskPool::Submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void TaskPool::Run() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void TaskGroup::Run(std::function<Status()> task) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return running_ < limit_; });
    ++running_;
  }
  pool_.Submit([this, task = std::move(task)] {
    Status s = task();
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok() && error_.ok()) error_ = s;
    --running_;
    cv_.notify_all();
  });
}

Status TaskGroup::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return running_ == 0; });
  return error_;
}

Status TaskGroup::first_error() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

}  // namespace dcp::storage::s3
