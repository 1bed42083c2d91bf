// The runner of `dcp bench` (bench.cc): its phases share the timing, cache and clean-up
// helpers below; phases with a file of their own (tier_phase.cc, read_pattern.cc) are
// methods too.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "bench/memory.h"
#include "bench/physical.h"
#include "comm/exchange.h"
#include "dcp/async.h"
#include "dcp/checkpoint.h"
#include "dcp/comm.h"
#include "storage/file_system.h"
#include "testfs/throttled_file_system.h"
#include "workload/layout_spec.h"
#include "workload/model.h"
#include "workload/populate.h"

namespace dcp::bench::internal {

using Clock = std::chrono::steady_clock;
inline constexpr double kGiB = double(uint64_t{1} << 30);

// The public API throws dcp::Error; the runner agrees on Status values.
Status StatusOf(const std::function<void()>& fn);
double Median(std::vector<double> v);
double GiBps(uint64_t bytes, double seconds);
// Sums (maxima) of per-rank counters, gathered at rank 0.
Result<std::vector<uint64_t>> SumAtRoot(Comm& comm, const std::vector<uint64_t>& mine);
Result<std::vector<uint64_t>> MaxAtRoot(Comm& comm, const std::vector<uint64_t>& mine);
std::string Fixed(double v, int digits);

class Runner {
 public:
  Runner(std::shared_ptr<Comm> comm, const BenchOptions& opts)
      : comm_ptr_(std::move(comm)), comm_(*comm_ptr_), o_(opts) {}

  Result<BenchReport> Run();

