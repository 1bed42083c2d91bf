// Save, through the planner -> storage -> metadata layers, on any Comm.
#pragma once

#include <functional>
#include <string>

#include "dcp/checkpoint.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

// What each rank contributes to a save's first exchange: its plan hash, the digest of its
// cached plan (0: none), a hash of its non-tensor values, a candidate save id and a hash of its
// incremental base (0: none). dcp simulate counts exchange bytes with it.
inline constexpr uint64_t kSaveHelloBytes = 5 * 8;

// Callers' checks inside a save.
struct SaveHooks {
  // Run on every rank once its data files are written and durable, before the commit: an
  // error on any rank fails the save on every rank, commits nothing (the previous checkpoint
  // in `dir` stays loadable) and leaves this save's files to be removed (at once with
  // collectives; by the next save in `dir` without). `dcp convert` checks there that its source
  // did not change while it was read.
  std::function<Status()> before_commit;
};

Result<SaveResult> Save(const StateDict& sd, const std::string& dir, const SaveOptions& opts,
                        storage::FileSystem& fs, const SaveHooks* hooks = nullptr);

// In place of Save on a rank whose part failed before it could save (an async save's staging,
// its caller's preparation): takes part in the save's first exchange with `why`, so that every
// rank's Save returns the same error, naming this rank, instead of waiting for it. Returns it.
Status JoinSaveAsFailed(const std::string& dir, const SaveOptions& opts, const Status& why);

// Forgets every cached global plan (tests).
void ClearSavePlanCache();

}  // namespace dcp::checkpoint
