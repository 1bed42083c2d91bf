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
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/status.h"

namespace dcp::storage {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(std::span<const std::byte> data) = 0;
  // The size the file will have once every Append is done, before the first: a POSIX file takes
  // it at once (sparse), since a tmpfs mounted huge=within_size backs with huge pages only what
  // lies within the file's size (appends of less than 2 MiB would get 4 KiB pages, slower for
  // every later read). A hint: Sync() cuts the file to the bytes appended.
  virtual void WillWrite(uint64_t /*total_bytes*/) {}
  virtual Status Sync() = 0;  // data durable (fdatasync)
  virtual Status Close() = 0;
  virtual const std::string& path() const = 0;
};

struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  friend bool operator==(const ByteRange&, const ByteRange&) = default;
};

// `ranges` sorted by offset, empty ones dropped, and those that overlap or lie at most `gap`
// bytes apart joined into one.
std::vector<ByteRange> MergeRanges(std::vector<ByteRange> ranges, uint64_t gap = 0);

class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  // The ranges about to be read, mostly in ascending order: an object store fetches them
  // ahead, neighbours coalesced into fewer requests, several in parallel; a file system asks
  // the kernel for them a window ahead of the reads (PosixFileSystem). A hint only: reads
  // outside them work as always.
  virtual void WillRead(std::span<const ByteRange> /*ranges*/) {}
  // Reads exactly dst.size() bytes at `offset`; kDataLoss naming the file if it ends early.
  virtual Status ReadAt(uint64_t offset, std::span<std::byte> dst) = 0;
  virtual uint64_t size() const = 0;
  virtual const std::string& path() const = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates `path`, replacing what is there. On a file system a new file: whatever sat at the
  // name (a symlink, a file hard-linked elsewhere) loses only the name, never its content.
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
  // A file whose size the caller knows (a checkpoint's data file, sized in its metadata). The
  // default opens it (its size() is the file's own, for the caller to compare); an object store
  // takes the size as told and asks nothing before the first read (a read past the object's
  // real end fails with kDataLoss naming it).
  virtual Result<std::unique_ptr<ReadableFile>> OpenReadableSized(const std::string& path,
                                                                  uint64_t /*size*/) {
    return OpenReadable(path);
  }
  // The whole file. The default opens it and reads size() bytes; an object store asks once.
  virtual Result<std::string> ReadWhole(const std::string& path);
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

  // Publish `data` at `path` whole: a reader sees the old content or the new, never a mix or
  // nothing. The default writes `path + tmp_suffix`, syncs it, renames it over `path` and
  // syncs the directory; the tmp file is created exclusively, so a symlink planted at its
  // name is never written through, and the rename replaces a symlink at `path` itself, never
  // its target. An object store replaces an object atomically in one request.
  virtual Status WriteAtomic(const std::string& path, std::string_view data,
                             const std::string& tmp_suffix);
  // Compare-and-swap on a small file, for a lock where no flock reaches (an object store).
  // A version names one content as written; `age_seconds`: how long ago it was written, by the
  // store's own clock (no clock of another host compared), -1 when the store cannot say.
  struct Versioned {
    std::string text;
    std::string version;
    double age_seconds = -1;
  };
  // kNotFound when missing; kDataLoss when longer than `max_bytes`.
  virtual Result<Versioned> ReadVersioned(const std::string& path, size_t max_bytes);
  // Writes `data` at `path` only if it still holds `version` ("": only if absent) and returns
  // the new version; kFailedPrecondition when it changed meanwhile, kNotFound when it is gone.
  // S3: If-Match / If-None-Match; POSIX: an exclusive claim, then a rename
  // (storage/posix_cas.h). The default compares, then writes (not atomic).
  virtual Result<std::string> WriteIfVersion(const std::string& path, std::string_view data,
                                             const std::string& version);
  // Removes `path` only if it still holds `version` (kFailedPrecondition otherwise).
  virtual Status RemoveIfVersion(const std::string& path, const std::string& version);
  // Objects, not files: Rename copies every byte (so the manager does not recycle files) and
  // each read is a request (so loads announce their ranges, ReadableFile::WillRead).
  virtual bool IsObjectStore() const { return false; }
  // Whether ranks of one host reading the same bytes have storage deliver them once (a page
  // cache in front of it), so that a load need not broadcast between them. Not on an object
  // store, where every read is a request.
  virtual bool HostSharesReads() const { return !IsObjectStore(); }
  // Whether a lock file here may be held by flock (storage/lease_lock.h); where it may not, or
  // flock fails (ENOLCK), the lock's every change is a WriteIfVersion.
  virtual bool Flocks() const { return !IsObjectStore(); }
  // Whether two threads may open and read files at the same time (a load reads its own chunks
  // on a second thread while the shared ones are exchanged). False unless a file system says so.
  virtual bool ConcurrentReads() const { return false; }
  // The fraction of the bytes of `ranges` of `path` in this host's page cache (so that reading
  // them costs a memory copy), or nullopt where that is unknown or reads cost more than a
  // copy anyway (object stores, throttled test storage). A missing file: 0.
  virtual std::optional<double> CachedFraction(const std::string& /*path*/,
                                               std::span<const ByteRange> /*ranges*/) {
    return std::nullopt;
  }
  // Drops what writes interrupted under `dir` left invisible (an object store's incomplete
  // multipart uploads, which cost storage until aborted). Called by a save holding the
  // directory's lock, and by prune. Nothing to do on a file system.
  virtual Status DropUnfinishedWrites(const std::string& /*dir*/) { return OkStatus(); }
  // Removes `path` and, for a directory, everything below it; a missing path is removed
  // already, "/" and a bucket are refused. The default goes through List and Remove: an object
  // store's objects under the prefix and its directories' unfinished uploads (best effort: a
  // save there drops them too); on a file system each path is first removed as a file, so a
  // link goes, but one it may not remove would be listed through: PosixFileSystem removes
  // from directory descriptors instead and never follows one.
  virtual Status RemoveTree(const std::string& path);
};

FileSystem& PosixFileSystem();

// The file system of a path: the S3 backend for "s3://bucket/prefix" (configured from the
// environment, see storage/s3/s3_config.h), PosixFileSystem() for anything else.
Result<FileSystem*> FileSystemFor(const std::string& path);
// True for "s3://..." paths: they are used as given (never made absolute or resolved).
bool IsObjectStorePath(const std::string& path);

// Whole-file helpers over any FileSystem.
inline Result<std::string> ReadWholeFile(FileSystem& fs, const std::string& path) {
  return fs.ReadWhole(path);
}

std::string JoinPath(const std::string& dir, const std::string& name);
// The directory holding `path` and `path`'s last component, trailing slashes ignored:
// "/a/b/" -> "/a" and "b", "s3://bucket/a" -> "s3://bucket" and "a", "b" -> "" and "b";
// "s3://bucket" -> "" and "" (a bucket is no one's sibling).
std::string ParentPath(const std::string& path);
std::string LastComponent(const std::string& path);
// `path` spelled so that its parent and last component mean what they name: a local path made
// absolute and lexically normal ("ckpt/./a/" -> "/cwd/ckpt/a", "." -> "/cwd"); an object
// store's path as given.
std::string NormalPath(const std::string& path);

}  // namespace dcp::storage
