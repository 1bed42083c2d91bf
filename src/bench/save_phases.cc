// `dcp bench`'s save phases: save (plan cache and recycling as a job sees them), async save
// (how long the caller is blocked, against a memcpy of the staged bytes) and the manager's
// save sequences with and without file recycling.

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "async/staging_pool.h"
#include "bench/runner.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/save.h"
#include "dcp/async.h"
#include "manager/manager.h"

namespace dcp::bench::internal {

Status Runner::RunSave(int rep, PhaseReport* p) {
  DCP_RETURN_IF_ERROR(DeleteAndSettle(ckpt_));
  SaveResult r;
  DCP_ASSIGN_OR_RETURN(double s, Timed([&] {
                         auto res = checkpoint::Save(source_.sd, ckpt_,
                                                     SaveOptions{.comm = comm_ptr_}, *fs_);
                         if (res.ok()) r = *res;
                         return res.status();
                       }));
  Took(p, s);
  DCP_RETURN_IF_ERROR(RecordMemory(p, source_.tensor_bytes));
  DCP_ASSIGN_OR_RETURN(
      auto sums, SumAtRoot(comm_, {r.bytes_written, r.files_written, r.plan_cache_hit ? 1u : 0u}));
  if (rank_ == 0) {
    p->bytes_written = sums[0];
    p->files_opened = sums[1];
    if (sums[2] == static_cast<uint64_t>(comm_.size())) ++p->plan_cache_hits;
  }
  if (rep > 0) return OkStatus();
  // What the checkpoint holds, from its metadata. Unique bytes count tensor chunks and
  // bytes entries, so with replicas deduplicated the bytes written sum to them.
  std::string unique;
  DCP_RETURN_IF_ERROR(OnRoot([&] {
    auto md = checkpoint::ReadMetadata(*fs_, ckpt_);
    if (!md.ok()) return md.status();
    report_.tensors = md->tensors.size();
    report_.chunks = md->TotalChunks();
    report_.bytes_entries = md->bytes.size();
    unique = std::to_string(md->TotalDataBytes());
    return OkStatus();
  }));
  DCP_RETURN_IF_ERROR(comm_.Broadcast(unique, 0));
  report_.unique_bytes = std::stoull(unique);
  return OkStatus();
}

// The staging reference: this rank's chunks copied with one memcpy each, by one thread, into
// memory like the staging pool's (allocated and pre-faulted untimed), every rank at once.
Result<double> Runner::MemcpyStagedBytes() {
  uint64_t bytes = 0;
  for (const StateEntry& e : source_.sd.entries()) {
    for (const TensorChunk& c : e.chunks) bytes += (c.view.NumBytes() + 63) / 64 * 64;
  }
  auto alloc = async::NewHostAllocator();
  auto block = alloc->Allocate(std::max<uint64_t>(bytes, 1));
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, block.status()));
  auto s = Timed([&] {
    uint64_t off = 0;
    for (const StateEntry& e : source_.sd.entries()) {
      for (const TensorChunk& c : e.chunks) {
        std::memcpy(block->data() + off, c.view.data, c.view.NumBytes());
        off += (c.view.NumBytes() + 63) / 64 * 64;
      }
    }
    asm volatile("" : : "r"(block->data()) : "memory");  // keep the copies
    return OkStatus();
  });
  alloc->Free(*block);
  return s;
}

