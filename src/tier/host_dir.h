// One host's directory of a memory tier (tier/memory_tier.h): its step directories, what they
// hold, and checks of the files in them. Local files only: the tier is the host's tmpfs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcp/status.h"
#include "metadata/metadata.h"
#include "storage/file_system.h"
#include "tier/file_transfer.h"
#include "tier/tier_plan.h"

namespace dcp::tier {

storage::FileSystem& Local();
// A host name as one path component.
std::string PathSafe(std::string s);
// A digest of metadata bytes, never 0 (0: no metadata).
uint64_t Digest(std::string_view raw);
// The step directories of a host directory, newest first.
std::vector<std::pair<int64_t, std::string>> StepDirs(const std::string& host_dir);
uint64_t DirBytes(const std::string& dir);
void RemoveTree(const std::string& dir);
// What a host directory holds; with `tidy`, pieces of interrupted transfers and sparse copies
// left by a restore are removed. A sparse copy is never counted as a copy of its file.
Inventory ScanHost(const std::string& host_dir, bool tidy);
// In a step directory: a restore passed this copy over (MemoryTier::MarkPassedOver); no
// inventory counts it.
inline constexpr std::string_view kPassedOverName = "dcp.passed-over";
// The metadata of a step directory and its bytes.
Result<std::pair<metadata::Metadata, std::string>> ReadStepMetadata(const std::string& dir);
// What checks the files of a transfer list of the step `md` describes as they arrive
// (TransferFiles): the stored ranges each transfer carries, against `md` (which must outlive
// it); a file `md` does not name cannot be received. The metadata is walked once, here.
CheckReceived ReceiveChecks(const metadata::Metadata& md);

}  // namespace dcp::tier
