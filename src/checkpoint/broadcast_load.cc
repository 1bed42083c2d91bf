#include "checkpoint/broadcast_load.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>

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

// Outstanding broadcasts, oldest first, at most `limit`.
class InFlight {
 public:
  InFlight(size_t limit, LoadResult* stats) : limit_(std::max<size_t>(limit, 1)), stats_(stats) {}
  // Requests remain only after a communication failure. The backend may still write into
  // their buffers (MPI cannot cancel a collective), so they are left allocated, as in
  // WaitOldest, rather than freed under it.
  ~InFlight() {
    for (Op& op : ops_) {
      new std::vector<std::byte>(std::move(op.staging));
      (void)op.request.release();
    }
  }

  struct Op {
    std::unique_ptr<CommRequest> request;
    std::vector<std::byte> staging;                        // batches and whole stored chunks
    std::vector<std::pair<std::byte*, uint64_t>> scatter;  // receiver of a batch: where to
    std::function<void(std::span<const std::byte>)> done;  // run on staging once complete
  };

  Status Post(Comm& group, int root, std::span<std::byte> buf, Op op) {
    // Bounded by count, and by staging memory (one oversized buffer may go alone).
    while (!ops_.empty() &&
           (ops_.size() >= limit_ || staged_ + op.staging.size() > kMaxStagedBytes)) {
      DCP_RETURN_IF_ERROR(WaitOldest());
    }
    staged_ += op.staging.size();
    DCP_ASSIGN_OR_RETURN(op.request, group.IBroadcast(buf, root));
    ++stats_->broadcasts;
    ops_.push_back(std::move(op));
    return OkStatus();
  }
  Status WaitOldest() {
    Op op = std::move(ops_.front());
    ops_.pop_front();
    staged_ -= op.staging.size();
    if (Status s = op.request->Wait(); !s.ok()) {
      // The backend may still write into the staging buffer after a failed wait (MPI
      // cannot cancel a collective): leave it allocated rather than risk a use after free.
      new std::vector<std::byte>(std::move(op.staging));
      return s;
    }
    uint64_t off = 0;
    for (auto [dst, n] : op.scatter) {
      std::memcpy(dst, op.staging.data() + off, n);
      off += n;
    }
    if (op.done) op.done(op.staging);
    return OkStatus();
  }
  Status Drain() {
    while (!ops_.empty()) DCP_RETURN_IF_ERROR(WaitOldest());
    return OkStatus();
  }
  // Lets the backend move data while this rank is busy reading.
  void Progress() {
    for (auto& op : ops_) (void)op.request->Test();
  }

 private:
  static constexpr uint64_t kMaxStagedBytes = uint64_t{1} << 30;
  size_t limit_;
  LoadResult* stats_;
  uint64_t staged_ = 0;
  std::deque<Op> ops_;
};

// Small shards of one (group, reader), sent together.
struct Batch {
  uint32_t group;
  int reader;
  uint64_t bytes = 0;
  std::vector<std::pair<std::byte*, uint64_t>> items;
};

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

