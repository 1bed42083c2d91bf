#include "tier/memory_tier.h"

#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <set>

#include "checkpoint/incremental_copy.h"
#include "checkpoint/names.h"
#include "checkpoint/torch_probe.h"
#include "checkpoint/verify.h"
#include "comm/exchange.h"
#include "comm/host_id.h"
#include "core/log.h"
#include "core/wire.h"
#include "metadata/codec.h"
#include "tier/host_dir.h"

namespace dcp::tier {

using storage::JoinPath;

std::string HostTierDir(const std::string& base, const std::string& root) {
  std::string key = storage::NormalPath(root);
  while (key.size() > 1 && key.back() == '/') key.pop_back();  // s3:// roots as well
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
  const auto t0 = std::chrono::steady_clock::now();
  DCP_RETURN_IF_ERROR(TransferFiles(groups, transfers, dirs, topts, ReceiveChecks(meta), stats));
  if (LogEnabled()) {
    std::fprintf(stderr,
                 "dcp memory tier: step %lld replicated, rank %d: sent %llu B, received %llu B "
                 "in %.3f s\n",
                 static_cast<long long>(step), comm.rank(),
                 static_cast<unsigned long long>(stats->bytes_sent),
                 static_cast<unsigned long long>(stats->bytes_received),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return stats->local_failure;
}

namespace {

// Data files in `dir` that its committed metadata `md` does not name: what an earlier drain of
// the step into `dir` left when it failed (a retry may cut the files differently).
void RemoveUnnamedDataFiles(storage::FileSystem& fs, const std::string& dir,
                            const metadata::Metadata& md) {
  auto names = fs.List(dir);
  if (!names.ok()) return;
  std::set<std::string> named;
  for (const auto& f : md.files) {
    if (f.base.empty()) named.insert(f.name);
  }
  for (const std::string& n : *names) {
    if (checkpoint::IsDcpDataFileName(n) && !named.count(n)) (void)fs.Remove(JoinPath(dir, n));
  }
}

}  // namespace

Status MemoryTier::Drain(Comm& comm, int64_t step, storage::FileSystem& fs, const std::string& dst,
                         const std::string& base, bool* referenced) const {
  const int me = comm.rank();
  const std::string where = "persist step " + std::to_string(step) + " to " + dst + ": ";
  Status st;
  std::string base_encoded;                      // rank 0 reads the base once; empty: a whole copy
  std::optional<checkpoint::BaseChunks> chunks;  // decoded from base_encoded
  if (me == 0) {
    st = fs.CreateDirs(dst);
    if (st.ok() && !base.empty()) {
      // Decoded before it is shared: a base every rank would refuse makes a whole copy, not a
      // failure.
      auto b = checkpoint::ReadIncrementalBase(fs, base);
      Result<checkpoint::BaseChunks> decoded =
          b.ok() ? checkpoint::BaseChunks::Decode(*b, dst, base) : b.status();
      if (decoded.ok()) {
        base_encoded = std::move(b).value();
        chunks = std::move(decoded).value();
      } else {
        std::fprintf(stderr, "dcp memory tier: %scopied whole: %s\n", where.c_str(),
                     decoded.status().message().c_str());
      }
    }
  }
  DCP_RETURN_IF_ERROR(BroadcastStatus(comm, 0, st.Annotate(where)));
  if (!base.empty()) DCP_RETURN_IF_ERROR(comm.Broadcast(base_encoded, 0));
  auto md = ReadStepMetadata(StepDir(step));
  Status copied = md.status();
  std::optional<checkpoint::IncrementalCopy> plan;
  if (copied.ok() && !base_encoded.empty() && !chunks) {  // rank 0 decoded it already
    auto decoded = checkpoint::BaseChunks::Decode(base_encoded, dst, base);
    copied = decoded.status();
    if (copied.ok()) chunks = std::move(decoded).value();
  }
  if (copied.ok() && chunks) plan = checkpoint::PlanIncrementalCopy(md->first, *chunks);
  // Every byte copied is checked on the way: a copy damaged in memory must not become the
  // durable step (nor, in an incremental root, the bytes later drains reference).
  std::vector<std::vector<storage::StoredRange>> ranges;  // per file of the step
  if (copied.ok()) ranges = checkpoint::StoredRangesByFile(md->first);
  for (size_t f = 0; copied.ok() && f < md->first.files.size(); ++f) {
    const std::string& name = md->first.files[f].name;
    if (checkpoint::DataFileRank(name) != me) continue;
    using Kind = checkpoint::FileCopy::Kind;
    const Kind kind = plan ? plan->files[f].kind : Kind::kWhole;
    if (kind == Kind::kWhole) {
      storage::StreamVerifier verify(std::move(ranges[f]), JoinPath(StepDir(step), name));
      copied = CopyFile(Local(), JoinPath(StepDir(step), name), fs, JoinPath(dst, name),
                        uint64_t{8} << 20, md->first.has_checksums ? &verify : nullptr);
    } else if (kind == Kind::kSubset) {
      copied =
          checkpoint::WriteKeptChunks(plan->files[f], md->first, Local(), StepDir(step), fs, dst);
    }
  }
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm, copied.Annotate(where)));
  const bool references = plan && plan->chunks_referenced > 0;
  if (referenced) *referenced = references;
  // The metadata last: the durable step is complete only once every file is there.
  if (me == 0) {
    const std::string encoded =
        references ? metadata::Encode(plan->md, metadata::VersionFor(plan->md)) : md->second;
    st =
        fs.WriteAtomic(JoinPath(dst, std::string(checkpoint::kMetadataName)), encoded, ".tmp-drain")
            .Annotate(where);
    if (st.ok()) {
      checkpoint::PublishTorchProbe(fs, dst, ".tmp-drain");
      RemoveUnnamedDataFiles(fs, dst, references ? plan->md : md->first);
    }
  }
  return BroadcastStatus(comm, 0, st);
}

void MemoryTier::MarkPassedOver(const std::vector<int64_t>& steps, const std::string& why) const {
  if (!first_of_host()) return;
  for (int64_t step : steps) {
    const std::string dir = StepDir(step);
    if (!Local().List(dir).ok()) continue;  // this host holds none of it
    Status st = Local().WriteAtomic(JoinPath(dir, std::string(kPassedOverName)), why, ".tmp");
    if (!st.ok()) {
      std::fprintf(stderr, "dcp: could not mark step %lld in %s as passed over: %s\n",
                   static_cast<long long>(step), dir.c_str(), st.message().c_str());
    }
  }
}

void MemoryTier::DropPassedOver(int64_t step) const {
  if (!first_of_host()) return;
  const std::string dir = StepDir(step);
  if (Local().FileSize(JoinPath(dir, std::string(kPassedOverName))).ok()) RemoveTree(dir);
}

void MemoryTier::Retain(size_t keep, int64_t below) const {
  if (!first_of_host()) return;
  size_t kept = 0;
  for (const auto& [step, dir] : StepDirs(host_dir_)) {
    if (step >= below) continue;  // the step being saved, or newer
    // A directory without committed metadata is what a failed save left: it is no copy, so
    // it neither counts against keep (which would push out the last good step) nor stays.
    const bool committed =
        Local().FileSize(JoinPath(dir, std::string(checkpoint::kMetadataName))).ok() &&
        !Local().FileSize(JoinPath(dir, std::string(kPassedOverName))).ok();
    if (!committed || kept++ >= keep) RemoveTree(dir);
  }
}

}  // namespace dcp::tier
