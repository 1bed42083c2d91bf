// Directories on a POSIX file system: reading one's names, removing a tree (PosixFileSystem's List
// and RemoveTree).
#pragma once

#include <dirent.h>

#include <string>
#include <vector>

#include "dcp/status.h"

namespace dcp::storage {

// Removes `path` and everything below it, never through a link: from the path's last
// component down, each directory is opened relative to its parent without following links
// (O_NOFOLLOW), so a link planted in the tree goes and what it points to stays, and one swapped
// in for a directory while this runs is not followed (the removal fails there). The path's own
// parents are the caller's. A missing path is removed already; "/" and paths ending in "." or
// ".." are refused.
Status RemoveTreeNoFollow(const std::string& path);

// The names in the open directory `d` but "." and ".."; `shown` names it in errors. A listing
// cut short by an error (EIO on a failing disk, a directory gone stale on NFS) is an error, not
// fewer names: a scan would miss files (a step that looks incomplete).
Result<std::vector<std::string>> ReadDirectoryNames(DIR* d, const std::string& shown);

// Whether RemoveTree may take the tree whose last component is `name`: not "/", a bucket, or a
// path ending in "." or "..".
Status CheckRemovableTree(const std::string& path, const std::string& name);

}  // namespace dcp::storage
