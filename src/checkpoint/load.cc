// Load: metadata (read by rank 0, broadcast) -> local plan -> [identities gathered, readers
// and groups decided] -> shared shards read once and broadcast -> private reads grouped by
// file, straight into destination memory.
#include "checkpoint/load.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <stop_token>
#include <thread>
#include <unordered_map>

#include "checkpoint/broadcast_load.h"
#include "checkpoint/chunk_reads.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/rank_values.h"
#include "comm/exchange.h"
#include "comm/host_id.h"
#include "core/check.h"
#include "core/copy_runs.h"
#include "core/guarded.h"
#include "core/log.h"
#include "core/wire.h"
#include "metadata/codec.h"
#include "planner/broadcast_plan.h"
#include "planner/load_plan.h"
#include "planner/plan_classes.h"

namespace dcp::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

using ChunkRef = std::pair<uint32_t, uint32_t>;  // (state dict entry, chunk)
using Destinations = std::map<std::pair<uint32_t, Box>, ChunkRef>;

// This rank's destination shards that others may share: every non-empty tensor chunk it
// loads, keyed by (metadata tensor, box); a box held twice counts once (the first).
Destinations DestinationsOf(const StateDict& sd, const metadata::Metadata& md) {
  Destinations out;
  const auto& entries = sd.entries();
  for (uint32_t e = 0; e < entries.size(); ++e) {
    if (entries[e].kind != StateEntry::Kind::kTensor) continue;
    const metadata::TensorMeta* t = md.FindTensor(entries[e].fqn);
    if (!t) continue;
    const auto ti = static_cast<uint32_t>(t - md.tensors.data());
    for (uint32_t c = 0; c < entries[e].chunks.size(); ++c) {
      if (entries[e].chunks[c].box.Empty()) continue;
      out.try_emplace({ti, entries[e].chunks[c].box}, ChunkRef{e, c});
    }
  }
  return out;
}

planner::LoadIdentity IdentityOf(const StateDict& sd, const metadata::Metadata& md,
                                 const Destinations& dests) {
  planner::LoadIdentity id;
  for (const auto& [key, ref] : dests) {
    const TensorChunk& c = sd.entries()[ref.first].chunks[ref.second];
    id.shards.push_back({key.first, key.second,
                         *DTypeBytes(md.tensors[key.first].dtype, key.second.NumElements()),
                         c.view.memory == MemoryKind::kHost});
  }
  return id;
}

