// A save stores one copy of a bytes entry (a non-tensor value), however many ranks hold it, so
// the ranks holding one name must hold the same bytes, or all but one rank's value would be
// lost without a word (the save then keeps every rank's, checkpoint/rank_values.h). Checked inside
// the save's first exchange by one hash per rank, and only when those differ by a second all-gather
// of the names and digests of each distinct set. A save on a cached plan hashes only the values
// more than one rank holds, so values under per-rank names (e.g. "rng.<rank>") need that second
// all-gather only when the plan changes (or when ranks hold different sets of shared names, e.g.
// stage-local values of pipeline stages: then on every save).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dcp/comm.h"
#include "dcp/state_dict.h"
#include "dcp/status.h"
#include "planner/save_plan.h"

namespace dcp::checkpoint {

// A hash of the bytes entries of `sd` (names and payloads, by name): of all of them, or, with
// `only` (sorted), of those named there. The low bit says which (1: `only`).
uint64_t ValuesHash(const StateDict& sd, const std::vector<std::string>* only = nullptr);

// The names of bytes entries more than one rank holds, sorted, from a save's distinct local
// plans and the ranks holding each: kept with the cached global plan, a later save on that plan
// hashes only these (values under per-rank names, e.g. "rng.<rank>", then need no second
// all-gather, as long as every rank holds the same shared names).
std::vector<std::string> SharedValueNames(const std::vector<planner::LocalSavePlan>& plans,
                                          const std::vector<std::vector<int>>& holders);

// Every rank calls it with the gathered ValuesHash of every rank (`hashes`), hashed over the
// cached plan's SharedValueNames on a plan cache hit (`cache_hit`), else over all values. OK
// when equal on every rank. Else, with `differing`, the names whose bytes differ between ranks
// (sorted, the same on every rank; the save keeps them per rank, checkpoint/rank_values.h);
// without it, the same kInvalidArgument on every rank naming the first such entry and the
// ranks on each side. Adds what it exchanged to *exchange_bytes.
Status CheckValuesAgree(Comm& comm, const StateDict& sd, std::span<const uint64_t> hashes,
                        bool cache_hit, const std::string& dir, uint64_t* exchange_bytes,
                        std::vector<std::string>* differing = nullptr);

}  // namespace dcp::checkpoint
