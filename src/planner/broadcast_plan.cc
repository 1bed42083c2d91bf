#include "planner/broadcast_plan.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/copy_runs.h"
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

namespace {

// Whether `ranks` live on more than one host (always, without host information).
bool SpansHosts(const std::vector<int>& ranks, const std::vector<uint64_t>* host_of_rank) {
  if (host_of_rank == nullptr) return ranks.size() > 1;
  for (int r : ranks) {
    if ((*host_of_rank)[r] != (*host_of_rank)[ranks[0]]) return true;
  }
  return false;
}

// Storage bytes a rank fetches to copy `region` out of a stored chunk: with checksums
// verified, the blocks it touches (core/copy_runs.h), or the whole chunk when it has one
// checksum; unverified, the span from its first to its last needed byte.
uint64_t ReadCost(const metadata::Metadata& md, const metadata::TensorMeta& t,
                  const metadata::StoredChunk& sc, const Box& dst, const Box& region,
                  bool verified) {
  if (verified && sc.block_xxh3.empty()) return sc.byte_length;
  auto runs = CopyRuns::Make(t.dtype, sc.box, dst, region);
  if (!runs.ok() || runs->num_runs() == 0) return sc.byte_length;
  if (verified) return BytesToFetch(*runs, sc.byte_length, md.block_size, false);
  return runs->src_offset(runs->num_runs() - 1) + runs->run_bytes() - runs->src_offset(0);
}

// Decides which stored chunks are read once and broadcast whole (see SharedChunk), given
// who performs the reads of every destination shard.
void ShareStoredChunks(
    const BroadcastPlanOptions& sharing,
    const std::vector<std::pair<std::pair<uint32_t, Box>, std::vector<int>>>& performed,
    std::map<std::vector<int>, uint32_t>& group_of_ranks, BroadcastPlan& plan) {
  const metadata::Metadata& md = *sharing.md;
  // (tensor, stored chunk) -> rank -> bytes that rank would fetch from it.
  std::map<std::pair<uint32_t, uint32_t>, std::map<int, uint64_t>> uses;
  for (const auto& [key, ranks] : performed) {
    const metadata::TensorMeta& t = md.tensors[key.first];
    for (uint32_t si = 0; si < t.chunks.size(); ++si) {
      auto region = Intersect(key.second, t.chunks[si].box);
      if (!region || region->Empty()) continue;
      const uint64_t cost =
          ReadCost(md, t, t.chunks[si], key.second, *region, sharing.whole_chunk_reads);
      auto& per_rank = uses[{key.first, si}];
      for (int r : ranks) {
        uint64_t& c = per_rank[r];
        c = std::min<uint64_t>(c + cost, t.chunks[si].byte_length);
      }
    }
  }
  // What every rank would read if nothing were shared; sharing a chunk moves its cost from
  // its consumers to the one that reads it, chosen as the least loaded (ties: lowest rank).
  std::vector<uint64_t> reads(plan.read_bytes.size(), 0);
  for (const auto& [key, per_rank] : uses) {
    for (const auto& [r, c] : per_rank) reads[r] += c;
  }
  for (const auto& [key, per_rank] : uses) {
    const uint64_t nbytes = md.tensors[key.first].chunks[key.second].byte_length;
    uint64_t separately = 0;
    for (const auto& [r, c] : per_rank) separately += c;
    std::vector<int> ranks;
    for (const auto& [r, c] : per_rank) ranks.push_back(r);
    if (separately <= nbytes || !SpansHosts(ranks, sharing.host_of_rank)) continue;
    for (const auto& [r, c] : per_rank) reads[r] -= c;
    int reader = ranks[0];
    for (int r : ranks) {
      if (reads[r] < reads[reader]) reader = r;
    }
    reads[reader] += nbytes;
    auto [it, inserted] =
        group_of_ranks.try_emplace(ranks, static_cast<uint32_t>(plan.groups.size()));
    if (inserted) plan.groups.push_back(std::move(ranks));
    plan.chunks.push_back({key.first, key.second, nbytes, it->second, reader});
  }
  plan.read_bytes = std::move(reads);
}

}  // namespace