// Gathers identities (each distinct one sent once) and computes the broadcast plan. Also
// the point where ranks agree on planning errors, and on the options every rank must share.
Result<planner::BroadcastPlan> ExchangeIdentities(Comm& comm, const Status& plan_status,
                                                  const planner::LoadIdentity& id,
                                                  const metadata::Metadata* md,
                                                  const LoadOptions& opts,
                                                  const std::vector<std::vector<bool>>* readable,
                                                  bool cached_here, bool unshared_reads,
                                                  bool* all_cached_out, uint64_t* smallest_budget) {
  const std::string encoded = plan_status.ok() ? planner::EncodeLoadIdentity(id) : std::string();
  const bool verify = opts.verify_checksums && md && md->has_checksums;
  std::string hello;
  wire::Writer w(hello);
  w.Fixed64(planner::PlanHash(encoded));
  w.Fixed64(HostId());
  w.Fixed64(opts.max_broadcast_buffer_bytes);
  w.Byte(cached_here ? 1 : 0);
  w.Byte(unshared_reads ? 1 : 0);
  const size_t options_at = hello.size();
  w.Varint(opts.broadcast_batch_bytes);
  w.Varint(opts.broadcast_slab_bytes);
  w.Byte(verify ? 1 : 0);
  w.Byte(opts.broadcast_within_host ? 1 : 0);
  DCP_ASSIGN_OR_RETURN(auto hellos, AllGatherOrFail(comm, plan_status, hello));
  const int world = comm.size();
  std::vector<uint64_t> hash_of_rank(world), host_of_rank(world);
  // Each rank's buffer budget is its own, but how small slabs are packed per all-gather must
  // be the same everywhere: the smallest budget decides it.
  *smallest_budget = opts.max_broadcast_buffer_bytes;
  bool all_cached = true;
  // A rank whose storage its host's ranks do not read through a shared cache (an object
  // store): then every rank broadcasts within hosts too (the same decision everywhere).
  bool any_unshared = false;
  for (int r = 0; r < world; ++r) {
    wire::Reader rd(hellos[r]);
    hash_of_rank[r] = rd.Fixed64();
    host_of_rank[r] = rd.Fixed64();
    *smallest_budget = std::min(*smallest_budget, rd.Fixed64());
    const bool cached = rd.Byte() == 1;
    all_cached = all_cached && cached;
    any_unshared = any_unshared || rd.Byte() == 1;
    // Batching and sharing must be decided alike everywhere, or collectives diverge.
    if (hellos[r].substr(options_at) != hello.substr(options_at)) {
      return InvalidArgument(
          "ranks disagree on broadcast_batch_bytes, broadcast_slab_bytes, verify_checksums or "
          "broadcast_within_host: rank " +
          std::to_string(r) + " differs from rank " + std::to_string(comm.rank()));
    }
  }
  // Every rank reads from memory: nothing to share (the same decision everywhere).
  *all_cached_out = all_cached;
  if (all_cached) return planner::BroadcastPlan{};
  const planner::PlanClasses classes = planner::GroupByPlanHash(hash_of_rank);
  DCP_ASSIGN_OR_RETURN(auto lists,
                       comm.AllGather(classes.IsSender(comm.rank()) ? encoded : std::string()));
  std::vector<planner::LoadIdentity> distinct;
  for (const auto& h : classes.holders) {
    DCP_ASSIGN_OR_RETURN(auto d, planner::DecodeLoadIdentity(lists[h.front()]));
    distinct.push_back(std::move(d));
  }
  return planner::PlanBroadcast(
      distinct, classes.holders, world,
      {md, verify, opts.broadcast_within_host || any_unshared ? nullptr : &host_of_rank,
       opts.broadcast_slab_bytes, readable});
}

