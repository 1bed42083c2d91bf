#include "planner/broadcast_plan.h"

#include <algorithm>
#include <map>

#include "core/wire.h"
#include "planner/balancer.h"

namespace dcp::planner {

std::string EncodeLoadIdentity(const LoadIdentity& id) {
  std::string out;
  wire::Writer w(out);
  w.Varint(id.shards.size());
  for (const ShardIdentity& s : id.shards) {
    w.Varint(s.tensor);
    w.Byte(static_cast<uint8_t>(s.box.rank() << 1 | (s.broadcastable ? 1 : 0)));
    w.Extents(s.box.offsets);
    w.Extents(s.box.lengths);
    w.Varint(s.nbytes);
  }
  return out;
}

Result<LoadIdentity> DecodeLoadIdentity(std::string_view data) {
  wire::Reader r(data);
  LoadIdentity id;
  id.shards.resize(r.Count(3));
  for (ShardIdentity& s : id.shards) {
    s.tensor = static_cast<uint32_t>(r.Varint());
    uint8_t b = r.Byte();
    int rank = b >> 1;
    if (rank > kMaxDims) return DataLoss("corrupt load identity received");
    s.broadcastable = b & 1;
    s.box.offsets = r.Extents(rank);
    s.box.lengths = r.Extents(rank);
    s.nbytes = r.Varint();
  }
  if (!r.ok() || !r.AtEnd()) return DataLoss("corrupt load identity received");
  return id;
}

BroadcastPlan PlanBroadcast(const std::vector<LoadIdentity>& identities,
                            const std::vector<std::vector<int>>& holders, int world_size) {
  struct Acc {
    uint64_t nbytes = 0;
    bool broadcastable = true;
    std::vector<int> classes;  // ascending
  };
  // Ordered by (tensor, box): the global execution order.
  std::map<std::pair<uint32_t, Box>, Acc> shards;
  for (int c = 0; c < static_cast<int>(identities.size()); ++c) {
    for (const ShardIdentity& s : identities[c].shards) {
      Acc& a = shards[{s.tensor, s.box}];
      a.nbytes = s.nbytes;
      a.broadcastable = a.broadcastable && s.broadcastable;
      if (a.classes.empty() || a.classes.back() != c) a.classes.push_back(c);
    }
  }

  BroadcastPlan plan;
  plan.read_bytes.assign(world_size, 0);
  std::map<std::vector<int>, uint32_t> group_of_classes;
  struct Pending {
    uint64_t weight;
    size_t index;  // into plan.shards
    const std::vector<int>* classes;
  };
  std::vector<Pending> pending;
  for (auto& [key, a] : shards) {
    size_t members = 0;
    for (int c : a.classes) members += holders[c].size();
    if (members < 2 || !a.broadcastable) {
      // Private to one rank, or read by every holder itself.
      for (int c : a.classes) {
        for (int r : holders[c]) plan.read_bytes[r] += a.nbytes;
      }
      continue;
    }
    auto [it, inserted] =
        group_of_classes.try_emplace(a.classes, static_cast<uint32_t>(plan.groups.size()));
    if (inserted) {
      std::vector<int> ranks;
      for (int c : a.classes) ranks.insert(ranks.end(), holders[c].begin(), holders[c].end());
      std::sort(ranks.begin(), ranks.end());
      plan.groups.push_back(std::move(ranks));
    }
    pending.push_back({std::max<uint64_t>(a.nbytes, 1), plan.shards.size(), &a.classes});
    plan.shards.push_back({key.first, key.second, a.nbytes, it->second, -1});
  }

  // Largest first, ties in global order; private reads count toward a rank's load.
  std::stable_sort(pending.begin(), pending.end(),
                   [](const Pending& a, const Pending& b) { return a.weight > b.weight; });
  ClassBalancer balancer(holders, plan.read_bytes);
  for (const Pending& p : pending) {
    const int reader = balancer.Assign(*p.classes, p.weight);
    plan.shards[p.index].reader = reader;
    plan.read_bytes[reader] += plan.shards[p.index].nbytes;
  }

  // Groups in a canonical order (by member list) so that creation order agrees everywhere.
  std::vector<uint32_t> order(plan.groups.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return plan.groups[a] < plan.groups[b]; });
  std::vector<uint32_t> renumber(order.size());
  std::vector<std::vector<int>> sorted_groups(order.size());
  for (uint32_t i = 0; i < order.size(); ++i) {
    renumber[order[i]] = i;
    sorted_groups[i] = std::move(plan.groups[order[i]]);
  }
  plan.groups = std::move(sorted_groups);
  for (SharedShard& s : plan.shards) s.group = renumber[s.group];
  return plan;
}

}  // namespace dcp::planner
