#include "tier/memory_tier.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include "checkpoint/load.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/names.h"
#include "checkpoint/verify.h"
#include "comm/exchange.h"
#include "comm/host_id.h"
#include "core/log.h"
#include "core/wire.h"
#include "metadata/codec.h"
#include "planner/load_plan.h"

namespace dcp::tier {
namespace {

using storage::JoinPath;

storage::FileSystem& Local() { return storage::PosixFileSystem(); }

// A host name as one path component.
std::string PathSafe(std::string s) {
  for (char& c : s) {
    if (c == '/' || c == '\0' || static_cast<unsigned char>(c) < 0x20) c = '_';
  }
  if (s.empty() || s == "." || s == "..") s = "_" + s;
  return s;
}

uint64_t Digest(std::string_view raw) { return XXH3_64bits(raw.data(), raw.size()) | 1; }

// The step directories of a host directory, newest first.
std::vector<std::pair<int64_t, std::string>> StepDirs(const std::string& host_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  auto names = Local().List(host_dir);
  if (!names.ok()) return out;
  for (const auto& n : *names) {
    if (auto step = checkpoint::ParseStepDirName(n)) out.push_back({*step, JoinPath(host_dir, n)});
  }
  std::sort(out.begin(), out.end(), std::greater<>());
  return out;
}

uint64_t DirBytes(const std::string& dir) {
  uint64_t total = 0;
  auto names = Local().List(dir);
  if (!names.ok()) return 0;
  for (const auto& n : *names) {
    if (auto size = Local().FileSize(JoinPath(dir, n)); size.ok()) total += *size;
  }
  return total;
}

void RemoveTree(const std::string& dir) {
  if (auto names = Local().List(dir); names.ok()) {
    for (const auto& n : *names) (void)Local().Remove(JoinPath(dir, n));
  }
  (void)Local().Remove(dir);
}

bool IsPartName(std::string_view n) { return n.ends_with(".part"); }

// What a host directory holds of one step; with `tidy`, pieces of interrupted transfers are
// removed.
StepCopy ScanStep(int64_t step, const std::string& dir, bool tidy) {
  StepCopy c;
  c.step = step;
  if (auto names = Local().List(dir); names.ok()) {
    const std::set<std::string> all(names->begin(), names->end());
    for (const auto& n : *names) {
      // A sparse copy (a restore's, for one load) is no copy: without a tidy it is skipped,
      // with one it goes, its marker last.
      const bool sparse = all.count(SparseMarkerName(n)) > 0;
      if (IsPartName(n) || (sparse && tidy)) {
        if (tidy) (void)Local().Remove(JoinPath(dir, n));
      } else if (checkpoint::IsDcpDataFileName(n) && !sparse) {
        if (auto size = Local().FileSize(JoinPath(dir, n)); size.ok()) {
          c.present.push_back({n, *size});
        }
      }
    }
    if (tidy) {
      for (const auto& n : *names) {
        if (n.ends_with(".sparse")) (void)Local().Remove(JoinPath(dir, n));
      }
    }
  }
  auto raw = storage::ReadWholeFile(Local(), JoinPath(dir, std::string(checkpoint::kMetadataName)));
  if (!raw.ok()) return c;
  auto md = metadata::Decode(*raw);
  if (!md.ok()) return c;
  c.metadata_digest = Digest(*raw);
  for (const auto& f : md->files) c.required.push_back({f.name, f.size});
  return c;
}

Inventory ScanHost(const std::string& host_dir, bool tidy) {
  Inventory inv;
  for (const auto& [step, dir] : StepDirs(host_dir)) inv.push_back(ScanStep(step, dir, tidy));
  return inv;
}

// The metadata of `dir` and its bytes.
Result<std::pair<metadata::Metadata, std::string>> ReadStepMetadata(const std::string& dir) {
  DCP_ASSIGN_OR_RETURN(
      std::string raw,
      storage::ReadWholeFile(Local(), JoinPath(dir, std::string(checkpoint::kMetadataName))));
  DCP_ASSIGN_OR_RETURN(auto md, checkpoint::DecodeMetadata(raw, dir));
  return std::make_pair(std::move(md), std::move(raw));
}

// Verifies a file received or about to be used against `md` (found by name); of a sparse
// copy, the stored chunks inside its spans.
Status CheckFile(const metadata::Metadata& md, const std::string& name, const std::string& path,
                 const std::vector<Span>& spans = {}) {
  std::vector<std::pair<uint64_t, uint64_t>> pairs;
  for (const Span& s : spans) pairs.push_back({s.offset, s.length});
  for (uint32_t f = 0; f < md.files.size(); ++f) {
    if (md.files[f].name == name) {
      return checkpoint::VerifyDataFileSpans(Local(), path, md, f, pairs);
    }
  }
  return DataLoss(path + ": not a data file of the step's metadata");
}

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

}  // namespace

std::string HostTierDir(const std::string& base, const std::string& root) {
  std::string key = root;
  if (!storage::IsObjectStorePath(root)) {
    std::error_code ec;
    auto abs = std::filesystem::absolute(root, ec);
    if (!ec) key = abs.lexically_normal().string();
  }
  while (key.size() > 1 && key.back() == '/') key.pop_back();
  char hex[24];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  return JoinPath(JoinPath(base, std::string("root-") + hex), PathSafe(HostName()));
}

Result<Inventory> ScanHostTier(const std::string& base, const std::string& root) {
  const std::string dir = HostTierDir(base, root);
  if (!Local().List(dir).ok())
    return NotFound("no memory tier of " + root + " on this host (" + dir + ")");
  return ScanHost(dir, /*tidy=*/false);
}

Result<std::unique_ptr<MemoryTier>> MemoryTier::Open(const std::string& root,
                                                     const MemoryTierOptions& opts, Comm& comm) {
  Status st;
  if (opts.dir.empty()) st = InvalidArgument("memory tier: dir is empty");
  if (opts.replicas < 0) st = InvalidArgument("memory tier: replicas must be 0 or more");
  if (opts.keep_last < 1) st = InvalidArgument("memory tier: keep_last must be 1 or more");
  if (opts.persist_every < 0) st = InvalidArgument("memory tier: persist_every must be 0 or more");
  if (comm.size() > 1 && !comm.moves_tensor_data()) {
    st = InvalidArgument("memory tier: the " + std::string(comm.backend()) +
                         " communicator carries no data between ranks; replication and restore "
                         "need one that does (MPI, or the torch process group)");
  }
  const std::string host_dir = HostTierDir(opts.dir, root);
  DCP_ASSIGN_OR_RETURN(auto names, AllGatherOrFail(comm, st, HostName()));
  std::unique_ptr<MemoryTier> tier(new MemoryTier(opts, host_dir, Hosts::From(names), comm.rank()));
  Status made;
  if (tier->first_of_host()) {
    made = Local().CreateDirs(host_dir).Annotate("memory tier on host " + HostName() + ": ");
  }
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm, made));
  return tier;
}