Status RunSharedPhase(Comm& world, const planner::BroadcastPlan& plan,
                      const std::vector<std::shared_ptr<Comm>>& groups,
                      const std::vector<MyChunk>& my_chunks, const std::vector<MyShard>& mine,
                      const planner::LocalLoadPlan& load_plan, ChunkReads& reads,
                      const LoadOptions& opts, LoadResult* stats, Status* read_failure) {
  const int me = world.rank();
  InFlight in_flight(static_cast<size_t>(opts.max_broadcasts_in_flight), stats);
  reads.set_between_chunks([&] { in_flight.Progress(); });
  auto root_of = [&](uint32_t g, int reader) {
    const auto& ranks = plan.groups[g];
    return static_cast<int>(std::lower_bound(ranks.begin(), ranks.end(), reader) - ranks.begin());
  };
  auto account = [&](int reader, uint64_t n) {
    if (reader == me) {
      stats->bytes_sent += n;
    } else {
      stats->bytes_received += n;
    }
  };

  // Open batches in creation order: members of a group create and send them in the same
  // order because they see the same shards in the same order.
  std::vector<Batch> open;
  auto send_batch = [&](Batch& b) -> Status {
    Comm& group = *groups[b.group];
    const int root = root_of(b.group, b.reader);
    account(b.reader, b.bytes);
    if (b.items.size() == 1) {
      return in_flight.Post(group, root, std::span(b.items[0].first, b.items[0].second), {});
    }
    ++stats->batches;
    InFlight::Op op;
    op.staging.resize(b.bytes);
    if (b.reader == me) {
      uint64_t off = 0;
      for (auto [src, n] : b.items) {
        std::memcpy(op.staging.data() + off, src, n);
        off += n;
      }
    } else {
      op.scatter = std::move(b.items);
    }
    std::span<std::byte> buf(op.staging);
    return in_flight.Post(group, root, buf, std::move(op));
  };

  // Shared stored chunks: each destination region they feed is complete before any shard
  // broadcast below starts (drained in between), so shard readers send finished data.
  // Small chunks travel together per (group, reader), like small shards below; the reader
  // reads them into the batch's staging buffer when the batch is sent.
  struct ChunkBatch {
    uint32_t group;
    int reader;
    uint64_t bytes = 0;
    std::vector<size_t> chunks;  // indices into plan.chunks
  };
  std::vector<ChunkBatch> open_chunks;
  auto send_chunks = [&](ChunkBatch& b) -> Status {
    InFlight::Op op;
    op.staging.resize(b.bytes);
    uint64_t off = 0;
    for (size_t i : b.chunks) {
      const planner::SharedChunk& c = plan.chunks[i];
      if (b.reader == me && read_failure->ok()) {
        *read_failure =
            reads.ReadWhole(c.tensor, c.stored, std::span(op.staging.data() + off, c.nbytes));
      }
      off += c.nbytes;
    }
    account(b.reader, b.bytes);
    if (b.chunks.size() > 1) ++stats->batches;
    op.done = [&plan, &my_chunks, ids = b.chunks](std::span<const std::byte> staging) {
      uint64_t at = 0;
      for (size_t i : ids) {
        const uint64_t n = plan.chunks[i].nbytes;
        for (const storage::ChunkTarget& t : my_chunks[i].targets) {
          storage::ScatterFromMemory(t, staging.subspan(at, n));
        }
        at += n;
      }
    };
    std::span<std::byte> buf(op.staging);
    return in_flight.Post(*groups[b.group], root_of(b.group, b.reader), buf, std::move(op));
  };
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const planner::SharedChunk& c = plan.chunks[i];
    if (!my_chunks[i].member) continue;
    ++stats->shared_chunks;
    const uint64_t limit = std::max<uint64_t>(opts.broadcast_batch_bytes, 1);
    auto it = std::find_if(open_chunks.begin(), open_chunks.end(), [&](const ChunkBatch& b) {
      return b.group == c.group && b.reader == c.reader;
    });
    if (it != open_chunks.end() && it->bytes + c.nbytes > limit) {
      DCP_RETURN_IF_ERROR(send_chunks(*it));
      open_chunks.erase(it);
      it = open_chunks.end();
    }
    if (it == open_chunks.end()) {
      open_chunks.push_back({c.group, c.reader, 0, {}});
      it = open_chunks.end() - 1;
    }
    it->chunks.push_back(i);
    it->bytes += c.nbytes;
  }
  for (ChunkBatch& b : open_chunks) DCP_RETURN_IF_ERROR(send_chunks(b));
  DCP_RETURN_IF_ERROR(in_flight.Drain());

  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const planner::SharedShard& s = plan.shards[i];
    const MyShard& m = mine[i];
    if (m.dst == nullptr) continue;
    ++stats->shared_shards;
    if (s.reader == me) {
      ++stats->shards_read_for_others;
      // After a failure, keep the protocol going without reading: peers wait on us.
      if (read_failure->ok()) *read_failure = reads.Read(load_plan, m.read_items);
    }
    if (opts.broadcast_batch_bytes == 0 || s.nbytes >= opts.broadcast_batch_bytes) {
      account(s.reader, s.nbytes);
      DCP_RETURN_IF_ERROR(in_flight.Post(*groups[s.group], root_of(s.group, s.reader),
                                         std::span(m.dst, s.nbytes), {}));
      continue;
    }
    auto it = std::find_if(open.begin(), open.end(), [&](const Batch& b) {
      return b.group == s.group && b.reader == s.reader;
    });
    if (it != open.end() && it->bytes + s.nbytes > opts.broadcast_batch_bytes) {
      DCP_RETURN_IF_ERROR(send_batch(*it));
      open.erase(it);
      it = open.end();
    }
    if (it == open.end()) {
      open.push_back({s.group, s.reader, 0, {}});
      it = open.end() - 1;
    }
    it->items.push_back({m.dst, s.nbytes});
    it->bytes += s.nbytes;
  }
  for (Batch& b : open) DCP_RETURN_IF_ERROR(send_batch(b));
  Status drained = in_flight.Drain();
  reads.set_between_chunks(nullptr);
  return drained;
}

}  // namespace dcp::checkpoint
