// The on-disk state of a manager's root: which step directories are complete, the `latest`
// record, removing a step safely, the recycle directory; `dcp ls`'s views (inspect_root and
// inspect_memory_tier are implemented here).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dcp/status.h"
#include "storage/file_system.h"

namespace dcp::manager {

// Whether `dir` holds a complete checkpoint: committed metadata that decodes, and every data
// file it names present with its recorded size (in its base's directory for a reference).
// OK, or why not. With `bases`, the steps whose files it references (sibling step
// directories; other bases are not steps of the root).
Status CheckComplete(storage::FileSystem& fs, const std::string& dir,
                     std::set<int64_t>* bases = nullptr);

// The steps whose files the committed checkpoint in `dir` references.
Result<std::set<int64_t>> ReadStepBases(storage::FileSystem& fs, const std::string& dir);

// True when `dir` holds no committed metadata at all (a save that never committed, or a step
// whose removal was cut short): only such directories are cleaned up.
bool HasNoMetadata(storage::FileSystem& fs, const std::string& dir);

struct Scan {
  struct Entry {
    int64_t step;
    Status status;            // OK: complete
    std::set<int64_t> bases;  // steps whose files it references
  };
  std::vector<Entry> entries;  // ascending
  std::vector<std::string> latest_tmps;
  std::optional<int64_t> latest_record;
};

// What ROOT/latest says; nullopt when missing, damaged or too long to be a number.
std::optional<int64_t> ReadLatestRecord(storage::FileSystem& fs, const std::string& root);
Result<Scan> ScanRoot(storage::FileSystem& fs, const std::string& root);

// Removes a step directory, metadata first; with `recycle_dir`, tensor data files move there.
Status RemoveStepDir(storage::FileSystem& fs, const std::string& dir,
                     const std::string& recycle_dir);

// Rank 0 at Open: the recycle directory holds only files of ranks of this job (or is gone).
void TidyRecycleDir(storage::FileSystem& fs, const std::string& recycle_dir, bool on, int world);

// Steps as rank 0 broadcasts them.
std::string EncodeSteps(const std::vector<int64_t>& steps);
std::vector<int64_t> DecodeSteps(const std::string& d);

}  // namespace dcp::manager