std::string MemoryTier::StepDir(int64_t step) const {
  return JoinPath(host_dir_, checkpoint::StepDirName(step));
}

Result<std::vector<Inventory>> MemoryTier::Survey(Comm& comm) const {
  const std::string mine =
      first_of_host() ? EncodeInventory(ScanHost(host_dir_, /*tidy=*/true)) : std::string();
  DCP_ASSIGN_OR_RETURN(auto all, comm.AllGather(mine));
  std::vector<Inventory> by_host(hosts_.size());
  for (int h = 0; h < hosts_.size(); ++h) {
    DCP_ASSIGN_OR_RETURN(by_host[h], DecodeInventory(all[hosts_.ranks[h].front()]));
  }
  return by_host;
}

Result<std::string> MemoryTier::CheckBudget(Comm& comm, uint64_t my_bytes, size_t kept) const {
  if (opts_.max_bytes == 0) return std::string();
  uint64_t kept_bytes = 0;
  if (first_of_host()) {
    auto dirs = StepDirs(host_dir_);
    for (size_t i = 0; i < dirs.size() && i < kept; ++i) kept_bytes += DirBytes(dirs[i].second);
  }
  std::string mine;
  wire::Writer w(mine);
  w.Varint(my_bytes);
  w.Varint(kept_bytes);
  DCP_ASSIGN_OR_RETURN(auto all, comm.AllGather(mine));
  std::vector<uint64_t> bytes(all.size()), kept_of(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    wire::Reader rd(all[r]);
    bytes[r] = rd.Varint();
    kept_of[r] = rd.Varint();
  }
  std::vector<uint64_t> need(hosts_.size(), 0);
  for (int g = 0; g < hosts_.size(); ++g) {
    uint64_t own = 0;
    for (int r : hosts_.ranks[g]) own += bytes[r];
    need[g] += own + kept_of[hosts_.ranks[g].front()];
    for (int p : PartnersOf(hosts_, g, opts_.replicas)) need[p] += own;
  }
  for (int h = 0; h < hosts_.size(); ++h) {
    if (need[h] > opts_.max_bytes) {
      return "host " + hosts_.names[h] + " would hold up to " + std::to_string(need[h]) +
             " bytes of memory tier (its ranks' state, its partners' and the steps it keeps), "
             "over max_bytes " +
             std::to_string(opts_.max_bytes);
    }
  }
  return std::string();
}