 private:
  bool Wants(std::string_view phase) const {
    return std::find(o_.phases.begin(), o_.phases.end(), phase) != o_.phases.end();
  }
  // Barrier to barrier around `fn`; every rank learns whether every rank succeeded. On
  // object storage, the requests all ranks made meanwhile go to last_requests_ (rank 0); the
  // CPU time all ranks spent in `fn` (user + system, every thread) to last_cpu_ (rank 0).
  Result<double> Timed(const std::function<Status()>& fn) {
    DCP_RETURN_IF_ERROR(comm_.Barrier());
    const uint64_t r0 = Requests();
    StartMemory();
    const double c0 = ProcessCpuSeconds();
    const auto t0 = Clock::now();
    Status st = fn();
    const double cpu = ProcessCpuSeconds() - c0;
    StopMemory();
    DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, st));
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    DCP_ASSIGN_OR_RETURN(auto cpu_us, SumAtRoot(comm_, {static_cast<uint64_t>(cpu * 1e6)}));
    last_cpu_ = rank_ == 0 ? double(cpu_us[0]) * 1e-6 : 0;
    if (report_.object_store) {
      DCP_ASSIGN_OR_RETURN(auto sums, SumAtRoot(comm_, {Requests() - r0}));
      last_requests_ = rank_ == 0 ? sums[0] : 0;
    }
    return s;
  }
  // A repetition of `p` that Timed measured as `s` seconds: its time, CPU and requests.
  void Took(PhaseReport* p, double s) {
    p->seconds.push_back(s);
    p->cpu_seconds.push_back(last_cpu_);
    p->requests += last_requests_;
  }
  // The rise of this process's resident memory between the two calls, to last_peak_extra_.
  void StartMemory() {
    peak_reset_ = ResetPeakResident();
    rss_at_start_ = ReadResident().now;
  }
  void StopMemory() {
    const uint64_t peak = peak_reset_ ? ReadResident().peak : 0;
    last_peak_extra_ = peak > rss_at_start_ ? peak - rss_at_start_ : 0;
  }
  // Rank 0 keeps the largest last_peak_extra_ and `held` of all ranks in `p`.
  Status RecordMemory(PhaseReport* p, uint64_t held) {
    DCP_ASSIGN_OR_RETURN(auto max, MaxAtRoot(comm_, {last_peak_extra_, held}));
    if (rank_ == 0) {
      p->peak_rss_extra_bytes = std::max(p->peak_rss_extra_bytes, max[0]);
      p->held_bytes = std::max(p->held_bytes, max[1]);
    }
    return OkStatus();
  }
  uint64_t Requests() const { return report_.object_store ? object_store_requests() : 0; }
  // A directory and everything under it, through the bench's file system.
  Status RemoveTree(const std::string& path) { return fs_->RemoveTree(path).Annotate("bench: "); }
  // Rank 0 runs `fn`; everyone gets its status.
  Status OnRoot(const std::function<Status()>& fn) {
    return AgreeOnStatus(comm_, rank_ == 0 ? fn() : OkStatus());
  }
  // writes into freshly freed blocks are slow, so every timed
  // write follows the same delete + sync + pause.
  Status DeleteAndSettle(const std::string& path) {
    DCP_RETURN_IF_ERROR(OnRoot([&] {
      DCP_RETURN_IF_ERROR(RemoveTree(path));
      DCP_RETURN_IF_ERROR(fs_->CreateDirs(path).Annotate("bench: "));
      ::sync();
      return OkStatus();
    }));
    std::this_thread::sleep_for(std::chrono::duration<double>(o_.pause_seconds));
    return comm_.Barrier();
  }
  // Cold: every file of `dir` written back and dropped from the page cache. Warm: every
  // file read right now (ranks share the files). Returns the resident fraction measured
  // right after, i.e. right before the timed phase (rank 0; 0 elsewhere).
  Result<double> PrepareCache(const std::string& dir, bool cold) {
    if (report_.object_store) return 0.0;  // no page cache in between: every read is cold
    std::vector<std::string> files;
    if (rank_ == 0 || !cold) {
      auto f = FilesIn(dir);
      if (!f.ok()) return f.status();
      files = std::move(f).value();
    }
    Status st;
    if (cold) {
      if (rank_ == 0) {
        for (const auto& f : files) {
          st = DropFromPageCache(f);
          if (!st.ok()) break;
        }
      }
    } else {
      uint64_t n = 0;
      for (size_t i = rank_; i < files.size() && st.ok(); i += comm_.size()) {
        st = ReadSequential(storage::PosixFileSystem(), files[i], &n);
      }
    }
    DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, st));
    double fraction = 0;
    if (rank_ == 0) {
      auto res = MeasureResidency(files);
      st = res.status();
      if (res.ok()) fraction = res->Fraction();
    }
    DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, st));
    return fraction;
  }

  Status Setup();
  Status RunSave(int rep, PhaseReport* p);
  Status RunAsyncSave(PhaseReport* p);
  Status RunManagerSequences(PhaseReport* recycled, PhaseReport* plain);
  Status RunTierPhase(PhaseReport* save, PhaseReport* from_memory, PhaseReport* from_root);
  Status RunIncrementalPhase(PhaseReport* full, PhaseReport* incremental, PhaseReport* load_full,
                             PhaseReport* load_incremental);
  Result<double> MemcpyStagedBytes();
  Status RunReferenceWrite();
  Status RunLoad(int rep, PhaseReport* p, const workload::LayoutSpec& layout);
  Status RunReferenceReads(int rep);
  // The read pattern of loads into `layout`, recorded under `kind` (read_pattern.cc).
  Status RunReferencePattern(const std::string& kind, const workload::LayoutSpec& layout);
  void Finish();
  void CpuAgainstFloor(PhaseReport& p) const;

  std::shared_ptr<Comm> comm_ptr_;
  Comm& comm_;
  const BenchOptions& o_;
  int rank_ = 0;
  BenchReport report_;
  workload::ModelSpec model_;
  workload::LayoutSpec save_layout_, load_layout_;
  std::string ckpt_, ref_dir_, throttle_path_;
  std::unique_ptr<testfs::BandwidthLimiter> limiter_;
  std::unique_ptr<testfs::ThrottledFileSystem> throttled_;
  storage::FileSystem* fs_ = &storage::PosixFileSystem();
  uint64_t last_requests_ = 0;  // see Timed
  double last_cpu_ = 0;         // see Timed
  bool peak_reset_ = false;     // see StartMemory
  uint64_t rss_at_start_ = 0, last_peak_extra_ = 0;
  workload::OwnedStateDict source_;
  std::unique_ptr<AsyncSaver> saver_;  // one for all repetitions: its staging pool is reused
};

}  // namespace dcp::bench::internal
