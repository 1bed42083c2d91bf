#include "checkpoint/broadcast_load.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>

#include "checkpoint/in_flight.h"
#include "core/ascending_runs.h"
#include "core/guarded.h"
#include "core/wire.h"

namespace dcp::checkpoint {
namespace {

// Group communicators kept across loads, per world communicator (by identity). An entry
// whose world has been destroyed is dropped with it.
class GroupCache {
 public:
  static GroupCache& Get() {
    static GroupCache cache;
    return cache;
  }
  std::shared_ptr<Comm> Find(const std::shared_ptr<Comm>& world, const std::vector<int>& ranks) {
    std::lock_guard lock(mu_);
    Entry& e = EntryFor(world);
    auto it = e.groups.find(ranks);
    return it == e.groups.end() ? nullptr : it->second;
  }
  void Put(const std::shared_ptr<Comm>& world, const std::vector<int>& ranks,
           std::shared_ptr<Comm> group) {
    std::lock_guard lock(mu_);
    EntryFor(world).groups[ranks] = std::move(group);
  }

 private:
  struct Entry {
    std::weak_ptr<Comm> world;
    std::map<std::vector<int>, std::shared_ptr<Comm>> groups;
  };
  Entry& EntryFor(const std::shared_ptr<Comm>& world) {
    Entry& e = entries_[world.get()];
    if (e.world.expired() || e.world.lock() != world) {
      e.groups.clear();  // a new communicator at a recycled address
      e.world = world;
    }
    return e;
  }
  std::mutex mu_;  // guards entries_ (thread-rank tests share the process)
  std::map<const Comm*, Entry> entries_;
};

bool IsMember(const std::vector<int>& ranks, int rank) {
  return std::binary_search(ranks.begin(), ranks.end(), rank);
}

// Copies this rank's regions of `op`'s chunks out of their staging buffer, which holds them
// one after the other (at least the parts this rank needs). The callback refers to the
// schedule, which outlives it.
std::function<void(std::span<const std::byte>)> ScatterEach(const planner::BroadcastPlan& plan,
                                                            const std::vector<MyChunk>& my_chunks,
                                                            const planner::BroadcastOp& op) {
  return [&plan, &my_chunks, &op](std::span<const std::byte> staging) {
    uint64_t off = 0;
    for (uint32_t i : op.items) {
      const uint64_t n = plan.chunks[i].nbytes;
      for (const storage::ChunkTarget& t : my_chunks[i].targets) {
        storage::ScatterFromMemory(t, staging.subspan(off, n));
      }
      off += n;
    }
  };
}

// The bytes the lists of sorted spans cover together.
uint64_t UnionBytes(const std::vector<std::vector<planner::ByteSpan>>& lists) {
  std::vector<planner::ByteSpan> all;
  for (const auto& l : lists) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end(), [](const planner::ByteSpan& a, const planner::ByteSpan& b) {
    return a.offset < b.offset;
  });
  uint64_t bytes = 0, end = 0;
  for (const planner::ByteSpan& s : all) {
    const uint64_t from = std::max(s.offset, end);
    if (s.offset + s.length > from) bytes += s.offset + s.length - from;
    end = std::max(end, s.offset + s.length);
  }
  return bytes;
}

// This rank's destination runs of `op`'s chunks in the order of their bytes in the staging
// buffer (the order a part arrives in), when they tile `part` (sorted, disjoint spans of that
// buffer) exactly, each byte going to one place: the part can then arrive straight in the
// destination. Empty when they do not, or the part is empty.
std::optional<Comm::Ranges> StraightInto(const planner::BroadcastPlan& plan,
                                         const std::vector<MyChunk>& my_chunks,
                                         const planner::BroadcastOp& op,
                                         const std::vector<planner::ByteSpan>& part) {
  struct Run {
    uint64_t src;
    std::byte* dst;
    uint64_t length;
  };
  std::vector<Run> runs;
  uint64_t at = 0;
  for (uint32_t i : op.items) {
    for (const storage::ChunkTarget& t : my_chunks[i].targets) {
      const CopyRuns& r = *t.runs;
      for (uint64_t k = 0; k < r.num_runs(); ++k) {
        runs.push_back({at + r.src_offset(k), t.dst + r.dst_offset(k), r.run_bytes()});
      }
    }
    at += plan.chunks[i].nbytes;
  }
  if (part.empty() || runs.empty()) return std::nullopt;
  // Mostly in order already (one chunk's runs, chunks one after the other).
  SortAscendingRuns(runs, [](const Run& a, const Run& b) { return a.src < b.src; });
  Comm::Ranges out;
  size_t s = 0;
  uint64_t pos = part[0].offset;
  for (const Run& run : runs) {
    if (s == part.size() || run.src != pos) return std::nullopt;
    // Runs that follow each other in the destination too (a column slice into its own
    // contiguous memory) arrive as one range.
    if (!out.empty() && out.back().data() + out.back().size() == run.dst) {
      out.back() = {out.back().data(), out.back().size() + run.length};
    } else {
      out.emplace_back(run.dst, run.length);
    }
    pos += run.length;
    const uint64_t end = part[s].offset + part[s].length;
    if (pos > end) return std::nullopt;
    if (pos == end && ++s < part.size()) pos = part[s].offset;
  }
  if (s != part.size()) return std::nullopt;
  // A receive may not write one byte twice: destinations sharing memory are staged instead.
  // Each chunk's ranges land at rising addresses (a column slice has one per row, and two
  // chunks' columns interleave in one destination's rows).
  Comm::Ranges by_address = out;
  SortAscendingRuns(by_address, [](std::span<std::byte> a, std::span<std::byte> b) {
    return a.data() < b.data();
  });
  for (size_t k = 1; k < by_address.size(); ++k) {
    if (by_address[k - 1].data() + by_address[k - 1].size() > by_address[k].data()) {
      return std::nullopt;
    }
  }
  return out;
}

// Whether every byte this rank's regions copy out of `op`'s chunks lies in `part` (sorted,
// disjoint spans of their staging buffer): what Comm::IScatterV brings it.
bool Covers(const planner::BroadcastPlan& plan, const std::vector<MyChunk>& my_chunks,
            const planner::BroadcastOp& op, const std::vector<planner::ByteSpan>& part) {
  uint64_t at = 0;
  for (uint32_t i : op.items) {
    for (const storage::ChunkTarget& t : my_chunks[i].targets) {
      const CopyRuns& runs = *t.runs;
      for (uint64_t k = 0; k < runs.num_runs(); ++k) {
        const uint64_t begin = at + runs.src_offset(k), end = begin + runs.run_bytes();
        auto it =
            std::upper_bound(part.begin(), part.end(), begin,
                             [](uint64_t o, const planner::ByteSpan& s) { return o < s.offset; });
        if (it == part.begin() || std::prev(it)->offset + std::prev(it)->length < end) {
          return false;
        }
      }
    }
    at += plan.chunks[i].nbytes;
  }
  return true;
}

// Where this rank's copy of a broadcast of one shared stored chunk can go straight: its one
// destination region of it when that is the whole chunk in one run (the destination holds it
// contiguously, as a row slab of a row-major tensor); null: staged, then scattered.
std::byte* DirectDestination(const planner::BroadcastOp& op, const std::vector<MyChunk>& mine) {
  if (op.items.size() != 1) return nullptr;
  const MyChunk& m = mine[op.items[0]];
  if (m.targets.size() != 1) return nullptr;
  const CopyRuns& r = *m.targets[0].runs;
  if (r.num_runs() != 1 || r.run_bytes() != op.bytes || r.src_offset(0) != 0) return nullptr;
  return m.targets[0].dst + r.dst_offset(0);
}

}  // namespace

