// A read-only shared mapping of a HuggingFace source file that survives the file shrinking
// under it. A plain mapping kills the process with SIGBUS when a page past the file's new end
// is read (another job rewrote the model while `dcp convert` ran); a pread copy would cost the
// whole model in process memory. Instead a SIGBUS handler, installed once, maps a zero page
// over a faulting page that belongs to a registered source mapping and records the fault; any
// other SIGBUS keeps its previous disposition. Check() then turns that into a clear error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "dcp/status.h"

namespace dcp::convert {

class SourceMapping {
 public:
  // Maps the first `size` bytes of `path`.
  static Result<std::unique_ptr<SourceMapping>> Open(const std::string& path, uint64_t size);
  ~SourceMapping();
  SourceMapping(const SourceMapping&) = delete;
  SourceMapping& operator=(const SourceMapping&) = delete;

  const std::byte* data() const { return data_; }
  // OK while no read went past the file's end and the file still has the size it was mapped
  // with; otherwise kFailedPrecondition naming the file (what was read of it may be zeros).
  Status Check() const;

 private:
  SourceMapping(std::string path, int fd, std::byte* data, uint64_t size, int slot)
      : path_(std::move(path)), fd_(fd), data_(data), size_(size), slot_(slot) {}
  std::string path_;
  int fd_;
  std::byte* data_;
  uint64_t size_;
  int slot_;  // in the handler's table; -1: nothing mapped (an empty file)
};

}  // namespace dcp::convert
