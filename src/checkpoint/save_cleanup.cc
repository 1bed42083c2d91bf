#include "checkpoint/save_cleanup.h"

#include <cstdio>
#include <optional>
#include <span>
#include <vector>

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

// The metadata of `path` when it may reference other directories (format version 4 on, read
// from its header first: older metadata never does); nullopt when it cannot, or `path` holds
// no metadata.
Result<std::optional<metadata::Metadata>> ReferencingMetadata(storage::FileSystem& fs,
                                                              const std::string& path) {
  using None = std::optional<metadata::Metadata>;
  auto file = fs.OpenReadable(path);
  if (!file.ok()) {
    if (file.status().code() == StatusCode::kNotFound) return None();
    return file.status();
  }
  std::string header(metadata::kHeaderSize, '\0');
  if ((*file)->size() < header.size()) return None();
  DCP_RETURN_IF_ERROR(
      (*file)->ReadAt(0, std::as_writable_bytes(std::span(header.data(), header.size()))));
  if (header.compare(0, sizeof(metadata::kMagic),
                     std::string_view(metadata::kMagic, sizeof(metadata::kMagic))) != 0 ||
      metadata::HeaderVersion(header) < metadata::kFirstReferenceVersion) {
    return None();
  }
  DCP_ASSIGN_OR_RETURN(std::string data, storage::ReadWholeFile(fs, path));
  DCP_ASSIGN_OR_RETURN(metadata::Metadata md, metadata::Decode(data));
  return std::optional<metadata::Metadata>(std::move(md));
}

// The files of `dir` that incremental checkpoints in its sibling directories reference (their
// metadata names `dir` as a file's base): never garbage, whatever `dir`'s own metadata says.
// Looked for only when `dir` has data files to remove (a checkpoint saved over in place), and
// only in siblings whose metadata can reference (version 4): a save into a fresh directory
// never lists its siblings, one over an old one reads their headers. Nullopt when a sibling
// directory's metadata could not be read: then nothing may be removed.
std::optional<std::unordered_set<std::string>> ReferencedBySiblings(storage::FileSystem& fs,
                                                                    const std::string& dir_in) {
  std::unordered_set<std::string> out;
  const std::string dir = storage::NormalPath(dir_in);
  const std::string parent = storage::ParentPath(dir), me = storage::LastComponent(dir);
  if (me.empty()) return out;
  auto siblings = fs.List(parent.empty() ? std::string(".") : parent);
  if (!siblings.ok()) return std::nullopt;
  for (const std::string& s : *siblings) {
    if (s == me) continue;
    const std::string path = storage::JoinPath(parent, s);
    // Not a directory ("latest", a lock file), or one this process cannot list (no save of
    // its job wrote it): nothing there references this directory.
    if (auto names = fs.List(path);
        !names.ok() && names.status().code() == StatusCode::kFailedPrecondition) {
      continue;
    }
    auto md = ReferencingMetadata(fs, storage::JoinPath(path, std::string(kMetadataName)));
    if (!md.ok()) {
      std::fprintf(stderr,
                   "dcp: %s: files of earlier saves kept: cannot tell whether %s references "
                   "them (%s)\n",
                   dir_in.c_str(), path.c_str(), md.status().message().c_str());
      return std::nullopt;
    }
    if (!*md) continue;
    for (const auto& f : (*md)->files) {
      if (f.base == me) out.insert(f.name);
    }
  }
  return out;
}

// Removes the garbage among `names` of `dir` (those `remove` chooses), except files a sibling
// references.
template <typename F>
void RemoveGarbage(storage::FileSystem& fs, const std::string& dir,
                   const std::vector<std::string>& names, F&& remove) {
  std::vector<std::string> victims;
  bool data = false;
  for (const std::string& n : names) {
    if (!remove(n)) continue;
    victims.push_back(n);
    data = data || IsDcpDataFileName(n);
  }
  std::unordered_set<std::string> referenced;
  if (data) {
    auto r = ReferencedBySiblings(fs, dir);
    if (!r) return;
    referenced = std::move(*r);
  }
  for (const std::string& n : victims) {
    if (!referenced.count(n)) (void)fs.Remove(storage::JoinPath(dir, n));
  }
}

}  // namespace

// After a commit: data files of earlier saves are no longer referenced; remove them, tmp
// metadata of crashed saves, and (global commits) per-rank metadata that the global file
// now hides. With `only_rank` >= 0, only that rank's data files. Best effort: leftovers
// waste space, nothing more. `listed`: the directory's names as listed under the lock before
// this save wrote (RemoveFilesOfDeadSaves), so as not to list it again; what the save added
// since is its own and kept.
void CollectGarbage(storage::FileSystem& fs, const std::string& dir,
                    const std::unordered_set<std::string>& keep, int only_rank,
                    const std::vector<std::string>* listed) {
  Result<std::vector<std::string>> names =
      listed ? Result<std::vector<std::string>>(*listed) : fs.List(dir);
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
  RemoveGarbage(fs, dir, *names, [&](const std::string& n) {
    if (keep.count(n)) return false;
    return only_rank < 0 ? IsGarbageName(n)
                         : IsDcpDataFileName(n) && n.find(suffix) != std::string::npos;
  });
}

std::unordered_set<std::string> FileNames(const metadata::Metadata& md) {
  std::unordered_set<std::string> names;
  for (const auto& f : md.files) {
    if (f.base.empty()) names.insert(f.name);  // a base's files are not this directory's
  }
  return names;
}

// Before writing, with the directory's lock held: data files that no committed metadata
// names belong to saves that are dead (a live one would hold the lock), e.g. a save that
// failed on a full disk and could not remove its files. Removing them first means such
// leftovers never make the next save fail too; on an object store, their incomplete
// multipart uploads are aborted. Nothing is removed when the committed
// metadata cannot be read. Returns the names listed (none when the listing failed).
std::optional<std::vector<std::string>> RemoveFilesOfDeadSaves(storage::FileSystem& fs,
                                                               const std::string& dir) {
  // An object store's uploads that dead saves left incomplete (invisible, but billed).
  (void)fs.DropUnfinishedWrites(dir);
  auto names = fs.List(dir);
  if (!names.ok()) return std::nullopt;
  std::unordered_set<std::string> keep;
  for (const std::string& n : *names) {
    if (n != kMetadataName && ParseRankMetadataName(n) < 0) continue;
    auto data = storage::ReadWholeFile(fs, storage::JoinPath(dir, n));
    if (!data.ok()) return *names;
    auto md = metadata::Decode(*data);
    if (!md.ok()) return *names;
    keep.merge(FileNames(*md));
  }
  RemoveGarbage(fs, dir, *names,
                [&](const std::string& n) { return !keep.count(n) && IsGarbageName(n); });
  return std::move(names).value();
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