// The caller is blocked while its state is staged; the save is complete once persisted.
// Both are timed barrier to barrier from the same start, after the same delete + sync +
// pause as the save; the staging reference (MemcpyStagedBytes) follows the persisted save.
Status Runner::RunAsyncSave(PhaseReport* p) {
  if (!saver_) {
    saver_ = std::make_unique<AsyncSaver>();
    if (o_.async_prepare) {
      DCP_ASSIGN_OR_RETURN(
          p->prepare_seconds, Timed([&] {
            return StatusOf([&] { saver_->Prepare(source_.sd, SaveOptions{.comm = comm_ptr_}); });
          }));
    }
  }
  DCP_RETURN_IF_ERROR(DeleteAndSettle(ckpt_));
  DCP_RETURN_IF_ERROR(comm_.Barrier());
  StartMemory();
  const double c0 = ProcessCpuSeconds();
  const auto t0 = Clock::now();
  AsyncSave h = saver_->Save(source_.sd, ckpt_, SaveOptions{.comm = comm_ptr_});
  DCP_RETURN_IF_ERROR(comm_.Barrier());
  const double blocked = std::chrono::duration<double>(Clock::now() - t0).count();
  const Status persisted = h.status();  // staging, then the background persist, all CPU counted
  const double cpu = ProcessCpuSeconds() - c0;
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, persisted));
  p->seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  DCP_ASSIGN_OR_RETURN(auto cpu_us, SumAtRoot(comm_, {static_cast<uint64_t>(cpu * 1e6)}));
  p->cpu_seconds.push_back(rank_ == 0 ? double(cpu_us[0]) * 1e-6 : 0);
  StopMemory();
  DCP_RETURN_IF_ERROR(RecordMemory(p, source_.tensor_bytes));
  p->blocked_seconds.push_back(blocked);
  // After the save, so that the first save finds memory as the job left it (the reference's
  // own allocation would otherwise warm the allocator for it).
  DCP_ASSIGN_OR_RETURN(double copy, MemcpyStagedBytes());
  p->memcpy_seconds.push_back(copy);
  const SaveResult r = h.Get();
  DCP_ASSIGN_OR_RETURN(
      auto sums, SumAtRoot(comm_, {r.bytes_written, r.files_written, h.staging().bytes_staged}));
  if (rank_ == 0) {
    p->bytes_written = sums[0];
    p->files_opened = sums[1];
    p->bytes_staged = sums[2];
  }
  return OkStatus();
}

// A training job's sequence of saves through the checkpoint manager (keep_last 2: each save
// also retires the step before last), once with file recycling and once without, on two roots,
// alternating save by save so drift in the disk's state hits both alike. The first saves fill
// the retention window and the recycle directory; the next `repeat` are timed, each after a
// pause standing for training time (no delete + sync: retention's deletions are what a real
// sequence writes after).
Status Runner::RunManagerSequences(PhaseReport* recycled, PhaseReport* plain) {
  constexpr int kKeepLast = 2;
  const int warmup = kKeepLast + 1;  // the first save that can recycle is the 4th
  struct Sequence {
    PhaseReport* report;
    std::string root;
    std::unique_ptr<CheckpointManager> mgr;
    uint64_t recycled_files = 0;
  };
  std::vector<Sequence> seqs;
  for (PhaseReport* p : {recycled, plain}) {
    const std::string root = ckpt_ + "-" + p->name;
    DCP_RETURN_IF_ERROR(DeleteAndSettle(root));
    ManagerOptions mo{
        .policy = {.keep_last = kKeepLast}, .comm = comm_ptr_, .recycle_files = p == recycled};
    std::unique_ptr<CheckpointManager> mgr;
    DCP_RETURN_IF_ERROR(AgreeOnStatus(
        comm_, StatusOf([&] { mgr = manager::NewManager(root, std::move(mo), *fs_); })));
    seqs.push_back({p, root, std::move(mgr)});
  }
  for (int i = 0; i < warmup + o_.repeat; ++i) {
    for (size_t k = 0; k < seqs.size(); ++k) {
      Sequence& q = seqs[(k + static_cast<size_t>(i)) % seqs.size()];
      std::this_thread::sleep_for(std::chrono::duration<double>(o_.pause_seconds));
      SaveResult r;
      DCP_ASSIGN_OR_RETURN(
          double s, Timed([&] { return StatusOf([&] { r = q.mgr->Save(i + 1, source_.sd); }); }));
      if (i < warmup) continue;
      Took(q.report, s);
      q.recycled_files += r.file_recycled ? 1 : 0;
      DCP_ASSIGN_OR_RETURN(auto sums, SumAtRoot(comm_, {r.bytes_written, r.files_written}));
      if (rank_ == 0) {
        q.report->bytes_written = sums[0];
        q.report->files_opened = sums[1];
      }
    }
  }
  for (Sequence& q : seqs) {
    q.mgr.reset();
    DCP_ASSIGN_OR_RETURN(auto sums, SumAtRoot(comm_, {q.recycled_files}));
    if (rank_ == 0) q.report->files_recycled = sums[0];
    DCP_RETURN_IF_ERROR(OnRoot([&] {
      (void)RemoveTree(q.root);
      return OkStatus();
    }));
  }
  return OkStatus();
}

}  // namespace dcp::bench::internal
