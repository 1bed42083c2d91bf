// A file system that passes calls to another: tests derive from it and override only the calls
// they change (a gate, a fault, a planted change), instead of forwarding each by hand.
// ReuseFile, WriteAtomic and RemoveTree keep FileSystem's own implementations, which go through
// this object's calls, so an override applies to them too; the versioned calls (the lease lock's
// compare-and-swap) go to the base whole, atomic as it makes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "storage/file_system.h"

namespace dcp::testfs {

// A file that passes calls to another, for a ForwardingFileSystem's OpenReadable to wrap: tests
// override the calls they watch or change and call the base's.
class ForwardingReadableFile : public storage::ReadableFile {
 public:
  explicit ForwardingReadableFile(std::unique_ptr<storage::ReadableFile> base)
      : base_(std::move(base)) {}
  void WillRead(std::span<const storage::ByteRange> ranges) override { base_->WillRead(ranges); }
  Status ReadAt(uint64_t offset, std::span<std::byte> dst) override {
    return base_->ReadAt(offset, dst);
  }
  uint64_t size() const override { return base_->size(); }
  const std::string& path() const override { return base_->path(); }

 private:
  std::unique_ptr<storage::ReadableFile> base_;
};

class ForwardingFileSystem : public storage::FileSystem {
 public:
  explicit ForwardingFileSystem(storage::FileSystem& base = storage::PosixFileSystem())
      : base_(base) {}

  Result<std::unique_ptr<storage::WritableFile>> NewWritableFile(const std::string& p) override {
    return base_.NewWritableFile(p);
  }
  Result<std::unique_ptr<storage::WritableFile>> NewExclusiveFile(const std::string& p) override {
    return base_.NewExclusiveFile(p);
  }
  Result<std::unique_ptr<storage::ReadableFile>> OpenReadable(const std::string& p) override {
    return base_.OpenReadable(p);
  }
  Status Rename(const std::string& a, const std::string& b) override { return base_.Rename(a, b); }
  Status SyncDir(const std::string& d) override { return base_.SyncDir(d); }
  Status Remove(const std::string& p) override { return base_.Remove(p); }
  Status Exchange(const std::string& a, const std::string& b) override {
    return base_.Exchange(a, b);
  }
  Status CreateDirs(const std::string& d) override { return base_.CreateDirs(d); }
  Result<std::vector<std::string>> List(const std::string& d) override { return base_.List(d); }
  Result<uint64_t> FileSize(const std::string& p) override { return base_.FileSize(p); }
  bool IsObjectStore() const override { return base_.IsObjectStore(); }
  bool Flocks() const override { return base_.Flocks() && !IsObjectStore(); }
  bool HostSharesReads() const override { return base_.HostSharesReads() && !IsObjectStore(); }
  Result<Versioned> ReadVersioned(const std::string& p, size_t max_bytes) override {
    return base_.ReadVersioned(p, max_bytes);
  }
  Result<std::string> WriteIfVersion(const std::string& p, std::string_view data,
                                     const std::string& version) override {
    return base_.WriteIfVersion(p, data, version);
  }
  Status RemoveIfVersion(const std::string& p, const std::string& version) override {
    return base_.RemoveIfVersion(p, version);
  }
  Status DropUnfinishedWrites(const std::string& d) override {
    return base_.DropUnfinishedWrites(d);
  }

 protected:
  storage::FileSystem& base() { return base_; }

 private:
  storage::FileSystem& base_;
};

}  // namespace dcp::testfs