Status MemoryTier::Replicate(PairGroups& groups, int64_t step, TransferStats* stats) const {
  Comm& comm = groups.world();
  auto md = ReadStepMetadata(StepDir(step));
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm, md.status()));
  std::vector<std::vector<FileRef>> files_of_rank(comm.size());
  for (const auto& f : md->first.files) {
    const int writer = checkpoint::DataFileRank(f.name);
    if (writer >= 0 && writer < comm.size()) files_of_rank[writer].push_back({f.name, f.size});
  }
  const auto transfers = PlanReplication(hosts_, opts_.replicas, files_of_rank);
  TransferDirs dirs{&Local(), StepDir(step), nullptr, {}};
  TransferOptions topts;
  topts.max_bytes_per_second = opts_.replication_bytes_per_second;
  const metadata::Metadata& meta = md->first;
  DCP_RETURN_IF_ERROR(TransferFiles(
      groups, transfers, dirs, topts,
      [&](const Transfer& t, const std::string& path) { return CheckFile(meta, t.file, path); },
      stats));
  return stats->local_failure;
}

Status MemoryTier::Drain(Comm& comm, int64_t step, storage::FileSystem& fs,
                         const std::string& dst) const {
  const int me = comm.rank();
  Status st;
  if (me == 0) st = fs.CreateDirs(dst);
  DCP_RETURN_IF_ERROR(
      BroadcastStatus(comm, 0, st.Annotate("persist step " + std::to_string(step) + ": ")));
  auto md = ReadStepMetadata(StepDir(step));
  Status copied = md.status();
  for (size_t f = 0; copied.ok() && f < md->first.files.size(); ++f) {
    const std::string& name = md->first.files[f].name;
    if (checkpoint::DataFileRank(name) != me) continue;
    copied = CopyFile(Local(), JoinPath(StepDir(step), name), fs, JoinPath(dst, name));
  }
  DCP_RETURN_IF_ERROR(AgreeOnStatus(
      comm, copied.Annotate("persist step " + std::to_string(step) + " to " + dst + ": ")));
  // The metadata last: the durable step is complete only once every file is there.
  if (me == 0) {
    st = fs.WriteAtomic(JoinPath(dst, std::string(checkpoint::kMetadataName)), md->second,
                        ".tmp-drain")
             .Annotate("persist step " + std::to_string(step) + " to " + dst + ": ");
  }
  return BroadcastStatus(comm, 0, st);
}

