#include "tools/progress.h"

#include <unistd.h>

#include <cstdio>

#include "dcp/format.h"

namespace dcp::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kTtyInterval = std::chrono::milliseconds(100);
constexpr auto kLogInterval = std::chrono::seconds(5);

}  // namespace

Progress::Progress(std::string label, uint64_t total_bytes, uint64_t total_items,
                   std::string item_name, bool enabled)
    : label_(std::move(label)),
      total_bytes_(total_bytes),
      total_items_(total_items),
      item_name_(std::move(item_name)),
      enabled_(enabled),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_(Clock::now()),
      last_print_(start_) {}

Progress::~Progress() {
  if (tty_ && last_width_ > 0 && !finished_) std::fputc('\n', stderr);
}

std::string Progress::Line(uint64_t bytes, uint64_t items, double seconds) const {
  std::string line = label_ + ": ";
  line += HumanBytes(bytes);
  if (total_bytes_ > 0) {
    char pct[32];
    std::snprintf(pct, sizeof(pct), " (%.0f%%)", 100.0 * bytes / total_bytes_);
    line += " of " + HumanBytes(total_bytes_) + pct;
  }
  line += ", " + std::to_string(items);
  if (total_items_ > 0) line += "/" + std::to_string(total_items_);
  line += " " + item_name_;
  char rate[64];
  std::snprintf(rate, sizeof(rate), ", %.1f s, %.2f GiB/s", seconds,
                seconds > 0 ? bytes / seconds / (1 << 30) : 0.0);
  return line + rate;
}

void Progress::Update(uint64_t bytes, uint64_t items) {
  bytes_ = bytes;
  items_ = items;
  if (!enabled_ || finished_) return;
  const auto now = Clock::now();
  if (now - last_print_ <
      (tty_ ? kTtyInterval : std::chrono::duration_cast<Clock::duration>(kLogInterval))) {
    return;
  }
  last_print_ = now;
  Print(bytes, items, false);
}

void Progress::Finish() {
  if (!enabled_ || finished_) return;
  Print(bytes_, items_, true);
  finished_ = true;
}

void Progress::Print(uint64_t bytes, uint64_t items, bool final) {
  std::string line =
      Line(bytes, items, std::chrono::duration<double>(Clock::now() - start_).count());
  if (tty_) {
    // Overwrite the previous line, blanking what a shorter line leaves behind.
    size_t width = line.size();
    if (width < last_width_) line.append(last_width_ - width, ' ');
    last_width_ = width;
    std::fprintf(stderr, "\r%s%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

PollProgress::PollProgress(Progress& progress, PollFn poll)
    : progress_(progress), poll_(std::move(poll)) {
  thread_ = std::jthread([this](std::stop_token stop) {
    while (!stop.stop_requested()) {
      auto [bytes, items] = poll_();
      progress_.Update(bytes, items);
      for (int i = 0; i < 20 && !stop.stop_requested(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  });
}

PollProgress::~PollProgress() {
  thread_.request_stop();
  thread_.join();
  auto [bytes, items] = poll_();
  progress_.Update(bytes, items);
  progress_.Finish();
}

}  // namespace dcp::tools
