// Compare-and-swap of a small file on a POSIX file system with no lock to rely on (no flock
// across the hosts sharing it): the versioned writes the lease lock needs there.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "dcp/status.h"

namespace dcp::storage {

// The version of a small file's content (its hash and size: a lock's text changes with every
// write, its heartbeat included).
std::string ContentVersion(std::string_view text);

// Writes `data` at `path` only if its content still has `version` ("": only if absent), as
// FileSystem::WriteIfVersion. The file is replaced by a rename, never written in place nor
// left absent. A change from a version is made by the holder of that version's claim, a file
// beside it created exclusively (of two callers that saw one version, one gets it) and then
// checked against the file; a claim left by a writer that died is passed over once this process
// has seen it unchanged for 10 s (or at once when the file system's clock makes it 10 min old).
Result<std::string> PosixWriteIfVersion(const std::string& path, std::string_view data,
                                        const std::string& version);
// Removes `path` only if its content still has `version`, under the same claim.
Status PosixRemoveIfVersion(const std::string& path, const std::string& version);

// Removes the claims beside `path` on versions it no longer has (writers that died mid-change
// left them; a version never comes back, so none can serve again); one on its current version
// is kept. Every successful change ends with it.
void SweepClaims(const std::string& path);

// Tests: how long a claim must be seen unchanged to be stale (0: 10 s).
std::chrono::milliseconds& ClaimObservationForTest();

}  // namespace dcp::storage
