// A progress line for long commands: on a terminal one line rewritten in place (\r), at most
// ten times a second; otherwise (logs, pipes) a plain line every few seconds. Writes to
// stderr. Not thread-safe: one thread calls Update/Finish (PollProgress runs its own).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

namespace dcp::tools {

class Progress {
 public:
  // `label` starts every line; totals of 0 are not shown. `enabled` false: silent.
  Progress(std::string label, uint64_t total_bytes, uint64_t total_items, std::string item_name,
           bool enabled = true);
  ~Progress();

  void Update(uint64_t bytes, uint64_t items);
  // Prints the final line (and ends a terminal's in-place line).
  void Finish();

  // The line for these counts after `seconds` (for tests).
  std::string Line(uint64_t bytes, uint64_t items, double seconds) const;

 private:
  void Print(uint64_t bytes, uint64_t items, bool final);

  std::string label_;
  uint64_t total_bytes_, total_items_;
  std::string item_name_;
  bool enabled_, tty_;
  bool finished_ = false;
  size_t last_width_ = 0;
  uint64_t bytes_ = 0, items_ = 0;
  std::chrono::steady_clock::time_point start_, last_print_;
};

// Calls `poll` every 200 ms on a background thread and feeds the answer (bytes, items) to a
// Progress, until destroyed, then prints the final line with one last poll.
class PollProgress {
 public:
  using PollFn = std::function<std::pair<uint64_t, uint64_t>()>;
  PollProgress(Progress& progress, PollFn poll);
  ~PollProgress();

 private:
  Progress& progress_;
  PollFn poll_;
  std::jthread thread_;
};

}  // namespace dcp::tools