// This rank's part in the shared phase: its memory for each shared shard or slab of its
// groups and, as reader, the read items that fill it (in `shared_reads`, each cut to its
// slab); its regions of each shared stored chunk; and which read items the private phase must
// not do (they arrive by broadcast, or are done in the shared phase).
void MapToThisRank(const StateDict& sd, const metadata::Metadata& md,
                   const planner::LocalLoadPlan& plan, const planner::BroadcastPlan& bplan,
                   const std::vector<std::shared_ptr<Comm>>& groups, const Destinations& dests,
                   int me, std::vector<MyShard>* mine, std::vector<MyChunk>* my_chunks,
                   planner::LocalLoadPlan* shared_reads, std::vector<bool>* not_from_storage) {
  std::map<ChunkRef, std::vector<size_t>> slabs_of;  // shared entries of a destination chunk
  mine->resize(bplan.shards.size());
  for (size_t i = 0; i < bplan.shards.size(); ++i) {
    const auto& s = bplan.shards[i];
    if (!groups[s.group]) continue;
    const ChunkRef ref = dests.at({s.tensor, s.box});
    const TensorChunk& dst = sd.entries()[ref.first].chunks[ref.second];
    // A slab's rows are contiguous in the destination's row-major memory (the planner cuts
    // only where a row is whole bytes).
    uint64_t offset = 0;
    if (!(s.slab == s.box)) {
      const uint64_t row_bytes = *DTypeBytes(md.tensors[s.tensor].dtype, s.box.NumElements()) /
                                 static_cast<uint64_t>(s.box.lengths[0]);
      offset = static_cast<uint64_t>(s.slab.offsets[0] - s.box.offsets[0]) * row_bytes;
    }
    (*mine)[i].dst = dst.view.bytes() + offset;
    slabs_of[ref].push_back(i);
  }
  std::map<std::pair<uint32_t, uint32_t>, size_t> chunk_of;
  my_chunks->resize(bplan.chunks.size());
  for (size_t i = 0; i < bplan.chunks.size(); ++i) {
    (*my_chunks)[i].member = groups[bplan.chunks[i].group] != nullptr;
    chunk_of[{bplan.chunks[i].tensor, bplan.chunks[i].stored}] = i;
  }
  // `region` of read item `item` comes out of shared stored chunk `c`.
  auto from_shared_chunk = [&](const planner::ReadItem& item, size_t c, const Box& region) {
    MyChunk& m = (*my_chunks)[c];
    // The planner made every rank that performs a read of the chunk a member.
    DCP_CHECK(m.member);
    const TensorChunk& dst = sd.entries()[item.entry].chunks[item.dst_chunk];
    auto runs = CopyRuns::Make(md.tensors[item.tensor].dtype,
                               md.tensors[item.tensor].chunks[item.stored].box, dst.box, region);
    // PlanLoad made runs for the whole item, so a part of it cannot fail (and returning
    // here would leave peers waiting in the broadcasts).
    DCP_CHECK(runs.ok());
    m.runs.push_back(std::move(runs).value());
    m.targets.push_back({nullptr, dst.view.bytes()});
  };
  not_from_storage->assign(plan.reads.size(), false);
  for (uint32_t r = 0; r < plan.reads.size(); ++r) {
    const auto& item = plan.reads[r];
    auto chunk = chunk_of.find({item.tensor, item.stored});
    auto slabs = slabs_of.find({item.entry, item.dst_chunk});
    if (slabs == slabs_of.end()) {
      if (chunk != chunk_of.end()) {
        (*not_from_storage)[r] = true;
        from_shared_chunk(item, chunk->second, item.region);
      }
      continue;
    }
    // A shared destination: what falls in others' slabs arrives with their broadcasts; what
    // falls in mine is read (or copied out of a shared stored chunk) before I send it.
    (*not_from_storage)[r] = true;
    for (size_t i : slabs->second) {
      const auto& s = bplan.shards[i];
      if (s.reader != me) continue;
      auto part = Intersect(item.region, s.slab);
      if (!part || part->Empty()) continue;
      if (chunk != chunk_of.end()) {
        from_shared_chunk(item, chunk->second, *part);
      } else {
        (*mine)[i].read_items.push_back(static_cast<uint32_t>(shared_reads->reads.size()));
        shared_reads->reads.push_back(
            {item.entry, item.dst_chunk, item.tensor, item.stored, *part});
      }
    }
  }
  // CopyRuns addresses are stable only once every vector is filled.
  for (MyChunk& m : *my_chunks) {
    for (size_t k = 0; k < m.targets.size(); ++k) m.targets[k].runs = &m.runs[k];
  }
}

// What this rank reads from storage under the plan: whole stored chunks (of its private
// items, of the slabs it reads for others, of the shared chunks it reads) and bytes entries.
std::vector<ReadSpan> StorageReadsOf(const metadata::Metadata& md,
                                     const planner::LocalLoadPlan& plan,
                                     const std::vector<bool>& not_from_storage,
                                     const planner::LocalLoadPlan& shared_reads,
                                     const planner::BroadcastPlan& bplan, int me) {
  std::vector<ReadSpan> out;
  auto chunk = [&](uint32_t t, uint32_t s) {
    const auto& c = md.tensors[t].chunks[s];
    out.push_back({c.file, c.byte_offset, c.byte_length});
  };
  for (size_t r = 0; r < plan.reads.size(); ++r) {
    if (not_from_storage.empty() || !not_from_storage[r]) {
      chunk(plan.reads[r].tensor, plan.reads[r].stored);
    }
  }
  for (const auto& item : shared_reads.reads) chunk(item.tensor, item.stored);
  for (const auto& c : bplan.chunks) {
    if (c.reader == me) chunk(c.tensor, c.stored);
  }
  for (const auto& b : plan.bytes) {
    const auto& e = md.bytes[b.bytes];
    out.push_back({e.file, e.byte_offset, e.byte_length});
  }
  return out;
}

