#include "checkpoint/value_agreement.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/checksum.h"
#include "core/wire.h"

namespace dcp::checkpoint {
namespace {

// At most this many ranks are listed per side of a difference.
constexpr size_t kRanksNamed = 8;

std::string RankList(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size() && i < kRanksNamed; ++i) {
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  if (ranks.size() > kRanksNamed) s += ", ... (" + std::to_string(ranks.size()) + " ranks)";
  return s + "]";
}

// (name, digest of its bytes) of every bytes entry, by name: ranks that added the same values
// in another order list them alike.
std::string ListValues(const StateDict& sd, const std::vector<std::string>* only = nullptr) {
  std::vector<std::pair<std::string_view, uint64_t>> values;
  for (const StateEntry& e : sd.entries()) {
    if (e.kind != StateEntry::Kind::kBytes) continue;
    if (only && !std::binary_search(only->begin(), only->end(), e.fqn)) continue;
    values.emplace_back(e.fqn, Xxh3(e.bytes));
  }
  std::sort(values.begin(), values.end());
  std::string listed;
  wire::Writer w(listed);
  for (const auto& [name, digest] : values) {
    w.String(name);
    w.Fixed64(digest);
  }
  return listed;
}

}  // namespace

uint64_t ValuesHash(const StateDict& sd, const std::vector<std::string>* only) {
  const std::string listed = ListValues(sd, only);
  return (Xxh3(std::as_bytes(std::span(listed))) & ~uint64_t{1}) | (only ? 1 : 0);
}

std::vector<std::string> SharedValueNames(const std::vector<planner::LocalSavePlan>& plans,
                                          const std::vector<std::vector<int>>& holders) {
  std::map<std::string_view, size_t> ranks_holding;
  for (size_t c = 0; c < plans.size(); ++c) {
    for (const planner::SaveItem& it : plans[c].items) {
      if (it.is_bytes) ranks_holding[it.fqn] += holders[c].size();
    }
  }
  std::vector<std::string> shared;
  for (const auto& [name, n] : ranks_holding) {
    if (n > 1) shared.emplace_back(name);
  }
  return shared;
}

Status CheckValuesAgree(Comm& comm, const StateDict& sd, std::span<const uint64_t> hashes,
                        bool cache_hit, const std::string& dir, uint64_t* exchange_bytes,
                        std::vector<std::string>* differing) {
  // Equal hashes prove agreement when they cover the same names: all values everywhere, or on
  // a cache hit the shared ones of the one plan every rank has cached. A rank that hashed a
  // cached plan's names while others planned anew proves nothing: the lists then decide.
  bool same = true;
  for (uint64_t h : hashes) same = same && h == hashes[0] && (cache_hit || (h & 1) == 0);
  if (same) return OkStatus();
  // The lowest rank with each distinct hash speaks for every rank with it, where equal hashes
  // mean equal lists of all values: hashes of all values, or of the one cached plan's shared
  // names on a hit. A rank that hashed its own cached plan's names on a miss speaks for itself
  // (its names outside them may now be held by others too).
  std::unordered_map<uint64_t, int> first;
  for (int r = 0; r < static_cast<int>(hashes.size()); ++r) first.try_emplace(hashes[r], r);
  auto speaker = [&](int r) { return !cache_hit && (hashes[r] & 1) ? r : first.at(hashes[r]); };
  const std::string mine = speaker(comm.rank()) == comm.rank() ? ListValues(sd) : std::string();
  DCP_ASSIGN_OR_RETURN(auto lists, comm.AllGather(mine));
  std::unordered_map<int, std::vector<std::pair<std::string, uint64_t>>> of_speaker;
  for (int r = 0; r < static_cast<int>(hashes.size()); ++r) {
    if (speaker(r) != r) continue;  // ascending: the same first error everywhere
    *exchange_bytes += lists[r].size();
    wire::Reader rd(lists[r]);
    auto& entries = of_speaker[r];
    while (!rd.AtEnd() && rd.ok()) {
      std::string name(rd.String());
      entries.emplace_back(std::move(name), rd.Fixed64());
    }
    if (!rd.ok()) {
      return DataLoss("save to " + dir + ": corrupt value digests from rank " + std::to_string(r))
          .MarkAgreed();
    }
  }
  // name -> digest -> the ranks holding it, ascending.
  std::map<std::string, std::map<uint64_t, std::vector<int>>> holders;
  for (int r = 0; r < static_cast<int>(hashes.size()); ++r) {
    for (const auto& [name, digest] : of_speaker[speaker(r)]) {
      holders[name][digest].push_back(r);
    }
  }
  for (const auto& [name, by_digest] : holders) {
    if (by_digest.size() < 2) continue;
    if (differing) {  // ascending, as holders is
      differing->push_back(name);
      continue;
    }
    std::vector<std::vector<int>> sides;
    for (const auto& [digest, ranks] : by_digest) sides.push_back(ranks);
    std::sort(sides.begin(), sides.end());
    std::string listed;
    for (const auto& s : sides) listed += (listed.empty() ? "" : " vs ") + RankList(s);
    return InvalidArgument("save to " + dir + ": '" + name +
                           "' is a non-tensor value that differs between ranks (" + listed +
                           "); a save keeps one value per name: give per-rank values per-rank "
                           "names (e.g. 'rng.<rank>')")
        .MarkAgreed();
  }
  return OkStatus();
}

}  // namespace dcp::checkpoint