Result<std::vector<std::shared_ptr<Comm>>> ResolveGroups(const std::shared_ptr<Comm>& world,
                                                         const planner::BroadcastPlan& plan,
                                                         uint64_t* created) {
  const int me = world->rank();
  GroupCache& cache = GroupCache::Get();
  std::vector<std::shared_ptr<Comm>> groups(plan.groups.size());
  // Which of my groups I lack; everyone learns the union, and every member of a group
  // anyone lacks creates it anew (so members never disagree on which to create).
  std::string absent;
  wire::Writer w(absent);
  for (uint32_t g = 0; g < plan.groups.size(); ++g) {
    const auto& ranks = plan.groups[g];
    if (!IsMember(ranks, me)) continue;
    if (static_cast<int>(ranks.size()) == world->size()) {
      groups[g] = world;
    } else if (!(groups[g] = cache.Find(world, ranks))) {
      w.Varint(g);
    }
  }
  DCP_ASSIGN_OR_RETURN(auto all, world->AllGather(absent));
  std::vector<bool> create(plan.groups.size(), false);
  for (const std::string& a : all) {
    wire::Reader r(a);
    while (!r.AtEnd()) {
      uint64_t g = r.Varint();
      if (!r.ok() || g >= create.size()) return DataLoss("corrupt group list received");
      create[g] = true;
    }
  }
  // In the plan's canonical group order on every rank: creation is collective over members.
  for (uint32_t g = 0; g < plan.groups.size(); ++g) {
    if (!create[g] || !IsMember(plan.groups[g], me)) continue;
    DCP_ASSIGN_OR_RETURN(groups[g], world->CreateGroup(plan.groups[g]));
    cache.Put(world, plan.groups[g], groups[g]);
    ++*created;
  }
  return groups;
}

