#include "planner/broadcast_plan.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "core/copy_runs.h"
#include "core/wire.h"
#include "planner/balancer.h"
#include "planner/slab_cuts.h"
#include "planner/stored_chunk_finder.h"

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

// Stored chunks are indexed from this many on: the broadcast planner queries each tensor
// once per shared shard and per slab cut.
constexpr size_t kIndexMinChunks = 32;

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
  if (verified) return BytesToFetch(*runs, sc.byte_length, md.block_size);
  return runs->src_offset(runs->num_runs() - 1) + runs->run_bytes() - runs->src_offset(0);
}

// Decides which stored chunks are read once and sent, whole or as parts (see SharedChunk), given
// who performs the reads of every destination shard.
void ShareStoredChunks(
    const BroadcastPlanOptions& sharing,
    const std::vector<std::pair<std::pair<uint32_t, Box>, std::vector<int>>>& performed,
    std::map<std::vector<int>, uint32_t>& group_of_ranks, BroadcastPlan& plan) {
  const metadata::Metadata& md = *sharing.md;
  // (tensor, stored chunk) -> rank -> what that rank would fetch from it.
  struct Use {
    uint64_t cost = 0;         // bytes
    std::vector<Box> regions;  // of the tensor it needs from the chunk
  };
  std::map<std::pair<uint32_t, uint32_t>, std::map<int, Use>> uses;
  StoredChunkFinder finder(md, kIndexMinChunks);
  for (const auto& [key, ranks] : performed) {
    const metadata::TensorMeta& t = md.tensors[key.first];
    for (const size_t s : finder.Candidates(key.first, key.second)) {
      const auto si = static_cast<uint32_t>(s);
      auto region = Intersect(key.second, t.chunks[si].box);
      if (!region || region->Empty()) continue;
      const uint64_t cost =
          ReadCost(md, t, t.chunks[si], key.second, *region, sharing.whole_chunk_reads);
      auto& per_rank = uses[{key.first, si}];
      for (int r : ranks) {
        Use& u = per_rank[r];
        u.cost = std::min<uint64_t>(u.cost + cost, t.chunks[si].byte_length);
        u.regions.push_back(*region);
      }
    }
  }
  // What every rank would read if nothing were shared; sharing a chunk moves its cost from
  // its consumers to the one that reads it, chosen as the least loaded (ties: lowest rank).
  std::vector<uint64_t> reads(plan.read_bytes.size(), 0);
  for (const auto& [key, per_rank] : uses) {
    for (const auto& [r, u] : per_rank) reads[r] += u.cost;
  }
  const auto world = static_cast<int>(reads.size());
  for (const auto& [key, per_rank] : uses) {
    const uint64_t nbytes = md.tensors[key.first].chunks[key.second].byte_length;
    const uint32_t file = md.tensors[key.first].chunks[key.second].file;
    auto can_read = [&](int r) { return !sharing.readable || (*sharing.readable)[r][file]; };
    uint64_t separately = 0;
    std::vector<int> ranks;
    bool all_can = true;
    for (const auto& [r, u] : per_rank) {
      separately += u.cost;
      ranks.push_back(r);
      all_can = all_can && can_read(r);
    }
    // A consumer that cannot read the file where it is would have it brought first (a memory
    // tier's restore): when another rank can read it there, that rank sends it instead.
    bool elsewhere = false;
    for (int r = 0; r < world && !all_can && !elsewhere; ++r) elsewhere = can_read(r);
    if (!elsewhere && (separately <= nbytes || !SpansHosts(ranks, sharing.host_of_rank))) continue;
    for (const auto& [r, u] : per_rank) reads[r] -= u.cost;
    // The least loaded consumer (ties: the lowest rank); one that cannot read the file where
    // it is counts the chunk twice (it must be brought to it first). Where a consumer cannot
    // and some rank can, only ranks that can compete, those needing none of it too (ties: a
    // consumer): one broadcast from where the file is, rather than a copy brought and read.
    auto cost = [&](int r) { return reads[r] + (can_read(r) ? 0 : nbytes); };
    int reader = -1;
    for (int r : ranks) {
      if ((!elsewhere || can_read(r)) && (reader < 0 || cost(r) < cost(reader))) reader = r;
    }
    for (int r = 0; r < world && elsewhere; ++r) {
      if (can_read(r) && !per_rank.count(r) && (reader < 0 || cost(r) < cost(reader))) {
        reader = r;
      }
    }
    if (!per_rank.count(reader)) {
      ranks.insert(std::upper_bound(ranks.begin(), ranks.end(), reader), reader);
    }
    reads[reader] += nbytes;
    // Sent as parts when the others need no more than the chunk's bytes in all (each a part
    // of it, as a dp checkpoint loaded into tp shards): the reader then sends no more than a
    // broadcast would, and each member receives only what it needs. In a small group too,
    // where a broadcast sends each member its copy anyway: a part can then arrive straight in
    // the destination's rows, which a broadcast copy is first staged and then scattered into.
    const metadata::TensorMeta& t = md.tensors[key.first];
    std::vector<std::vector<Box>> parts;
    uint64_t part_bytes = 0;
    for (int r : ranks) {
      auto it = per_rank.find(r);
      std::vector<Box>& part = parts.emplace_back();
      if (it == per_rank.end()) continue;
      part = it->second.regions;
      std::sort(part.begin(), part.end());
      if (r == reader) continue;
      for (const Box& b : part) part_bytes += DTypeBytes(t.dtype, b.NumElements()).value_or(nbytes);
    }
    const bool scatter = part_bytes <= nbytes || ranks.size() <= kPartsMaxMembers;
    auto [it, inserted] =
        group_of_ranks.try_emplace(ranks, static_cast<uint32_t>(plan.groups.size()));
    if (inserted) plan.groups.push_back(std::move(ranks));
    SharedChunk& shared =
        plan.chunks.emplace_back(SharedChunk{key.first, key.second, nbytes, it->second, reader});
    if (scatter) shared.parts = std::move(parts);
  }
  plan.read_bytes = std::move(reads);
}

