#include "checkpoint/save_cleanup.h"

#include <cstdio>

#include "checkpoint/names.h"
#include "metadata/codec.h"
#include "storage/data_files.h"

namespace dcp::checkpoint {
namespace {

// Files only saves create, none a committed checkpoint needs unless its metadata names them:
// data files, temporary metadata, stale locks.
bool IsGarbageName(const std::string& n) {
  return IsDcpDataFileName(n) || IsMetadataTmpName(n) || IsStaleLockName(n);
}

}  // namespace

// After a commit: data files of earlier saves are no longer referenced; remove them, tmp
// metadata of crashed saves, and (global commits) per-rank metadata that the global file
// now hides. With `only_rank` >= 0, only that rank's data files. Best effort: leftovers
// waste space, nothing more.
void CollectGarbage(storage::FileSystem& fs, const std::string& dir,
                    const std::unordered_set<std::string>& keep, int only_rank) {
  auto names = fs.List(dir);
  if (!names.ok()) return;
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "-r%05d.", only_rank);
  // Rank metadata first: a complete rank set wins over the global metadata at load, so it
  // must not outlive the data files it names; if one cannot be removed, no data file goes.
  if (only_rank < 0) {
    for (const std::string& n : *names) {
      if (ParseRankMetadataName(n) >= 0 && !fs.Remove(storage::JoinPath(dir, n)).ok()) return;
    }
  }
  for (const std::string& n : *names) {
    if (keep.count(n)) continue;
    if (only_rank < 0 ? IsGarbageName(n)
                      : IsDcpDataFileName(n) && n.find(suffix) != std::string::npos) {
      (void)fs.Remove(storage::JoinPath(dir, n));
    }
  }
}

std::unordered_set<std::string> FileNames(const metadata::Metadata& md) {
  std::unordered_set<std::string> names;
  for (const auto& f : md.files) names.insert(f.name);
  return names;
}

// Before writing, with the directory's lock held: data files that no committed metadata
// names belong to saves that are dead (a live one would hold the lock), e.g. a save that
// failed on a full disk and could not remove its files. Removing them first means such
// leftovers never make the next save fail too; on an object store, their incomplete
// multipart uploads are aborted. Nothing is removed when the committed
// metadata cannot be read.
void RemoveFilesOfDeadSaves(storage::FileSystem& fs, const std::string& dir) {
  // An object store's uploads that dead saves left incomplete (invisible, but billed).
  (void)fs.DropUnfinishedWrites(dir);
  auto names = fs.List(dir);
  if (!names.ok()) return;
  std::unordered_set<std::string> keep;
  for (const std::string& n : *names) {
    if (n != kMetadataName && ParseRankMetadataName(n) < 0) continue;
    auto data = storage::ReadWholeFile(fs, storage::JoinPath(dir, n));
    if (!data.ok()) return;
    auto md = metadata::Decode(*data);
    if (!md.ok()) return;
    keep.merge(FileNames(*md));
  }
  for (const std::string& n : *names) {
    if (keep.count(n)) continue;
    if (IsGarbageName(n)) (void)fs.Remove(storage::JoinPath(dir, n));
  }
}

// Whether the data files of a save whose commit failed may be removed: yes unless the
// directory's metadata names this save after all (a commit that renamed, then failed).
bool FilesDisposable(storage::FileSystem& fs, const std::string& dir, uint64_t save_id) {
  auto data = storage::ReadWholeFile(fs, storage::JoinPath(dir, std::string(kMetadataName)));
  if (!data.ok()) return data.status().code() == StatusCode::kNotFound;
  auto md = metadata::Decode(*data);
  return md.ok() && md->save_id != save_id;
}

}  // namespace dcp::checkpoint
