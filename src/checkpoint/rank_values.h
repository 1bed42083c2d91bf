// Non-tensor values that differ between ranks under one name (a data loader's position per
// rank, tokens seen): a save keeps every rank's value, each under a name of its own, and a load
// gives each rank its own back when the job has the saving job's ranks, else the lowest rank's,
// saying so. (One copy per name, as torch keeps, would lose all but one silently.)
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcp/state_dict.h"
#include "metadata/metadata.h"

namespace dcp::checkpoint {

// "<fqn>.__dcp_rank_<rank>": rank `rank`'s value of `fqn`.
std::string PerRankValueName(std::string_view fqn, int rank);
// (fqn, rank) of a per-rank value name; nullopt for any other name.
std::optional<std::pair<std::string, int>> ParsePerRankValueName(std::string_view name);

// `sd` with this rank's values among `names` (sorted) renamed PerRankValueName(name, rank),
// paths kept; tensors are the same views.
StateDict WithPerRankValues(const StateDict& sd, const std::vector<std::string>& names, int rank);

// Renames in `md` the per-rank value this rank loads for each name saved per rank: its own
// when the checkpoint was saved by `world` ranks and holds this rank's value, else the lowest
// rank's (one line per such name in *warnings). The other ranks' values keep their names.
void PickRankValues(metadata::Metadata& md, int rank, int world,
                    std::vector<std::string>* warnings);

}  // namespace dcp::checkpoint
