// A storage::FileSystem that fails on purpose, for crash tests.
//
// Counts every mutating operation (create, append, sync, close, rename, directory sync,
// remove, mkdir, recycle). FailAt(n) makes operation n (0-based) and every later one fail with
// kUnavailable, as if the process had died there. SimulateCrash() then drops what was not
// made durable: each file written through it is cut back to its last synced length.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "storage/file_system.h"

namespace dcp::testfs {

class FaultFileSystem final : public storage::FileSystem {
 public:
  explicit FaultFileSystem(storage::FileSystem& base) : base_(base) {}

  void FailAt(int64_t op) { fail_at_ = op; }
  int64_t ops() const { return ops_; }
  void SimulateCrash();

  Result<std::unique_ptr<storage::WritableFile>> NewWritableFile(const std::string& path) override;
  Result<std::unique_ptr<storage::WritableFile>> NewExclusiveFile(const std::string& path) override;
  // One operation (a rename); a crash keeps what was overwritten (no cut back).
  Result<std::unique_ptr<storage::WritableFile>> ReuseFile(const std::string& old_path,
                                                           const std::string& path) override;
  Result<std::unique_ptr<storage::ReadableFile>> OpenReadable(const std::string& path) override {
    return base_.OpenReadable(path);
  }
  Status Rename(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& dir) override;
  Status Remove(const std::string& path) override;
  Status Exchange(const std::string& a, const std::string& b) override {
    DCP_RETURN_IF_ERROR(Tick("exchange", a));
    return base_.Exchange(a, b);
  }
  Status CreateDirs(const std::string& dir) override;
  Result<std::vector<std::string>> List(const std::string& dir) override { return base_.List(dir); }
  Result<uint64_t> FileSize(const std::string& path) override { return base_.FileSize(path); }

  // Counts one mutating operation; the injected failure when its turn has come.
  Status Tick(const char* op, const std::string& path);
  void RecordSynced(const std::string& path, uint64_t length);

 private:
  storage::FileSystem& base_;
  std::mutex mu_;  // guards the counters and synced_
  int64_t ops_ = 0;
  int64_t fail_at_ = -1;
  std::map<std::string, uint64_t> synced_;  // path -> durable length
};

}  // namespace dcp::testfs