// The files holding the stored chunks `box` of `tensor` comes from, ascending.
std::vector<uint32_t> FilesOf(const metadata::Metadata& md, StoredChunkFinder& finder,
                              uint32_t tensor, const Box& box) {
  std::set<uint32_t> files;
  const auto& chunks = md.tensors[tensor].chunks;
  for (size_t c : finder.Candidates(tensor, box)) {
    auto region = Intersect(box, chunks[c].box);
    if (region && !region->Empty()) files.insert(chunks[c].file);
  }
  return {files.begin(), files.end()};
}

// Whether rank r can read every file of `files` where it is.
bool ReadsAll(const std::vector<std::vector<bool>>& readable, int r,
              const std::vector<uint32_t>& files) {
  return std::all_of(files.begin(), files.end(), [&](uint32_t f) { return readable[r][f]; });
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
  std::optional<StoredChunkFinder> finder;
  if (sharing.md) finder.emplace(*sharing.md, kIndexMinChunks);
  // With `readable`: whether a shard none of whose holders can read all its files where they
  // are, while every file is readable somewhere, is better not shared: its stored chunks then
  // go from ranks that can read them to all its holders at once (ShareStoredChunks), where a
  // member would first receive them and then send them on.
  auto read_elsewhere = [&](const std::vector<uint32_t>& files, const std::vector<int>& classes) {
    for (int c : classes) {
      for (int r : holders[c]) {
        if (ReadsAll(*sharing.readable, r, files)) return false;
      }
    }
    for (uint32_t f : files) {
      bool somewhere = false;
      for (int r = 0; r < world_size && !somewhere; ++r) somewhere = (*sharing.readable)[r][f];
      if (!somewhere) return false;
    }
    return true;
  };
  // Private shards are read by each holder; shared ones once. Their sum over the world is a
  // rank's fair share, which sizes the slabs.
  std::vector<bool> shared(shards.size()), elsewhere(shards.size());
  // With `readable`: the files each shard's stored chunks are in.
  std::vector<std::vector<uint32_t>> files_of(sharing.readable && finder ? shards.size() : 0);
  uint64_t total = 0;
  {
    size_t i = 0;
    for (auto& [key, a] : shards) {
      shared[i] = a.broadcastable && spans_hosts(a.classes);
      if (!files_of.empty() && shared[i]) {
        files_of[i] = FilesOf(*sharing.md, *finder, key.first, key.second);
        elsewhere[i] = read_elsewhere(files_of[i], a.classes);
      }
      shared[i] = shared[i] && !elsewhere[i];
      uint64_t readers = 1;
      if (!shared[i] && !elsewhere[i]) {
        readers = 0;
        for (int c : a.classes) readers += holders[c].size();
      }
      total += a.nbytes * readers;
      ++i;
    }
  }
  const uint64_t fair_share = total / static_cast<uint64_t>(std::max(world_size, 1));
  const uint64_t slab_bytes = sharing.slab_bytes
                                  ? sharing.slab_bytes
                                  : std::max<uint64_t>(fair_share / kSlabsPerShare, kMinSlabBytes);
  struct Pending {
    uint64_t nbytes;
    std::pair<uint32_t, Box> key;
    const std::vector<int>* classes;
    uint32_t group;
    std::vector<Box> slabs;
    uint64_t largest_slab;
    const std::vector<uint32_t>* files;  // with `readable`: the files its stored chunks are in
  };
  std::vector<Pending> pending;
  size_t i = 0;
  for (auto& [key, a] : shards) {
    const size_t shard = i++;
    if (elsewhere[shard]) continue;  // read by others (ShareStoredChunks)
    if (!shared[shard]) {
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
    std::vector<Box> slabs =
        CutIntoSlabs(key.first, key.second, a.nbytes, slab_bytes, finder ? &*finder : nullptr,
                     sharing.md, sharing.whole_chunk_reads);
    uint64_t largest = a.nbytes;
    if (slabs.size() > 1) {
      int64_t rows = 0;
      for (const Box& b : slabs) rows = std::max(rows, b.lengths[0]);
      largest =
          a.nbytes / static_cast<uint64_t>(key.second.lengths[0]) * static_cast<uint64_t>(rows);
    }
    pending.push_back({a.nbytes, key, &a.classes, it->second, std::move(slabs), largest,
                       files_of.empty() ? nullptr : &files_of[shard]});
  }

  // Largest first (by slab: a shard cut fine comes late and fills the gaps, as small shards
  // do), ties in global order; private reads count toward a rank's load. A shard is
  // water-filled: its slabs, in order, go to the least-loaded member while they fit below
  // the fair share (at least one), then to the next least-loaded; a member's consecutive
  // slabs form one entry, one broadcast. A shard that is not cut goes whole, as before.
  std::stable_sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) {
    return a.largest_slab > b.largest_slab;
  });
  ClassBalancer balancer(holders, plan.read_bytes);
  for (const Pending& p : pending) {
    const auto& [tensor, box] = p.key;
    const std::vector<Box>& slabs = p.slabs;
    // Slabs exist only where a row is a whole number of bytes.
    const uint64_t row_bytes =
        slabs.size() > 1 ? p.nbytes / static_cast<uint64_t>(box.lengths[0]) : 0;
    auto bytes_of = [&](const Box& slab) {
      return slabs.size() == 1 ? p.nbytes : row_bytes * static_cast<uint64_t>(slab.lengths[0]);
    };
    // With `readable`: per piece, the least loaded member, one that cannot read every file the
    // piece comes from where it is counting the bytes twice (what it cannot read must be
    // brought to it first). A member that can read none of them never reads for one that can
    // read them all: every byte would travel to it from where it is and then back.
    std::vector<int> members;
    if (p.files) {
      for (int c : *p.classes) members.insert(members.end(), holders[c].begin(), holders[c].end());
      std::sort(members.begin(), members.end());
    }
    auto files_of_slab = [&](const Box& slab) {
      return slabs.size() == 1 ? *p.files : FilesOf(*sharing.md, *finder, p.key.first, slab);
    };
    // Whether `r` may read a piece coming from `files`, given whether some member can read
    // them all where it is.
    auto eligible = [&](int r, const std::vector<uint32_t>& files, bool any_reads_all) {
      return !any_reads_all || std::any_of(files.begin(), files.end(),
                                           [&](uint32_t f) { return (*sharing.readable)[r][f]; });
    };
    auto someone_reads_all = [&](const std::vector<uint32_t>& files) {
      return !files.empty() && std::any_of(members.begin(), members.end(), [&](int m) {
        return ReadsAll(*sharing.readable, m, files);
      });
    };
    auto cheapest = [&](const std::vector<uint32_t>& files, uint64_t nbytes) {
      const bool all = someone_reads_all(files);
      int best = -1;
      uint64_t best_cost = 0;
      for (int r : members) {
        if (!eligible(r, files, all)) continue;
        const uint64_t c =
            plan.read_bytes[r] + (ReadsAll(*sharing.readable, r, files) ? 0 : nbytes);
        if (best < 0 || c < best_cost) {
          best = r;
          best_cost = c;
        }
      }
      return std::pair{best, best_cost};
    };
    for (size_t k = 0; k < slabs.size();) {
      int reader = -1;
      uint64_t load = 0;
      if (members.empty()) {
        load = balancer.Least(*p.classes).first;
      } else {
        std::tie(reader, load) = cheapest(files_of_slab(slabs[k]), bytes_of(slabs[k]));
      }
      const uint64_t room = load < fair_share ? fair_share - load : 0;
      Box piece = slabs[k];
      uint64_t nbytes = bytes_of(slabs[k++]);
      for (; k < slabs.size() && nbytes + bytes_of(slabs[k]) <= room; ++k) {
        if (!members.empty()) {  // the piece stays one its reader may read
          const std::vector<uint32_t> files = files_of_slab(slabs[k]);
          if (!eligible(reader, files, someone_reads_all(files))) break;
        }
        piece.lengths[0] += slabs[k].lengths[0];
        nbytes += bytes_of(slabs[k]);
      }
      if (members.empty()) reader = balancer.Assign(*p.classes, std::max<uint64_t>(nbytes, 1));
      plan.read_bytes[reader] += nbytes;
      plan.shards.push_back({tensor, box, std::move(piece), nbytes, p.group, reader});
    }
  }
  // The global execution order.
  std::sort(plan.shards.begin(), plan.shards.end(), [](const SharedShard& a, const SharedShard& b) {
    return std::tie(a.tensor, a.box, a.slab) < std::tie(b.tensor, b.box, b.slab);
  });

  if (sharing.md != nullptr) {
    // Who performs the reads of each destination shard or slab: its reader when shared,
    // else every holder.
    std::vector<std::pair<std::pair<uint32_t, Box>, std::vector<int>>> performed;
    size_t next = 0;  // plan.shards is in the same (tensor, box) order
    i = 0;
    for (auto& [key, a] : shards) {
      if (shared[i++]) {
        for (; next < plan.shards.size() && plan.shards[next].tensor == key.first &&
               plan.shards[next].box == key.second;
             ++next) {
          performed.push_back({{key.first, plan.shards[next].slab}, {plan.shards[next].reader}});
        }
        continue;
      }
      std::vector<int> ranks;
      for (int c : a.classes) ranks.insert(ranks.end(), holders[c].begin(), holders[c].end());
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

}  // namespace dcp::planner