// Destination chunks whose memory another destination chunk shares (tied weights: two entries,
// one buffer), as (entry, chunk).
std::set<ChunkRef> AliasedChunks(const StateDict& sd) {
  struct Memory {
    const std::byte* begin;
    const std::byte* end;
    ChunkRef ref;
  };
  std::vector<Memory> mem;
  const auto& entries = sd.entries();
  for (uint32_t e = 0; e < entries.size(); ++e) {
    if (entries[e].kind != StateEntry::Kind::kTensor) continue;
    for (uint32_t c = 0; c < entries[e].chunks.size(); ++c) {
      const TensorView& v = entries[e].chunks[c].view;
      const uint64_t n = v.data ? v.NumBytes() : 0;  // validated by the plan
      if (n > 0) mem.push_back({v.bytes(), v.bytes() + n, {e, c}});
    }
  }
  std::sort(mem.begin(), mem.end(),
            [](const Memory& a, const Memory& b) { return std::less<>()(a.begin, b.begin); });
  std::set<ChunkRef> out;
  const Memory* reach = nullptr;  // of those so far, the one ending last
  for (const Memory& m : mem) {
    if (reach && std::less<>()(m.begin, reach->end)) {
      out.insert(m.ref);
      out.insert(reach->ref);
    }
    if (!reach || std::less<>()(reach->end, m.end)) reach = &m;
  }
  return out;
}

// The private items the shared phase does not touch: their stored chunks are neither read
// for a slab this rank sends nor shared whole with this rank as their reader, and their
// destination memory is no other destination's, so they can be read while the shared phase
// runs (all items of a stored chunk fall on the same side).
std::vector<uint32_t> IndependentPrivateItems(const StateDict& sd,
                                              const planner::LocalLoadPlan& plan,
                                              const std::vector<bool>& not_from_storage,
                                              const planner::LocalLoadPlan& shared_reads,
                                              const planner::BroadcastPlan& bplan, int me) {
  std::set<std::pair<uint32_t, uint32_t>> touched;  // (tensor, stored chunk)
  for (const auto& item : shared_reads.reads) touched.emplace(item.tensor, item.stored);
  for (const auto& c : bplan.chunks) {
    if (c.reader == me) touched.emplace(c.tensor, c.stored);
  }
  const std::set<ChunkRef> aliased = AliasedChunks(sd);
  for (const auto& r : plan.reads) {
    if (aliased.count({r.entry, r.dst_chunk})) touched.emplace(r.tensor, r.stored);
  }
  std::vector<uint32_t> out;
  for (uint32_t r = 0; r < plan.reads.size(); ++r) {
    if (!not_from_storage.empty() && not_from_storage[r]) continue;
    if (!touched.count({plan.reads[r].tensor, plan.reads[r].stored})) out.push_back(r);
  }
  return out;
}

}  // namespace

Result<LoadResult> Load(StateDict& sd, const std::string& dir, const LoadOptions& opts,
                        storage::FileSystem& fs) {
  return Load(sd, dir, opts, fs, nullptr);
}