BroadcastPlan PlanBroadcast(const std::vector<LoadIdentity>& identities,
                            const std::vector<std::vector<int>>& holders, int world_size,
                            const BroadcastPlanOptions& sharing) {
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
  // Per class: whether its ranks span hosts, and the host of its first rank.
  std::vector<bool> class_spans(holders.size(), false);
  for (size_t c = 0; c < holders.size(); ++c) {
    class_spans[c] =
        sharing.host_of_rank ? SpansHosts(holders[c], sharing.host_of_rank) : holders[c].size() > 1;
  }
  auto spans_hosts = [&](const std::vector<int>& classes) {
    if (sharing.host_of_rank == nullptr) {
      size_t members = 0;
      for (int c : classes) members += holders[c].size();
      return members > 1;
    }
    const uint64_t first = (*sharing.host_of_rank)[holders[classes[0]][0]];
    for (int c : classes) {
      if (class_spans[c] || (*sharing.host_of_rank)[holders[c][0]] != first) return true;
    }
    return false;
  };
  for (auto& [key, a] : shards) {
    if (!a.broadcastable || !spans_hosts(a.classes)) {
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

  if (sharing.md != nullptr) {
    // Who performs the reads of each destination shard: its reader when shared, else
    // every holder.
    std::vector<std::pair<std::pair<uint32_t, Box>, std::vector<int>>> performed;
    size_t next_shared = 0;
    for (auto& [key, a] : shards) {
      std::vector<int> ranks;
      if (next_shared < plan.shards.size() && plan.shards[next_shared].tensor == key.first &&
          plan.shards[next_shared].box == key.second) {
        ranks.push_back(plan.shards[next_shared++].reader);
      } else {
        for (int c : a.classes) ranks.insert(ranks.end(), holders[c].begin(), holders[c].end());
      }
      performed.push_back({key, std::move(ranks)});
    }
    std::map<std::vector<int>, uint32_t> group_of_ranks;
    for (uint32_t g = 0; g < plan.groups.size(); ++g) group_of_ranks[plan.groups[g]] = g;
    ShareStoredChunks(sharing, performed, group_of_ranks, plan);
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
  for (SharedChunk& c : plan.chunks) c.group = renumber[c.group];
  return plan;
}

std::vector<BroadcastOp> ScheduleBroadcasts(const BroadcastPlan& plan, uint64_t batch_bytes) {
  std::vector<BroadcastOp> ops;
  auto phase = [&](bool chunks, size_t count, auto item) {
    // (group, reader) -> index of its open batch in `open`; `open` keeps opening order.
    std::map<std::pair<uint32_t, int>, size_t> open_of;
    std::vector<BroadcastOp> open;
    std::vector<bool> closed;
    for (uint32_t i = 0; i < count; ++i) {
      const auto [group, reader, nbytes] = item(i);
      if (batch_bytes == 0 || nbytes >= batch_bytes) {
        ops.push_back({chunks, group, reader, nbytes, {i}});
        continue;
      }
      auto it = open_of.find({group, reader});
      if (it != open_of.end() && open[it->second].bytes + nbytes > batch_bytes) {
        ops.push_back(std::move(open[it->second]));
        closed[it->second] = true;
        open_of.erase(it);
        it = open_of.end();
      }
      if (it == open_of.end()) {
        it = open_of.emplace(std::pair{group, reader}, open.size()).first;
        open.push_back({chunks, group, reader, 0, {}});
        closed.push_back(false);
      }
      open[it->second].items.push_back(i);
      open[it->second].bytes += nbytes;
    }
    for (size_t b = 0; b < open.size(); ++b) {
      if (!closed[b]) ops.push_back(std::move(open[b]));
    }
  };
  phase(true, plan.chunks.size(), [&](uint32_t i) {
    const SharedChunk& c = plan.chunks[i];
    return std::tuple{c.group, c.reader, c.nbytes};
  });
  phase(false, plan.shards.size(), [&](uint32_t i) {
    const SharedShard& s = plan.shards[i];
    return std::tuple{s.group, s.reader, s.nbytes};
  });
  return ops;
}

}  // namespace dcp::planner
