// Internal entry points of the checkpoint manager, for tests: a manager over any FileSystem.
#pragma once

#include <memory>
#include <string>

#include "dcp/manager.h"
#include "storage/file_system.h"

namespace dcp::manager {

// A CheckpointManager doing every storage operation (saves, `latest`, retention, clean-up)
// through `fs`, which must outlive it. The lock file is taken through POSIX calls (flock).
std::unique_ptr<CheckpointManager> NewManager(const std::string& root, ManagerOptions opts,
                                              storage::FileSystem& fs);

// The name of the lock file and of the latest record under a root.
inline constexpr const char* kLockName = ".dcp-manager.lock";
inline constexpr const char* kLatestName = "latest";
// Retired data files waiting to be overwritten by the next save (ManagerOptions::recycle_files).
inline constexpr const char* kRecycleName = ".recycle";
// In a step directory: the step was found corrupt by a load and is no longer complete (its
// content: why). A person deletes it, or the step, after looking.
inline constexpr const char* kBadName = "dcp.bad";

}  // namespace dcp::manager
