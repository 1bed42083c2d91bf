// The memory tier's restore (MemoryTier::Restore): choose the step, move what hosts lack
// (checked as it arrives), load through the ordinary engine (which verifies what it reads).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "checkpoint/load.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/names.h"
#include "comm/exchange.h"
#include "core/log.h"
#include "core/wire.h"
#include "tier/host_dir.h"
#include "tier/memory_tier.h"

namespace dcp::tier {
namespace {

using storage::JoinPath;

std::string EncodeSpans(const NeededSpans& needed) {
  std::string out;
  wire::Writer w(out);
  for (const auto& [f, spans] : needed) {
    w.Varint(f);
    w.Varint(spans.size());
    for (const Span& s : spans) {
      w.Varint(s.offset);
      w.Varint(s.length);
    }
  }
  return out;
}

// Adds the decoded spans to `into`.
Status DecodeSpans(std::string_view data, NeededSpans* into) {
  wire::Reader r(data);
  while (!r.AtEnd() && r.ok()) {
    const auto f = static_cast<uint32_t>(r.Varint());
    const uint64_t n = r.Varint();
    auto& spans = (*into)[f];
    for (uint64_t i = 0; i < n && r.ok(); ++i) {
      const uint64_t offset = r.Varint();
      spans.push_back({offset, r.Varint()});
    }
  }
  if (!r.ok()) return DataLoss("corrupt file list received");
  return OkStatus();
}

// Where hosts hold different metadata for one step (a stale copy of another save under the
// same number) and the step is complete in durable storage, the durable copy's digest says
// which is this run's: rank 0 reads it and every rank learns it (all see the same dispute).
// Only one such step can be restored from memory: `only_step`, or else the newest durable
// step (an older memory step loses to it).
Result<std::map<int64_t, uint64_t>> DurableDigests(Comm& comm,
                                                   const std::vector<Inventory>& inventories,
                                                   const DurableSteps& durable,
                                                   std::optional<int64_t> only_step) {
  std::vector<int64_t> asked;
  if (durable.fs && !durable.complete.empty()) {
    const int64_t s = only_step ? *only_step : *durable.complete.rbegin();
    const std::vector<int64_t> disputed = DisputedSteps(inventories);
    // (An incremental durable copy's metadata is its own: it matches no memory copy.)
    if (durable.FileSources().count(s) && std::count(disputed.begin(), disputed.end(), s)) {
      asked.push_back(s);
    }
  }
  std::map<int64_t, uint64_t> out;
  if (asked.empty()) return out;
  std::string payload;
  if (comm.rank() == 0) {
    wire::Writer w(payload);
    for (int64_t s : asked) {
      auto raw = storage::ReadWholeFile(
          *durable.fs, JoinPath(durable.dir_of(s), std::string(checkpoint::kMetadataName)));
      w.Varint(raw.ok() ? Digest(*raw) : 0);  // unreadable: no preference
    }
  }
  DCP_RETURN_IF_ERROR(comm.Broadcast(payload, 0));
  wire::Reader r(payload);
  for (int64_t s : asked) {
    const uint64_t d = r.Varint();
    if (d != 0) out[s] = d;
  }
  if (!r.ok()) return DataLoss("memory tier: corrupt durable digests received");
  return out;
}

}  // namespace

Result<std::optional<LoadResult>> MemoryTier::Restore(PairGroups& groups, StateDict& sd,
                                                      const LoadOptions& opts,
                                                      const DurableSteps& durable,
                                                      std::optional<int64_t> only_step,
                                                      Account* account) const {
  Comm& comm = groups.world();
  const int me = comm.rank(), host = my_host();
  using Clock = std::chrono::steady_clock;
  auto t = Clock::now();
  std::string timings;  // DCP_LOG=1: where the time went
  auto lap = [&](const char* what) {
    const auto now = Clock::now();
    char b[64];
    std::snprintf(b, sizeof(b), " %s %.3f s", what, std::chrono::duration<double>(now - t).count());
    timings += b;
    t = now;
  };
  DCP_ASSIGN_OR_RETURN(const std::vector<Inventory> inventories, Survey(comm));
  lap("survey");
  DCP_ASSIGN_OR_RETURN(const auto preferred, DurableDigests(comm, inventories, durable, only_step));
  std::set<BadCopy> bad;
  int64_t below = only_step ? *only_step + 1 : INT64_MAX;
  std::string* fell_back = &account->fell_back;
  auto pass_over = [&](int64_t step, const Status& why) {
    const std::string line = "step " + std::to_string(step) + " in memory: " + why.message();
    *fell_back += (fell_back->empty() ? "" : "; ") + line;
    if (me == 0) std::fprintf(stderr, "dcp manager: %s\n", line.c_str());
  };
  // Every damaged copy, found anywhere, named with its holder: the same lines on every rank
  // (built from gathered reports), printed once.
  auto report_damaged = [&](const BadCopy& b, const std::string& why) {
    const std::string line = "host " + hosts_.names[b.host] + ": step " + std::to_string(b.step) +
                             ", " + b.file + ": " + why;
    account->damaged_copies.push_back(line);
    if (me == 0)
      std::fprintf(stderr, "dcp manager: damaged memory tier copy on %s\n", line.c_str());
  };
  // A step given up because its damaged copies left a file without an intact one says so.
  int64_t tried = -1;
  auto gave_up = [&](std::optional<int64_t> now) {
    if (tried < 0 || (now && *now == tried)) return;
    std::string files;
    for (const BadCopy& b : bad) {
      if (b.step == tried) files += (files.empty() ? "" : ", ") + b.file;
    }
    pass_over(tried, DataLoss("no intact copy of every file left (damaged: " + files + ")"));
    tried = -1;
  };
  const std::set<int64_t> file_sources = durable.FileSources();
  while (true) {
    const std::optional<MemoryStep> found_step =
        ChooseMemoryStep(inventories, bad, file_sources, below, preferred);
    gave_up(found_step ? std::optional<int64_t>(found_step->step) : std::nullopt);
    if (!found_step || (only_step && found_step->step != *only_step)) {
      return std::optional<LoadResult>();
    }
    const MemoryStep* choice = &*found_step;
    // A newer durable step wins; on a tie, memory (files it lacks come from storage).
    if (!only_step && !durable.complete.empty() && *durable.complete.rbegin() > choice->step) {
      return std::optional<LoadResult>();
    }
    const int64_t step = choice->step;
    const std::string dir = StepDir(step);

    // 1. The metadata, from a host holding the chosen copy.
    const int md_rank = hosts_.ranks[choice->metadata_hosts.front()].front();
    std::string raw;
    Status st;
    if (me == md_rank) {
      auto r =
          storage::ReadWholeFile(Local(), JoinPath(dir, std::string(checkpoint::kMetadataName)));
      st = r.status();
      if (r.ok() && Digest(*r) != choice->metadata_digest) {
        st = DataLoss(dir + ": metadata changed while restoring");
      }
      if (st.ok()) raw = std::move(r).value();
    }
    DCP_RETURN_IF_ERROR(BroadcastStatus(comm, md_rank, st));
    DCP_RETURN_IF_ERROR(comm.Broadcast(raw, md_rank));
    auto md = checkpoint::DecodeMetadata(raw, dir);

    DCP_RETURN_IF_ERROR(AgreeOnStatus(comm, md.status()));

    // 2. The chosen metadata goes to the load directly (LoadHooks::metadata), and onto hosts
    //    that lack it or hold another copy only once the load verified it (step 4): a choice
    //    that turns out damaged or stale never destroys the copy it was chosen over.
    const StepCopy* held = nullptr;
    for (const StepCopy& c : inventories[host]) {
      if (c.step == step) held = &c;
    }
    // Every host holds every file (one host, or as many replicas as hosts): nothing can move,
    // so the restore adds no collective to the load's own.
    const bool everywhere = std::all_of(
        choice->holders.begin(), choice->holders.end(),
        [&](const std::vector<int>& h) { return static_cast<int>(h.size()) == hosts_.size(); });

    // 3. The load, planned so that every stored chunk is read on a host that holds its file
    //    (by the least loaded rank that can, when a rank needing it cannot) and broadcast to
    //    the ranks needing it. Before any read, each host receives only what its ranks still
    //    read from files it lacks -- bytes entries, files no tier holds (from a partner's
    //    memory, or from the root) -- checked as they arrive (a damage is the sender's copy);
    //    the load verifies every copy it reads and names a damaged one. A damaged copy is
    //    passed over: choose again without it.
    std::vector<std::vector<bool>> readable(comm.size(), std::vector<bool>(md->files.size()));
    for (int r = 0; r < comm.size(); ++r) {
      for (uint32_t f = 0; f < choice->files.size() && f < md->files.size(); ++f) {
        const auto& h = choice->holders[f];
        readable[r][f] = std::find(h.begin(), h.end(), hosts_.host_of_rank[r]) != h.end();
      }
    }
    TransferStats stats;
    std::set<BadCopy> found_bad, arrived_bad;
    bool storage_failed = false;
    std::string receiver_failed;  // the first receiver that could not store a file
    const metadata::Metadata& meta = *md;
    // Copies in memory are always verified, whatever `verify_checksums` says: the restore's
    // promise is the right bytes or an older step.
    LoadOptions verified = opts;
    verified.verify_checksums = true;
    std::optional<uint32_t> damaged_here;  // the load reports the first it found
    std::string damaged_why;
    checkpoint::LoadHooks hooks;
    hooks.readable = &readable;
    hooks.metadata = &meta;
    hooks.damaged = [&](uint32_t f, const Status& why) {
      damaged_here = f;
      damaged_why = why.message();
    };
    hooks.before_reads = [&](const std::vector<checkpoint::ReadSpan>& reads) -> Status {
      if (everywhere) {
        lap("plan");
        return OkStatus();
      }
      NeededSpans needed;
      for (const auto& r : reads) needed[r.file].push_back({r.offset, r.length});
      for (auto& [f, spans] : needed) spans = storage::MergeRanges(std::move(spans));
      DCP_ASSIGN_OR_RETURN(auto lists, comm.AllGather(EncodeSpans(needed)));
      std::vector<NeededSpans> needed_by_host(hosts_.size());
      for (int r = 0; r < comm.size(); ++r) {
        DCP_RETURN_IF_ERROR(DecodeSpans(lists[r], &needed_by_host[hosts_.host_of_rank[r]]));
      }
      const RestorePlan plan = PlanRestore(hosts_, *choice, needed_by_host);
      lap("plan");
      if (plan.fetches.empty()) return OkStatus();  // the same on every rank
      // A receiver's directory; a failure to make it shows as the receiver's failure below.
      if (std::any_of(plan.fetches.begin(), plan.fetches.end(),
                      [me](const Transfer& t) { return t.to == me; })) {
        (void)Local().CreateDirs(dir);
      }
      TransferDirs dirs{&Local(), dir, durable.fs,
                        file_sources.count(step) ? durable.dir_of(step) : std::string()};
      DCP_RETURN_IF_ERROR(
          TransferFiles(groups, plan.fetches, dirs, {}, ReceiveChecks(meta), &stats));
      // Copies that arrived damaged (or that their sender could not read) are passed over
      // next time; a receiver that could not write a file (its own disk) condemns no copy: the
      // step cannot be restored onto this topology, named with the host and the cause. The
      // same verdict everywhere.
      std::string my_failed;
      wire::Writer w(my_failed);
      w.String(stats.local_failure.ok() ? "" : stats.local_failure.message());
      for (const TransferStats::Failed& f : stats.failed) {
        w.Varint(static_cast<uint64_t>(f.transfer.from + 1));
        w.String(f.transfer.file);
        w.Varint(f.damaged ? 1 : 0);
      }
      DCP_ASSIGN_OR_RETURN(auto failed_lists, comm.AllGather(my_failed));
      for (int r = 0; r < comm.size(); ++r) {
        wire::Reader rd(failed_lists[r]);
        const std::string cause(rd.String());
        while (!rd.AtEnd() && rd.ok()) {
          const int from = static_cast<int>(rd.Varint()) - 1;
          const std::string file(rd.String());
          const bool damaged = rd.Varint() != 0;
          if (from == kFromStorage) {
            storage_failed = true;
          } else if (damaged) {
            BadCopy b{hosts_.host_of_rank[from], step, file};
            if (!bad.count(b) && arrived_bad.insert(b).second) {
              report_damaged(b, "arrived damaged at host " + hosts_.names[hosts_.host_of_rank[r]] +
                                    " (rank " + std::to_string(r) + ")" +
                                    (cause.empty() ? "" : ": " + cause));
            }
          } else if (receiver_failed.empty()) {
            receiver_failed = "host " + hosts_.names[hosts_.host_of_rank[r]] + " (rank " +
                              std::to_string(r) + ") could not store " + file +
                              " received from host " + hosts_.names[hosts_.host_of_rank[from]] +
                              ": " + cause;
          }
        }
      }
      lap("fetch");
      timings += " (sent " + std::to_string(stats.bytes_sent) + " B, received " +
                 std::to_string(stats.bytes_received + stats.bytes_copied_from_storage) + " B)";
      if (storage_failed || !arrived_bad.empty()) {
        return DataLoss("memory tier: copies of step " + std::to_string(step) + " arrived damaged");
      }
      if (!receiver_failed.empty()) return Unavailable("memory tier: " + receiver_failed);
      return OkStatus();
    };
    Result<LoadResult> loaded = checkpoint::Load(sd, dir, verified, Local(), &hooks);
    lap("load");
    if (!loaded.ok() && loaded.status().agreed()) {
      // Every rank is here (the failure was agreed on; the first failing rank's error may be
      // another than a damage): the copies the load found damaged are this step's bad ones,
      // on the hosts of the ranks that read them. A damaged
      // copy received for this load (its host is no holder) changes no choice: the retry
      // fetches it again, and a second damage gives the step up (no new bad copy, below).
      std::string mine;
      wire::Writer w(mine);
      if (damaged_here) {
        w.String(meta.files[*damaged_here].name);
        w.String(damaged_why);
      }
      DCP_ASSIGN_OR_RETURN(auto lists, comm.AllGather(mine));
      for (int r = 0; r < comm.size(); ++r) {
        wire::Reader rd(lists[r]);
        while (!rd.AtEnd() && rd.ok()) {
          BadCopy b{hosts_.host_of_rank[r], step, std::string(rd.String())};
          const std::string why(rd.String());
          if (!bad.count(b) && found_bad.insert(b).second) {
            report_damaged(b, "read by rank " + std::to_string(r) + ": " + why);
          }
        }
      }
    }
    // Sparse copies served this load only; a crash before this leaves them marked (Survey).
    for (const std::string& f : stats.sparse_files) {
      (void)Local().Remove(JoinPath(dir, f));
      (void)Local().Remove(JoinPath(dir, SparseMarkerName(f)));
    }
    if (LogEnabled()) {
      std::fprintf(stderr, "dcp restore from memory, rank %d (host %s), step %lld:%s\n", me,
                   hosts_.names[host].c_str(), static_cast<long long>(step), timings.c_str());
    }
    if (loaded.ok()) {
      // 4. The verified metadata onto this host where it lacked it, or held another copy (a
      //    stale one of another run): that one is kept beside it, not written over. Best effort:
      //    the load is done.
      if (first_of_host() && (!held || held->metadata_digest != choice->metadata_digest)) {
        const std::string path = JoinPath(dir, std::string(checkpoint::kMetadataName));
        Status w = Local().CreateDirs(dir);  // a host that received nothing has none yet
        if (w.ok() && held && held->metadata_digest != 0) {
          char aside[40];
          std::snprintf(aside, sizeof(aside), ".other-%016llx",
                        static_cast<unsigned long long>(held->metadata_digest));
          w = Local().Rename(path, path + aside);
        }
        if (w.ok()) w = Local().WriteAtomic(path, raw, ".tmp-restore");
        if (!w.ok()) {
          std::fprintf(stderr, "dcp manager: memory tier on host %s: %s\n",
                       hosts_.names[host].c_str(), w.message().c_str());
        }
      }
      loaded->step = step;
      loaded->from_memory = true;
      loaded->files_from_peers = stats.files_received - stats.files_from_storage;
      loaded->files_from_storage = stats.files_from_storage;
      loaded->fell_back = *fell_back;
      loaded->damaged_copies = account->damaged_copies;
      return std::optional<LoadResult>(*std::move(loaded));
    }
    if (!found_bad.empty() || (!arrived_bad.empty() && !storage_failed)) {
      bad.merge(found_bad);
      bad.merge(arrived_bad);
      tried = step;
      continue;
    }
    if (storage_failed) {
      pass_over(step, DataLoss("a file could not be copied from durable storage"));
      below = step;
      continue;
    }
    if (!receiver_failed.empty()) {  // no copy is bad: an older step or the root, said why
      pass_over(step, Unavailable(receiver_failed));
      below = step;
      continue;
    }
    const StatusCode code = loaded.status().code();
    if (only_step || (code != StatusCode::kDataLoss && code != StatusCode::kNotFound)) {
      return loaded.status();
    }
    pass_over(step, loaded.status());
    below = step;
  }
}

}  // namespace dcp::tier