void MemoryTier::Retain(size_t keep) const {
  if (!first_of_host()) return;
  auto dirs = StepDirs(host_dir_);
  for (size_t i = 0; i < dirs.size(); ++i) {
    if (i >= keep) RemoveTree(dirs[i].second);
  }
}

Status MemoryTier::VerifyCopiesInUse(Comm& comm, const MemoryStep& choice,
                                     const metadata::Metadata& md, const NeededSpans& read_here,
                                     const std::vector<Transfer>& fetches, const std::string& dir,
                                     std::set<BadCopy>* bad) const {
  const int me = comm.rank(), host = my_host();
  std::map<std::string, std::vector<Span>> in_use;
  for (const auto& [f, spans] : read_here) {
    const auto& h = choice.holders[f];
    if (std::find(h.begin(), h.end(), host) == h.end()) continue;
    auto& v = in_use[choice.files[f].name];
    v.insert(v.end(), spans.begin(), spans.end());
  }
  for (const Transfer& t : fetches) {
    if (t.from == kFromStorage || hosts_.host_of_rank[t.from] != host) continue;
    auto& v = in_use[t.file];
    if (t.spans.empty()) {
      v.push_back({0, t.size});
    } else {
      v.insert(v.end(), t.spans.begin(), t.spans.end());
    }
  }
  std::string mine;
  wire::Writer w(mine);
  const auto& local = hosts_.ranks[host];
  const size_t my_turn = std::lower_bound(local.begin(), local.end(), me) - local.begin();
  size_t i = 0;
  for (const auto& [name, spans] : in_use) {
    if (i++ % local.size() != my_turn) continue;
    Status ok = CheckFile(md, name, JoinPath(dir, name), MergeSpans(spans));
    if (!ok.ok()) {
      std::fprintf(stderr, "dcp manager: memory tier copy on host %s: %s\n",
                   hosts_.names[host].c_str(), ok.message().c_str());
      w.String(name);
    }
  }
  DCP_ASSIGN_OR_RETURN(auto all, comm.AllGather(mine));
  for (int r = 0; r < comm.size(); ++r) {
    wire::Reader rd(all[r]);
    while (!rd.AtEnd() && rd.ok()) {
      bad->insert({hosts_.host_of_rank[r], choice.step, std::string(rd.String())});
    }
  }
  return OkStatus();
}

