// Removing a directory tree on a POSIX file system (PosixFileSystem's RemoveTree).
#pragma once

#include <string>

#include "dcp/status.h"

namespace dcp::storage {

// Removes `path` and everything below it, never through a link: from the path's last
// component down, each directory is opened relative to its parent without following links
// (O_NOFOLLOW), so a link planted in the tree goes and what it points to stays, and one swapped
// in for a directory while this runs is not followed (the removal fails there). The path's own
// parents are the caller's. A missing path is removed already; "/" and paths ending in "." or
// ".." are refused.
Status RemoveTreeNoFollow(const std::string& path);

}  // namespace dcp::storage
