// The file system seen by the storage layer: a small interface so tests can inject faults.
//
// PosixFileSystem is the real one. Durability protocol used by callers: data written and
// Sync()ed, then metadata written to a tmp name, Sync()ed, Rename()d over the final name,
// and SyncDir() of the directory, so that after a crash either the old or the new metadata
// is present, never a mix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcp/status.h"

namespace dcp::storage {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(std::span<const std::byte> data) = 0;
  virtual Status Sync() = 0;  // data durable (fdatasync)
  virtual Status Close() = 0;
  virtual const std::string& path() const = 0;
};

class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  // Reads exactly dst.size() bytes at `offset`; kDataLoss naming the file if it ends early.
  virtual Status ReadAt(uint64_t offset, std::span<std::byte> dst) = 0;
  virtual uint64_t size() const = 0;
  virtual const std::string& path() const = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates or truncates.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // Creates `path` only if it does not exist (O_EXCL): kFailedPrecondition when it does.
  // The default checks then creates (not atomic); PosixFileSystem is atomic.
  virtual Result<std::unique_ptr<WritableFile>> NewExclusiveFile(const std::string& path);
  // File recycling: renames `old_path` (a retired file nothing else needs) to `path` and opens
  // it to be overwritten from offset 0, so writes land in blocks already allocated; Sync()
  // cuts the file to the bytes written. kNotFound when `old_path` does not exist, or is not a
  // regular file with one link (a hard-linked snapshot, a symlink: then only the name
  // `old_path` is removed, never what it shares or points to). The default removes `old_path`
  // and creates a new file.
  virtual Result<std::unique_ptr<WritableFile>> ReuseFile(const std::string& old_path,
                                                          const std::string& path);
  virtual Result<std::unique_ptr<ReadableFile>> OpenReadable(const std::string& path) = 0;
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  virtual Status SyncDir(const std::string& dir) = 0;
  // A file, or an empty directory.
  virtual Status Remove(const std::string& path) = 0;
  // Atomically swaps two existing paths (files or directories): after it, `a` names what `b`
  // named and the other way round (Linux renameat2 RENAME_EXCHANGE). File systems that cannot
  // return an error and change nothing; callers fall back to two renames.
  virtual Status Exchange(const std::string& a, const std::string& b) {
    return FailedPrecondition("exchanging " + a + " and " + b +
                              ": not supported by this file system");
  }
  virtual Status CreateDirs(const std::string& dir) = 0;
  // Names (not paths) of the entries of `dir`.
  virtual Result<std::vector<std::string>> List(const std::string& dir) = 0;
  // kNotFound when missing.
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;
};

FileSystem& PosixFileSystem();

// Whole-file helpers over any FileSystem.
Result<std::string> ReadWholeFile(FileSystem& fs, const std::string& path);
// tmp + Sync + Rename + SyncDir: `path` holds either its old content or `data`, never a mix.
// The tmp file is created exclusively, so a symlink planted at its name is never written
// through, and the rename replaces a symlink at `path` itself, never its target.
Status WriteFileAtomic(FileSystem& fs, const std::string& path, std::string_view data,
                       const std::string& tmp_suffix);

std::string JoinPath(const std::string& dir, const std::string& name);

}  // namespace dcp::storage