Result<LoadResult> Load(StateDict& sd, const std::string& dir, const LoadOptions& opts,
                        storage::FileSystem& fs, const LoadHooks* hooks) {
  std::shared_ptr<Comm> comm = opts.comm ? opts.comm : LocalComm();
  const int me = comm->rank();
  LoadResult result;
  const auto t0 = Clock::now();

  // 1. Metadata: read once by rank 0 and broadcast, so thousands of ranks do not all
  //    read the same file from shared storage.
  std::string raw;
  Status st;
  std::optional<metadata::Metadata> built;  // the caller's, or rank 0's not read from a file
  const bool given = hooks && hooks->metadata;
  if (given) {
    built = *hooks->metadata;
  } else if (me == 0) {
    auto found = FindMetadata(fs, dir);
    st = found.status();
    if (found.ok()) {
      built = std::move(found->built);
      raw = built ? (comm->size() > 1 ? metadata::Encode(*built) : std::string())
                  : std::move(found->encoded);
    }
  }
  if (!given) {
    DCP_RETURN_IF_ERROR(BroadcastStatus(*comm, 0, st));
    if (comm->size() > 1) DCP_RETURN_IF_ERROR(comm->Broadcast(raw, 0));
  }
  auto md = built ? Result<metadata::Metadata>(std::move(*built)) : DecodeMetadata(raw, dir);
  if (md.ok()) md = WithRenamedTensors(std::move(md).value(), opts, dir);  // prefixes
  // Values saved per rank: this rank's own under their names (only bytes entries differ
  // between ranks' views, and each rank reads those itself).
  if (md.ok()) PickRankValues(*md, me, comm->size(), &result.warnings);
  const auto t1 = Clock::now();

  // 2. Local plan.
  Result<planner::LocalLoadPlan> plan =
      md.ok() ? Guarded("load plan: ",
                        [&] { return planner::PlanLoad(sd, *md, opts.allow_partial, dir); })
              : Result<planner::LocalLoadPlan>(md.status());
  const auto t2 = Clock::now();

  // 3. Who reads what: shared shards get one balanced reader each (every rank computes the
  //    same plan from the same gathered identities); planning errors are agreed on here.
  bool broadcast = opts.broadcast && comm->size() > 1 && comm->moves_tensor_data();
  planner::BroadcastPlan bplan;
  std::vector<std::shared_ptr<Comm>> groups;
  std::vector<MyShard> mine;
  std::vector<MyChunk> my_chunks;
  planner::LocalLoadPlan shared_reads;  // this rank's reads for the shards it sends
  std::vector<bool> not_from_storage;   // per read item: not in the private phase
  uint64_t smallest_budget = opts.max_broadcast_buffer_bytes;  // among all ranks
  if (broadcast) {
    Destinations dests;
    bool all_cached = false;
    if (plan.ok()) dests = DestinationsOf(sd, *md);
    DCP_ASSIGN_OR_RETURN(
        bplan,
        ExchangeIdentities(
            *comm, plan.status(), plan.ok() ? IdentityOf(sd, *md, dests) : planner::LoadIdentity(),
            md.ok() ? &*md : nullptr, opts, hooks ? hooks->readable : nullptr,
            !opts.broadcast_cached && plan.ok() &&
                ReadsAreCached(fs, dir, *md, *plan, hooks ? hooks->readable : nullptr, me),
            // Storage the ranks of a host read through no shared cache (an object store, where
            // each read is a request): a replicated shard is fetched once per job, not per rank.
            !fs.HostSharesReads(), &all_cached, &smallest_budget));
    // Every rank reads from its page cache: the private path, as without broadcast (agreed
    // in the exchange above).
    broadcast = !all_cached;
    if (broadcast) {
      DCP_ASSIGN_OR_RETURN(groups, ResolveGroups(comm, bplan, &result.groups_created));
      MapToThisRank(sd, *md, *plan, bplan, groups, dests, me, &mine, &my_chunks, &shared_reads,
                    &not_from_storage);
    }
  } else {
    DCP_RETURN_IF_ERROR(AgreeOnStatus(*comm, plan.status()));
  }
  if (hooks && hooks->before_reads) {
    DCP_RETURN_IF_ERROR(
        AgreeOnStatus(*comm, hooks->before_reads(StorageReadsOf(*md, *plan, not_from_storage,
                                                                shared_reads, bplan, me))));
  }
  const auto t3 = Clock::now();

  // 4. Shared shards first (others wait for them), then private ones grouped by file. The
  //    shared phase waits on other ranks' reads and transfers; the disk need not wait with it:
  //    where the file system takes reads from two threads, the private stored chunks the
  //    shared phase does not touch are read meanwhile by a second reader (each reader keeps
  //    half of the open-file limit).
  std::vector<uint32_t> ahead_items;
  if (broadcast && fs.ConcurrentReads() && opts.max_open_files >= 2) {
    ahead_items = IndependentPrivateItems(sd, *plan, not_from_storage, shared_reads, bplan, me);
  }
  LoadOptions half = opts;
  if (!ahead_items.empty()) half.max_open_files = opts.max_open_files / 2;
  ChunkReads reads(sd, *md, dir, half, fs, &result);
  // The private items this rank reads: a stored chunk that also feeds a slab it sends is
  // read once, in the shared phase, for both. Those read ahead are not this reader's.
  std::vector<bool> main_skips = not_from_storage;
  if (!ahead_items.empty()) {
    main_skips.resize(plan->reads.size(), false);
    for (uint32_t r : ahead_items) main_skips[r] = true;
  }
  if (broadcast) reads.set_private(&*plan, main_skips);
  LoadResult ahead_stats;
  ChunkReads ahead(sd, *md, dir, half, fs, &ahead_stats);
  ahead.set_private(&*plan, not_from_storage);
  Status ahead_failure;
  auto read_ahead = [&] {
    ahead_failure = Guarded("", [&] { return ahead.Read(*plan, ahead_items); });
  };
  // Declared after what it uses: an early return stops it (between stored chunks) and joins it
  // before they go.
  std::jthread ahead_thread;
  if (!ahead_items.empty()) {
    try {
      ahead_thread = std::jthread([&](std::stop_token stop) {
        ahead.set_stop(std::move(stop));
        read_ahead();
      });
    } catch (...) {  // no thread: read them after the shared phase
    }
  }
  Status read_failure;
  if (broadcast) {
    DCP_RETURN_IF_ERROR(RunSharedPhase(*comm, *md, bplan, groups, my_chunks, mine, shared_reads,
                                       reads, opts, smallest_budget, &result, &read_failure));
  }
  const auto t4 = Clock::now();
  if (ahead_thread.joinable()) {
    if (!read_failure.ok()) ahead_thread.request_stop();  // the load fails anyway
    ahead_thread.join();
  } else if (!ahead_items.empty() && read_failure.ok()) {
    read_ahead();
  }
  result.bytes_read += ahead_stats.bytes_read;
  result.files_opened += ahead_stats.files_opened;
  result.chunks_read += ahead_stats.chunks_read;
  ahead.set_max_open_files(0);
  reads.set_max_open_files(static_cast<size_t>(opts.max_open_files));
  ChunkReads* failed_reader = read_failure.ok() ? nullptr : &reads;
  if (read_failure.ok() && !ahead_failure.ok()) {
    read_failure = ahead_failure;
    failed_reader = &ahead;
  }
  if (failed_reader == &reads && !reads.damaged_file()) failed_reader = &ahead;
  if (read_failure.ok()) {
    std::vector<uint32_t> private_items;
    for (uint32_t r = 0; r < plan->reads.size(); ++r) {
      if (main_skips.empty() || !main_skips[r]) private_items.push_back(r);
    }
    read_failure = Guarded("", [&] { return reads.Read(*plan, private_items); });
    if (read_failure.ok()) {
      read_failure = Guarded("", [&] { return reads.ReadBytesEntries(*plan); });
    }
    if (!read_failure.ok()) failed_reader = &reads;
  }
  if (failed_reader && hooks && hooks->damaged && failed_reader->damaged_file()) {
    hooks->damaged(*failed_reader->damaged_file(), read_failure);
  }
  // A read failure anywhere is a load failure everywhere.
  DCP_RETURN_IF_ERROR(AgreeOnStatus(*comm, read_failure));
  const auto t5 = Clock::now();

  result.entries_loaded = sd.size() - plan->skipped.size();
  result.entries_skipped = plan->skipped.size();
  result.metadata_seconds = Seconds(t0, t1);
  result.plan_seconds = Seconds(t1, t2);
  result.exchange_seconds = Seconds(t2, t3);
  result.shared_seconds = Seconds(t3, t4);
  result.private_seconds = Seconds(t4, t5);
  result.read_seconds = Seconds(t3, t5);
  result.total_seconds = Seconds(t0, t5);
  if (LogEnabled()) {
    std::fprintf(stderr,
                 "dcp load %s rank %d/%d: metadata %.3f s, plan %.3f s, exchange %.3f s, shared "
                 "%.3f s, private %.3f s, total %.3f s; read %llu B from %llu files, %llu shared "
                 "shards (%llu read for others), %llu broadcasts (%llu batches), sent %llu B, "
                 "received %llu B, %llu groups created\n",
                 dir.c_str(), me, comm->size(), result.metadata_seconds, result.plan_seconds,
                 result.exchange_seconds, result.shared_seconds, result.private_seconds,
                 result.total_seconds, (unsigned long long)result.bytes_read,
                 (unsigned long long)result.files_opened, (unsigned long long)result.shared_shards,
                 (unsigned long long)result.shards_read_for_others,
                 (unsigned long long)result.broadcasts, (unsigned long long)result.batches,
                 (unsigned long long)result.bytes_sent, (unsigned long long)result.bytes_received,
                 (unsigned long long)result.groups_created);
  }
  return result;
}

}  // namespace dcp::checkpoint