Result<std::optional<LoadResult>> MemoryTier::Restore(PairGroups& groups, StateDict& sd,
                                                      const LoadOptions& opts,
                                                      const DurableSteps& durable,
                                                      std::optional<int64_t> only_step,
                                                      std::string* fell_back) const {
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
  std::set<BadCopy> bad;
  int64_t below = only_step ? *only_step + 1 : INT64_MAX;
  auto pass_over = [&](int64_t step, const Status& why) {
    const std::string line = "step " + std::to_string(step) + " in memory: " + why.message();
    *fell_back += (fell_back->empty() ? "" : "; ") + line;
    if (me == 0) std::fprintf(stderr, "dcp manager: %s\n", line.c_str());
  };
  while (true) {
    auto choice = ChooseMemoryStep(inventories, bad, durable.complete, below);
    if (choice && only_step && choice->step != *only_step) choice.reset();
    if (!choice) return std::optional<LoadResult>();
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
    if (md.ok()) md = checkpoint::WithRenamedTensors(std::move(md).value(), opts, dir);

    DCP_RETURN_IF_ERROR(AgreeOnStatus(comm, md.status()));

    // 2. The metadata where it is missing or differs.
    const StepCopy* held = nullptr;
    for (const StepCopy& c : inventories[host]) {
      if (c.step == step) held = &c;
    }
    st = OkStatus();
    if (first_of_host() && (!held || held->metadata_digest != choice->metadata_digest)) {
      st = Local().CreateDirs(dir);
      if (st.ok()) {
        st = Local().WriteAtomic(JoinPath(dir, std::string(checkpoint::kMetadataName)), raw,
                                 ".tmp-restore");
      }
    }
    DCP_RETURN_IF_ERROR(AgreeOnStatus(comm, st));

    // 3. The load, planned so that a stored chunk several ranks need is read on a host that
    //    holds its file and broadcast. Before any read, every copy about to be read or sent
    //    is verified (a damaged one is passed over: choose again without it), then each host
    //    receives the bytes its ranks read from files it lacks (from a partner's memory, or
    //    from the root).
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
    const metadata::Metadata& meta = *md;
    checkpoint::LoadHooks hooks;
    hooks.readable = &readable;
    hooks.before_reads = [&](const std::vector<checkpoint::ReadSpan>& reads) -> Status {
      NeededSpans needed;
      for (const auto& r : reads) needed[r.file].push_back({r.offset, r.length});
      for (auto& [f, spans] : needed) spans = MergeSpans(std::move(spans));
      DCP_ASSIGN_OR_RETURN(auto lists, comm.AllGather(EncodeSpans(needed)));
      std::vector<NeededSpans> needed_by_host(hosts_.size());
      for (int r = 0; r < comm.size(); ++r) {
        DCP_RETURN_IF_ERROR(DecodeSpans(lists[r], &needed_by_host[hosts_.host_of_rank[r]]));
      }
      const RestorePlan plan = PlanRestore(hosts_, *choice, needed_by_host);
      lap("plan");
      DCP_RETURN_IF_ERROR(VerifyCopiesInUse(comm, *choice, meta, needed_by_host[host], plan.fetches,
                                            dir, &found_bad));
      lap("verify");
      if (!found_bad.empty()) return DataLoss("memory tier: damaged copies passed over");
      TransferDirs dirs{&Local(), dir, durable.fs,
                        durable.complete.count(step) ? durable.dir_of(step) : std::string()};
      DCP_RETURN_IF_ERROR(TransferFiles(
          groups, plan.fetches, dirs, {},
          [&](const Transfer& t, const std::string& path) {
            return CheckFile(meta, t.file, path, t.spans);
          },
          &stats));
      // Copies that arrived damaged are passed over next time; the same verdict everywhere.
      std::string my_failed;
      wire::Writer w(my_failed);
      for (const Transfer& t : stats.failed) {
        w.Varint(static_cast<uint64_t>(t.from + 1));
        w.String(t.file);
      }
      DCP_ASSIGN_OR_RETURN(auto failed_lists, comm.AllGather(my_failed));
      for (const std::string& f : failed_lists) {
        wire::Reader rd(f);
        while (!rd.AtEnd() && rd.ok()) {
          const int from = static_cast<int>(rd.Varint()) - 1;
          const std::string file(rd.String());
          if (from == kFromStorage) {
            storage_failed = true;
          } else {
            arrived_bad.insert({hosts_.host_of_rank[from], step, file});
          }
        }
      }
      lap("fetch");
      if (storage_failed || !arrived_bad.empty()) {
        return DataLoss("memory tier: copies of step " + std::to_string(step) + " arrived damaged");
      }
      return OkStatus();
    };
    Result<LoadResult> loaded = checkpoint::Load(sd, dir, opts, Local(), &hooks);
    lap("load");
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
      loaded->step = step;
      loaded->from_memory = true;
      loaded->files_from_peers = stats.files_received - stats.files_from_storage;
      loaded->files_from_storage = stats.files_from_storage;
      loaded->fell_back = *fell_back;
      return std::optional<LoadResult>(*std::move(loaded));
    }
    if (!found_bad.empty() || (!arrived_bad.empty() && !storage_failed)) {
      bad.merge(found_bad);
      bad.merge(arrived_bad);
      continue;
    }
    if (storage_failed) {
      pass_over(step, DataLoss("a file could not be copied from durable storage"));
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
