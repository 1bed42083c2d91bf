// The files of saves: what a committed save no longer needs, and what dead or failed saves
// left (save.cc). Best effort where said: leftovers waste space, nothing more.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "metadata/metadata.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

// After a commit: data files of earlier saves are no longer referenced; remove them, tmp
// metadata of crashed saves, and (global commits) per-rank metadata that the global file
// now hides. With `only_rank` >= 0, only that rank's data files. Best effort: leftovers
// waste space, nothing more. `listed`: the directory's names as listed under the lock before
// this save wrote (RemoveFilesOfDeadSaves), so as not to list it again; what the save added
// since is its own and kept.
void CollectGarbage(storage::FileSystem& fs, const std::string& dir,
                    const std::unordered_set<std::string>& keep, int only_rank,
                    const std::vector<std::string>* listed = nullptr);

// The names of the data files `md` names.
std::unordered_set<std::string> FileNames(const metadata::Metadata& md);

// Before writing, with the directory's lock held: data files that no committed metadata
// names belong to saves that are dead (a live one would hold the lock), e.g. a save that
// failed on a full disk and could not remove its files. Removing them first means such
// leftovers never make the next save fail too; on an object store, their incomplete
// multipart uploads are aborted. Nothing is removed when the committed
// metadata cannot be read. Returns the names listed (none when the listing failed).
std::optional<std::vector<std::string>> RemoveFilesOfDeadSaves(storage::FileSystem& fs,
                                                               const std::string& dir);

// Whether the data files of a save whose commit failed may be removed: yes unless the
// directory's metadata names this save after all (a commit that renamed, then failed).
bool FilesDisposable(storage::FileSystem& fs, const std::string& dir, uint64_t save_id);

}  // namespace dcp::checkpoint
