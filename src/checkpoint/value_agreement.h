// A save stores one copy of a bytes entry (a non-tensor value), however many ranks hold it, so
// the ranks holding one name must hold the same bytes, or all but one rank's value would be
// lost without a word. Checked inside the save's first exchange by one hash per rank, and only
// when those differ by a second all-gather of the names and digests of each distinct set. (So
// ranks holding values under per-rank names, e.g. "rng.<rank>", pay that second all-gather on
// every save: one list per rank, of its values' names and 8-byte digests.)
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "dcp/comm.h"
#include "dcp/state_dict.h"
#include "dcp/status.h"

namespace dcp::checkpoint {

// A hash of every bytes entry of `sd` (names and payloads, by name); 0 without any.
uint64_t ValuesHash(const StateDict& sd);

// Every rank calls it with the gathered ValuesHash of every rank (`hashes`). OK when equal
// on every rank; else the same kInvalidArgument on every rank, naming the first entry (by
// name) whose bytes differ and the ranks on each side, when one does. Adds what it exchanged
// to *exchange_bytes.
Status CheckValuesAgree(Comm& comm, const StateDict& sd, std::span<const uint64_t> hashes,
                        const std::string& dir, uint64_t* exchange_bytes);

}  // namespace dcp::checkpoint
