// The FileSystem of s3:// paths: objects of an S3-compatible store seen as files.
//
// A "directory" is a key prefix: CreateDirs, SyncDir and removing a directory are no-ops,
// List is a delimited listing. A WritableFile is a multipart upload whose parts go out in
// parallel while the caller appends; it becomes visible, whole, only when Sync() completes
// it (a small file is one PUT then). WriteAtomic is one PUT: objects are replaced atomically,
// so readers see the old or the new content without a rename. An exclusive file is a
// conditional write (If-None-Match: *). Reads are ranged GETs, split into parallel parts
// when large. Rename is a server-side copy then a delete: not atomic, and never used on the
// commit path (and the manager does not recycle files here: IsObjectStore()).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "storage/file_system.h"
#include "storage/s3/fetch_buffers.h"
#include "storage/s3/s3_client.h"

namespace dcp::storage::s3 {

class TaskPool;

class S3FileSystem final : public FileSystem {
 public:
  explicit S3FileSystem(S3Client& client);
  ~S3FileSystem() override;

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  Result<std::unique_ptr<WritableFile>> NewExclusiveFile(const std::string& path) override;
  Result<std::unique_ptr<WritableFile>> ReuseFile(const std::string& old_path,
                                                  const std::string& path) override;
  Result<std::unique_ptr<ReadableFile>> OpenReadable(const std::string& path) override;
  Result<std::unique_ptr<ReadableFile>> OpenReadableSized(const std::string& path,
                                                          uint64_t size) override;
  Result<std::string> ReadWhole(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string&) override { return OkStatus(); }
  Status Remove(const std::string& path) override;
  Status CreateDirs(const std::string& dir) override;
  Result<std::vector<std::string>> List(const std::string& dir) override;
  Result<uint64_t> FileSize(const std::string& path) override;
  Status WriteAtomic(const std::string& path, std::string_view data,
                     const std::string& tmp_suffix) override;
  Result<Versioned> ReadVersioned(const std::string& path, size_t max_bytes) override;
  Result<std::string> WriteIfVersion(const std::string& path, std::string_view data,
                                     const std::string& version) override;
  Status RemoveIfVersion(const std::string& path, const std::string& version) override;
  bool IsObjectStore() const override { return true; }
  Status DropUnfinishedWrites(const std::string& dir) override;

  S3Client& client() { return client_; }
  TaskPool& pool() { return *pool_; }
  // Bytes of ranged GET buffers alive across this file system's readable files (read ahead,
  // not yet read or evicted): what reads announced may start before they come.
  std::atomic<uint64_t>& fetched_bytes() { return fetched_bytes_; }
  FetchBuffers& fetch_buffers() { return fetch_buffers_; }

 private:
  S3Client& client_;
  // Both outlive the pool's tasks, whose GETs count their bytes and give their buffers back.
  std::atomic<uint64_t> fetched_bytes_{0};
  FetchBuffers fetch_buffers_;
  std::unique_ptr<TaskPool> pool_;
};

// The process's S3 file system over DefaultS3Client() (configured from the environment).
Result<FileSystem*> DefaultS3FileSystem();

}  // namespace dcp::storage::s3