planner::GatherLimits GatherLimitsFor(uint64_t smallest_budget, bool in_place) {
  // In place, no slab is small (none is packed into a buffer).
  return {.max_small_bytes = std::max<uint64_t>(smallest_budget / 4, 1),
          .in_place_bytes = in_place ? 0 : Comm::kInPlaceBytes};
}

Status RunSharedPhase(Comm& world, const metadata::Metadata& md, const planner::BroadcastPlan& plan,
                      const std::vector<std::shared_ptr<Comm>>& groups,
                      const std::vector<MyChunk>& my_chunks, const std::vector<MyShard>& mine,
                      const planner::LocalLoadPlan& shared_reads, ChunkReads& reads,
                      const LoadOptions& opts, uint64_t smallest_budget, LoadResult* stats,
                      Status* read_failure) {
  const int me = world.rank();
  InFlight in_flight(static_cast<size_t>(opts.max_broadcasts_in_flight),
                     opts.max_broadcast_buffer_bytes, stats);
  reads.set_between_chunks([&] { in_flight.Progress(); });
  // After a read failure, keep the protocol going without reading: peers wait on us. An
  // exception in a read is this rank's failure like any other.
  auto read = [&](auto&& f) {
    if (read_failure->ok()) *read_failure = Guarded("", f);
  };
  auto root_of = [&](uint32_t group, int reader) {
    const auto& ranks = plan.groups[group];
    return static_cast<int>(std::lower_bound(ranks.begin(), ranks.end(), reader) - ranks.begin());
  };

  // 1. Shared stored chunks: each read whole by one rank (a consumer, or one needing none of
  // it) and broadcast, into and out of a staging buffer from which every consumer scatters its
  // regions, or straight between destinations holding a lone chunk as one run; or, where the
  // plan and the backend allow, sent as the parts each member needs (scatter_parts). The
  // callbacks of posted operations refer to the schedule until the drain below.
  const std::vector<planner::BroadcastOp> chunk_ops =
      planner::ScheduleBroadcasts(plan, opts.broadcast_batch_bytes);
  {
    std::vector<std::pair<uint32_t, uint32_t>> whole;  // the shared chunks this rank reads
    for (const planner::BroadcastOp& op : chunk_ops) {
      if (op.reader != me || !groups[op.group]) continue;
      for (uint32_t i : op.items) whole.emplace_back(plan.chunks[i].tensor, plan.chunks[i].stored);
    }
    reads.HintWhole(whole);
  }
  // A staging buffer for `op`'s chunks, one after the other, from which this rank's regions
  // are scattered once it completes.
  auto stage = [&](const planner::BroadcastOp& op, InFlight::Op& posted) -> Status {
    posted.held = op.bytes;
    DCP_RETURN_IF_ERROR(in_flight.Reserve(op.bytes, /*staged=*/true));
    DCP_RETURN_IF_ERROR(Guarded("broadcast buffer: ", [&] {
      posted.staging = in_flight.Take(op.bytes);
      posted.held = posted.staging.capacity;
      return OkStatus();
    }));
    posted.done = ScatterEach(plan, my_chunks, op);
    return OkStatus();
  };
  // The reader reads `op`'s chunks whole into `buf`, one after the other. After a failed read
  // (the load fails everywhere), a reused buffer's old bytes are not sent.
  auto read_op = [&](const planner::BroadcastOp& op, std::span<std::byte> buf) {
    uint64_t at = 0;
    for (uint32_t i : op.items) {
      const planner::SharedChunk& c = plan.chunks[i];
      read([&] { return reads.ReadWhole(c.tensor, c.stored, buf.subspan(at, c.nbytes)); });
      at += c.nbytes;
    }
    if (!read_failure->ok()) std::memset(buf.data(), 0, buf.size());
  };
  // Chunks sent as parts: read whole into staging by their reader, which sends each member
  // only the spans of them it needs; a receiver's arrive straight in its destination where its
  // regions tile its part, else at their places in a staging buffer of the op's size, from
  // which it scatters its regions as from a broadcast copy.
  auto scatter_parts = [&](const planner::BroadcastOp& op, bool reader, Comm& group,
                           int root) -> Status {
    const int members = group.size();
    const int mine_at = group.rank();
    std::vector<std::vector<planner::ByteSpan>> spans(members);
    std::vector<uint64_t> part_bytes(members, 0);
    uint64_t at = 0;  // of the item in the staging buffer
    for (uint32_t i : op.items) {
      const planner::SharedChunk& c = plan.chunks[i];
      const metadata::TensorMeta& t = md.tensors[c.tensor];
      for (int m = 0; m < members; ++m) {
        if (m == root) continue;
        for (const planner::ByteSpan& b :
             planner::PartSpans(t.dtype, t.chunks[c.stored].box, c.parts[m])) {
          part_bytes[m] += b.length;
          spans[m].push_back({at + b.offset, b.length});
        }
      }
      at += c.nbytes;
    }
    InFlight::Op posted;
    std::vector<Comm::Ranges> to;
    Comm::Ranges into;
    if (reader) {
      DCP_RETURN_IF_ERROR(stage(op, posted));
      read_op(op, posted.staging.span());
      stats->bytes_sent += UnionBytes(spans);
    } else {
      stats->bytes_received += part_bytes[mine_at];
      const std::vector<planner::ByteSpan>& part = spans[mine_at];
      std::optional<Comm::Ranges> straight = StraightInto(plan, my_chunks, op, part);
      if (straight || (part.empty() && Covers(plan, my_chunks, op, part))) {
        // Its part goes where it belongs (or it has none): no staging, nothing to scatter.
        DCP_RETURN_IF_ERROR(in_flight.Reserve(0));
        if (straight) into = std::move(*straight);
      } else {
        DCP_RETURN_IF_ERROR(stage(op, posted));
        if (!Covers(plan, my_chunks, op, part) && read_failure->ok()) {
          // The plan's parts miss bytes this rank needs (a bug): the load fails on every rank,
          // after the collective, which the others have posted.
          *read_failure =
              Internal("load plan: the part of a shared stored chunk of '" +
                       md.tensors[plan.chunks[op.items[0]].tensor].fqn + "' sent to rank " +
                       std::to_string(me) + " lacks bytes it needs");
        }
      }
    }
    const std::span<std::byte> buf = posted.staging.span();
    auto ranges_of = [&](const std::vector<planner::ByteSpan>& part) {
      Comm::Ranges r;
      for (const planner::ByteSpan& b : part) r.push_back(buf.subspan(b.offset, b.length));
      return r;
    };
    if (reader) {
      for (int m = 0; m < members; ++m) to.push_back(ranges_of(spans[m]));
    } else if (posted.staging.data) {
      into = ranges_of(spans[mine_at]);
    }
    if (op.items.size() > 1) ++stats->batches;
    stats->shared_chunks += op.items.size();
    return in_flight.Post(group.IScatterV(to, into, part_bytes, root), std::move(posted));
  };

  for (const planner::BroadcastOp& op : chunk_ops) {
    if (!groups[op.group]) continue;  // not a member
    const bool reader = op.reader == me;
    Comm& group = *groups[op.group];
    const int root = root_of(op.group, op.reader);
    if (world.scatters_parts() && std::all_of(op.items.begin(), op.items.end(), [&](uint32_t i) {
          return !plan.chunks[i].parts.empty();
        })) {
      DCP_RETURN_IF_ERROR(scatter_parts(op, reader, group, root));
      continue;
    }
    (reader ? stats->bytes_sent : stats->bytes_received) += op.bytes;
    if (op.items.size() > 1) ++stats->batches;
    stats->shared_chunks += op.items.size();
    InFlight::Op posted;
    std::span<std::byte> buf;
    if (std::byte* dst = DirectDestination(op, my_chunks)) {
      // Straight from or into this rank's destination: no staging, nothing to scatter.
      buf = std::span(dst, op.bytes);
      DCP_RETURN_IF_ERROR(in_flight.Reserve(0));
    } else {
      DCP_RETURN_IF_ERROR(stage(op, posted));
      buf = posted.staging.span();
    }
    if (reader) read_op(op, buf);
    DCP_RETURN_IF_ERROR(in_flight.Post(group.IBroadcast(buf, root), std::move(posted)));
  }
  // Every region the shared chunks feed is in place before a shard reader sends.
  DCP_RETURN_IF_ERROR(in_flight.Drain());
  in_flight.ReleaseKept();

  // 2. Shared shards and slabs, straight from and into the destination memory: per group, a
  // few rounds of one all-gather each, where every member sends the slabs it read (the
  // reading of the next round overlaps the exchange of this one). A backend without scattered
  // all-gathers packs slabs under Comm::kInPlaceBytes into buffers: those count as held.
  // Every group is of the world's backend, so the world answers for all.
  const std::vector<planner::GatherOp> gathers =
      planner::ScheduleGathers(plan, GatherLimitsFor(smallest_budget, world.gathers_in_place()));
  for (const planner::GatherOp& op : gathers) {
    if (!groups[op.group]) continue;  // not a member
    Comm& group = *groups[op.group];
    Comm::Ranges send;
    std::vector<Comm::Ranges> from(plan.groups[op.group].size());
    for (uint32_t i : op.items) {
      const planner::SharedShard& s = plan.shards[i];
      const std::span<std::byte> range(mine[i].dst, s.nbytes);
      ++stats->shared_shards;
      if (s.reader == me) {
        ++stats->shards_read_for_others;
        stats->bytes_sent += s.nbytes;
        read([&] { return reads.Read(shared_reads, mine[i].read_items); });
        send.push_back(range);
      } else {
        stats->bytes_received += s.nbytes;
        from[root_of(op.group, s.reader)].push_back(range);
      }
    }
    InFlight::Op posted;
    posted.held = op.small_bytes;
    DCP_RETURN_IF_ERROR(in_flight.Reserve(posted.held));
    DCP_RETURN_IF_ERROR(in_flight.Post(group.IAllGatherV(send, from), std::move(posted)));
  }
  // This rank's shared reads are all issued: an object store fetches its own chunks while it
  // waits for the others' (not before, where they would compete with the shared reads).
  reads.HintPrivate();
  Status drained = in_flight.Drain();
  reads.set_between_chunks(nullptr);
  return drained;
}

}  // namespace dcp::checkpoint
