// A file system that records, per file opened, the ranges announced (WillRead) and read
// (ReadAt): what a load asks of storage, checked by tests.
#pragma once

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "storage/file_system.h"
#include "testfs/forwarding_file_system.h"

namespace dcp::testing {

class RecordingFs : public testfs::ForwardingFileSystem {
 public:
  struct Log {
    std::string path;
    std::vector<storage::ByteRange> announced, read;
  };
  Result<std::unique_ptr<storage::ReadableFile>> OpenReadable(const std::string& p) override {
    DCP_ASSIGN_OR_RETURN(auto f, base().OpenReadable(p));
    std::lock_guard lock(mu_);
    logs_.push_back(std::make_unique<Log>(Log{p, {}, {}}));
    return std::unique_ptr<storage::ReadableFile>(new Recorder(std::move(f), *logs_.back()));
  }
  std::vector<const Log*> LogsOf(const std::string& path) {
    std::lock_guard lock(mu_);
    std::vector<const Log*> out;
    for (const auto& l : logs_) {
      if (l->path == path) out.push_back(l.get());
    }
    return out;
  }

 private:
  class Recorder final : public testfs::ForwardingReadableFile {
   public:
    Recorder(std::unique_ptr<storage::ReadableFile> base, Log& log)
        : ForwardingReadableFile(std::move(base)), log_(log) {}
    void WillRead(std::span<const storage::ByteRange> ranges) override {
      log_.announced.insert(log_.announced.end(), ranges.begin(), ranges.end());
      ForwardingReadableFile::WillRead(ranges);
    }
    Status ReadAt(uint64_t offset, std::span<std::byte> dst) override {
      log_.read.push_back({offset, dst.size()});
      return ForwardingReadableFile::ReadAt(offset, dst);
    }

   private:
    Log& log_;
  };
  std::mutex mu_;  // guards logs_ (thread ranks open files at once)
  std::vector<std::unique_ptr<Log>> logs_;
};

}  // namespace dcp::testing
