#include "checkpoint/rank_values.h"

#include <algorithm>
#include <charconv>
#include <map>

namespace dcp::checkpoint {
namespace {

constexpr std::string_view kRankInfix = ".__dcp_rank_";

}  // namespace

std::string PerRankValueName(std::string_view fqn, int rank) {
  return std::string(fqn) + std::string(kRankInfix) + std::to_string(rank);
}

std::optional<std::pair<std::string, int>> ParsePerRankValueName(std::string_view name) {
  const size_t at = name.rfind(kRankInfix);
  if (at == std::string_view::npos || at == 0) return std::nullopt;
  const std::string_view digits = name.substr(at + kRankInfix.size());
  int rank = -1;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), rank);
  if (ec != std::errc() || end != digits.data() + digits.size() || rank < 0 ||
      std::to_string(rank) != digits) {
    return std::nullopt;
  }
  return std::make_pair(std::string(name.substr(0, at)), rank);
}

StateDict WithPerRankValues(const StateDict& sd, const std::vector<std::string>& names, int rank) {
  StateDict out;
  for (const StateEntry& e : sd.entries()) {
    std::string fqn = e.fqn;
    if (e.kind == StateEntry::Kind::kBytes) {
      if (std::binary_search(names.begin(), names.end(), e.fqn))
        fqn = PerRankValueName(e.fqn, rank);
      out.add_bytes(fqn, e.bytes);
    } else if (e.chunks.empty()) {
      out.add_empty(fqn, e.dtype, e.global_shape);
    } else {
      for (const TensorChunk& c : e.chunks)
        out.add(fqn, c.view, Chunk{e.global_shape, c.box.offsets});
    }
    if (!e.path.empty()) out.set_path(fqn, e.path);
  }
  return out;
}

void PickRankValues(metadata::Metadata& md, int rank, int world,
                    std::vector<std::string>* warnings) {
  std::map<std::string, std::map<int, size_t>> saved;  // name -> saving rank -> bytes index
  for (size_t i = 0; i < md.bytes.size(); ++i) {
    if (auto parsed = ParsePerRankValueName(md.bytes[i].fqn)) {
      saved[parsed->first][parsed->second] = i;
    }
  }
  if (saved.empty()) return;
  for (auto& [name, by_rank] : saved) {
    auto mine = by_rank.find(rank);
    const bool own = static_cast<int>(md.world_size) == world && mine != by_rank.end();
    const auto& [from, index] = own ? *mine : *by_rank.begin();
    md.bytes[index].fqn = name;
    if (!own && warnings) {
      warnings->push_back("'" + name + "' was saved per rank (its value differed between the " +
                          std::to_string(md.world_size) + " saving ranks); this rank (" +
                          std::to_string(rank) + " of " + std::to_string(world) + ") loads rank " +
                          std::to_string(from) + "'s value");
    }
  }
  // Found by binary search: sorted by name again.
  std::sort(
      md.bytes.begin(), md.bytes.end(),
      [](const metadata::BytesMeta& a, const metadata::BytesMeta& b) { return a.fqn < b.fqn; });
}

}  // namespace dcp::checkpoint
