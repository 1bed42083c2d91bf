#include "bench/bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>

#include "bench/physical.h"
#include "bench/runner.h"
#include "checkpoint/load.h"
#include "checkpoint/metadata_io.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/wire.h"
#include "storage/s3/s3_client.h"
#include "testfs/throttled_file_system.h"
#include "workload/layout_spec.h"
#include "workload/model.h"
#include "workload/populate.h"

namespace dcp::bench {
namespace internal {

Status StatusOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return Status(e.code(), e.what());
  }
  return OkStatus();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double GiBps(uint64_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / kGiB : 0; }

namespace {
Result<std::vector<uint64_t>> ReduceAtRoot(Comm& comm, const std::vector<uint64_t>& mine,
                                           bool take_max) {
  std::string enc;
  wire::Writer w(enc);
  for (uint64_t v : mine) w.Fixed64(v);
  DCP_ASSIGN_OR_RETURN(auto all, comm.Gather(enc, 0));
  std::vector<uint64_t> out(mine.size(), 0);
  for (const std::string& s : all) {
    wire::Reader r(s);
    for (uint64_t& v : out) {
      const uint64_t x = r.Fixed64();
      v = take_max ? std::max(v, x) : v + x;
    }
    if (!r.ok()) return DataLoss("bench: corrupt counters received");
  }
  return out;
}
}  // namespace

Result<std::vector<uint64_t>> SumAtRoot(Comm& comm, const std::vector<uint64_t>& mine) {
  return ReduceAtRoot(comm, mine, /*take_max=*/false);
}
Result<std::vector<uint64_t>> MaxAtRoot(Comm& comm, const std::vector<uint64_t>& mine) {
  return ReduceAtRoot(comm, mine, /*take_max=*/true);
}

Status Runner::Setup() {
  rank_ = comm_.rank();
  const int n = comm_.size();
  report_.options = o_;
  report_.ranks = n;
  report_.backend = std::string(comm_.backend());
  for (const std::string& p : o_.phases) {
    if (p != "save" && p != "load" && p != "reshard" && p != "async" && p != "manager" &&
        p != "tier" && p != "incremental") {
      return InvalidArgument("bench: unknown phase '" + p +
                             "' (save, load, reshard, async, manager, tier, incremental)");
    }
  }
  if (o_.repeat < 1) return InvalidArgument("bench: --repeat must be >= 1");
  DCP_ASSIGN_OR_RETURN(
      workload::Workload w,
      workload::MakeWorkload(o_.workload, "dp" + std::to_string(n), "tp" + std::to_string(n)));
  model_ = std::move(w.model);
  save_layout_ = std::move(w.save_layout);
  load_layout_ = std::move(w.load_layout);
  for (const auto* l : {&save_layout_, &load_layout_}) {
    if (l->WorldSize() != n) {
      return InvalidArgument("bench: layout " + l->ToString() + " needs " +
                             std::to_string(l->WorldSize()) + " ranks, this job has " +
                             std::to_string(n));
    }
  }
  report_.save_layout = save_layout_.ToString();
  report_.load_layout = load_layout_.ToString();

  // One scratch directory for all ranks, named by rank 0.
  std::string dir = o_.dir;
  if (dir.empty() && rank_ == 0) {
    dir = (std::filesystem::temp_directory_path() / ("dcp-bench-" + std::to_string(getpid())))
              .string();
  }
  DCP_RETURN_IF_ERROR(comm_.Broadcast(dir, 0));
  ckpt_ = dir + "/ckpt";
  ref_dir_ = dir + "/reference";
  if (storage::IsObjectStorePath(dir)) {
    // The references are this client's own multipart PUTs and parallel ranged GETs of the
    // same bytes, one object per rank: the store's limit as dcp's requests can reach it.
    report_.object_store = true;
    auto fs = storage::FileSystemFor(dir);
    DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, fs.status()));
    fs_ = *fs;
    if (o_.storage_gibps > 0) {
      return InvalidArgument("bench: --storage-gibps caps file reads; not with " + dir);
    }
    if (rank_ == 0) {
      report_.notes.push_back(
          "object storage: the write reference is one multipart upload per rank, the read "
          "reference parallel ranged GETs of it; there is no page cache, so warm = cold");
    }
  } else {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);  // the phases create it anyway
    auto in_memory = InMemoryFileSystem(dir);
    DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, in_memory.status()));
    report_.scratch_in_memory = *in_memory;
    if (*in_memory && o_.cold && rank_ == 0) {
      report_.notes.push_back(dir +
                              " is on an in-memory file system (tmpfs): its pages cannot be "
                              "dropped, so cold reads and loads are warm");
    }
  }

  if (o_.storage_gibps > 0) {
    // One token bucket in shared memory for every rank of this machine.
    std::string path;
    if (rank_ == 0) {
      path = (std::filesystem::exists("/dev/shm") ? std::string("/dev/shm") : dir) +
             "/dcp-bench-throttle-" + std::to_string(getpid());
    }
    DCP_RETURN_IF_ERROR(comm_.Broadcast(path, 0));
    throttle_path_ = path;
    auto l = testfs::BandwidthLimiter::Shared(path, o_.storage_gibps * kGiB);
    DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, l.status()));
    limiter_ = std::move(l).value();
    throttled_ =
        std::make_unique<testfs::ThrottledFileSystem>(storage::PosixFileSystem(), *limiter_);
    fs_ = throttled_.get();
    char line[256];
    std::snprintf(line, sizeof(line),
                  "storage reads capped at %.3g GiB/s aggregate: one token bucket in shared "
                  "memory, shared by all %d ranks of this machine, 4 MiB slices; writes "
                  "uncapped",
                  o_.storage_gibps, n);
    report_.throttle = line;
  }

  auto sd = workload::PopulateStateDict(model_, save_layout_, rank_);
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, sd.status()));
  source_ = std::move(sd).value();
  return OkStatus();
}

Status Runner::RunReferenceWrite() {
  DCP_RETURN_IF_ERROR(DeleteAndSettle(ref_dir_));
  const uint64_t n = comm_.size();
  const uint64_t share =
      report_.unique_bytes / n + (rank_ < static_cast<int>(report_.unique_bytes % n));
  char name[32];
  std::snprintf(name, sizeof(name), "ref-r%05d.bin", rank_);
  DCP_ASSIGN_OR_RETURN(double s,
                       Timed([&] { return WriteSequential(*fs_, ref_dir_ + "/" + name, share); }));
  report_.reference.write_seconds.push_back(s);
  report_.reference.write_cpu_seconds.push_back(last_cpu_);
  report_.reference.write_requests += last_requests_;
  return OkStatus();
}

Status Runner::RunLoad(int rep, PhaseReport* p, const workload::LayoutSpec& layout) {
  auto dst = workload::MakeEmptyLike(model_, layout, rank_);
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, dst.status()));
  DCP_ASSIGN_OR_RETURN(double resident, PrepareCache(ckpt_, o_.cold));
  p->resident_fraction_before = std::max(p->resident_fraction_before, resident);
  LoadOptions lo{.comm = comm_ptr_};
  lo.broadcast = p->broadcast;
  // The named plans measure the broadcast machinery itself even on one machine (the host-aware
  // default would read through the shared page cache exactly as with broadcast off); the
  // default is what a user gets on such storage: ranks of one host (DCP_HOST_ID emulates
  // several) read, except where the storage charges every rank's read (--storage-gibps, object
  // stores), where they broadcast.
  lo.broadcast_within_host = !p->default_plan;
  lo.broadcast_cached = !p->default_plan;  // else the plan named, whatever the cache holds
  lo.max_broadcast_buffer_bytes = o_.load_max_broadcast_buffer_mib << 20;
  LoadResult r;
  DCP_ASSIGN_OR_RETURN(double s, Timed([&] {
                         auto res = checkpoint::Load(dst->sd, ckpt_, lo, *fs_);
                         if (res.ok()) r = *res;
                         return res.status();
                       }));
  Took(p, s);
  DCP_RETURN_IF_ERROR(RecordMemory(p, dst->tensor_bytes));
  if (rep == 0 && o_.verify) {
    DCP_RETURN_IF_ERROR(AgreeOnStatus(
        comm_, workload::VerifyStateDict(dst->sd).Annotate("bench: " + p->name + ": ")));
  }
  DCP_ASSIGN_OR_RETURN(auto sums,
                       SumAtRoot(comm_, {r.bytes_read, r.files_opened, r.broadcasts, r.batches,
                                         r.shards_read_for_others, r.bytes_sent}));
  if (rank_ == 0) {
    p->bytes_read_storage = sums[0];
    p->files_opened = sums[1];
    p->broadcasts = sums[2];
    p->batches = sums[3];
    p->shards_read_for_others = sums[4];
    p->bytes_sent = sums[5];
  }
  return OkStatus();
}

Status Runner::RunReferenceReads(int rep) {
  (void)rep;
  char name[32];
  std::snprintf(name, sizeof(name), "ref-r%05d.bin", rank_);
  const std::string mine = ref_dir_ + "/" + name;
  DCP_ASSIGN_OR_RETURN(double resident, PrepareCache(ref_dir_, /*cold=*/true));
  auto& ref = report_.reference;
  ref.resident_fraction_before_cold_read =
      std::max(ref.resident_fraction_before_cold_read, resident);
  uint64_t n = 0;
  DCP_ASSIGN_OR_RETURN(double cold, Timed([&] { return ReadSequential(*fs_, mine, &n); }));
  ref.read_requests += last_requests_;
  ref.read_cold_cpu_seconds.push_back(last_cpu_);
  // Warm means just read (docs/benchmarks.md).
  DCP_ASSIGN_OR_RETURN(double warm, Timed([&] { return ReadSequential(*fs_, mine, &n); }));
  ref.read_warm_cpu_seconds.push_back(last_cpu_);
  // One XXH3 pass over every rank's own state, from memory, all ranks at once.
  uint64_t hashed = 0, sink = 0;
  DCP_RETURN_IF_ERROR(Timed([&] {
                        for (const StateEntry& e : source_.sd.entries()) {
                          for (const TensorChunk& c : e.chunks) {
                            sink ^= Xxh3({c.view.bytes(), c.view.NumBytes()});
                            hashed += c.view.NumBytes();
                          }
                        }
                        return OkStatus();
                      }).status());
  asm volatile("" : : "r"(sink) : "memory");
  DCP_ASSIGN_OR_RETURN(auto all_hashed, SumAtRoot(comm_, {hashed}));
  if (rank_ == 0 && all_hashed[0] > 0) {
    ref.hash_cpu_seconds_per_gib.push_back(last_cpu_ / (double(all_hashed[0]) / kGiB));
  }
  ref.read_cold_seconds.push_back(cold);
  ref.read_warm_seconds.push_back(warm);
  if (LogEnabled()) {  // beside the loads' lines, to compare what the disk did in each
    std::fprintf(stderr, "dcp bench read reference rank %d/%d: cold %.3f s, warm %.3f s, %llu B\n",
                 rank_, comm_.size(), cold, warm, static_cast<unsigned long long>(n));
  }
  // One thread, alone on the machine: the other ranks wait at the barrier.
  if (rank_ == 0) ref.memcpy_gibps.push_back(MemcpyGiBps());
  return comm_.Barrier();
}

void Runner::Finish() {
  auto& ref = report_.reference;
  ref.bytes = report_.unique_bytes;
  ref.write_gibps = GiBps(ref.bytes, Median(ref.write_seconds));
  if (!ref.write_seconds.empty()) {
    const auto [fast, slow] =
        std::minmax_element(ref.write_seconds.begin(), ref.write_seconds.end());
    ref.write_gibps_min = GiBps(ref.bytes, *slow);
    ref.write_gibps_max = GiBps(ref.bytes, *fast);
  }
  ref.read_cold_gibps = GiBps(ref.bytes, Median(ref.read_cold_seconds));
  ref.read_warm_gibps = GiBps(ref.bytes, Median(ref.read_warm_seconds));
  ref.memcpy_gibps_median = Median(ref.memcpy_gibps);
  for (auto& pattern : ref.patterns) pattern.gibps = GiBps(pattern.bytes, Median(pattern.seconds));
  for (PhaseReport& p : report_.phases) {
    p.median_seconds = Median(p.seconds);
    p.median_blocked_seconds = Median(p.blocked_seconds);
    p.median_memcpy_seconds = Median(p.memcpy_seconds);
    if (p.median_memcpy_seconds > 0 && !p.blocked_seconds.empty()) {
      p.first_blocked_ratio_to_memcpy = p.blocked_seconds[0] / p.median_memcpy_seconds;
      p.blocked_ratio_to_memcpy = p.median_blocked_seconds / p.median_memcpy_seconds;
    }
    const std::vector<double>* ref_s;
    if (p.kind == "save" || p.kind == "async" || p.kind == "manager") {
      p.reference = "write";
      ref_s = &ref.write_seconds;
    } else if (o_.cold) {
      p.reference = "read_cold";
      ref_s = &ref.read_cold_seconds;
    } else {
      p.reference = "read_warm";
      ref_s = &ref.read_warm_seconds;
    }
    p.reference_seconds = Median(*ref_s);
    p.ratio_to_reference = p.reference_seconds > 0 ? p.median_seconds / p.reference_seconds : 0;
    for (const auto& pattern : ref.patterns) {
      const double s = Median(pattern.seconds);
      if (pattern.kind == p.kind && s > 0) p.ratio_to_pattern = p.median_seconds / s;
    }
    if (p.kind == "tier_save") {  // what a tier save costs the caller: its blocking vs memcpy
      p.reference = "memcpy";
      p.reference_seconds = p.median_memcpy_seconds;
      p.ratio_to_reference = p.blocked_ratio_to_memcpy;
    }
    CpuAgainstFloor(p);
  }
}

// The CPU time of all ranks in phase `p` against its floor: what the same bytes cost the
// references of this run (docs/benchmarks.md, "CPU against the floor").
void Runner::CpuAgainstFloor(PhaseReport& p) const {
  const auto& ref = report_.reference;
  p.median_cpu_seconds = Median(p.cpu_seconds);
  if (p.cpu_seconds.empty() || ref.bytes == 0) return;
  const double bytes = double(ref.bytes), gib = bytes / kGiB;
  const double write = Median(ref.write_cpu_seconds) / bytes;  // per byte
  const double read =
      Median(o_.cold ? ref.read_cold_cpu_seconds : ref.read_warm_cpu_seconds) / bytes;
  const double hash = Median(ref.hash_cpu_seconds_per_gib) / kGiB;
  const double copy = ref.memcpy_gibps_median > 0 ? 1.0 / (ref.memcpy_gibps_median * kGiB) : 0;
  double floor = 0;
  if (p.name == "incremental.save") {  // every byte hashed, the changed ones written
    floor = write * double(p.bytes_written) + hash * bytes;
  } else if (p.kind == "save" || p.kind == "manager") {
    floor = (write + hash) * double(p.bytes_written);
  } else if (p.kind == "async") {  // + one copy into the staging pool
    floor = (write + hash) * double(p.bytes_written) + copy * double(p.bytes_staged);
  } else if (p.kind == "load" || p.kind == "reshard" || p.name == "tier.restore_root") {
    floor = (read + hash) * double(p.bytes_read_storage) + copy * double(p.bytes_sent);
  } else if (p.name == "tier.restore_memory") {
    // Reading the hosts' tmpfs files is a copy out of memory; whole files copied from a
    // partner host before the load are not counted (the floor is low by their bytes).
    floor = (copy + hash) * double(p.bytes_read_storage) + copy * double(p.bytes_sent);
  }
  if (floor <= 0) return;
  p.cpu_seconds_per_gib = p.median_cpu_seconds / gib;
  p.floor_cpu_seconds_per_gib = floor / gib;
  p.cpu_ratio_to_floor = p.median_cpu_seconds / floor;
}

Result<BenchReport> Runner::Run() {
  DCP_RETURN_IF_ERROR(Setup());
  // Phases in a fixed order; each load phase with broadcast on and off, and as the load
  // itself chooses.
  PhaseReport save{.name = "save", .kind = "save", .layout = report_.save_layout};
  std::vector<PhaseReport> loads;
  for (const char* kind : {"load", "reshard"}) {
    if (!Wants(kind)) continue;
    const std::string layout =
        kind == std::string("load") ? report_.save_layout : report_.load_layout;
    for (bool b : {true, false}) {
      loads.push_back({.name = std::string(kind) + (b ? ".broadcast" : ".no_broadcast"),
                       .kind = kind,
                       .layout = layout,
                       .broadcast = b});
    }
    loads.push_back({.name = std::string(kind) + ".default",
                     .kind = kind,
                     .layout = layout,
                     .broadcast = true,
                     .default_plan = true});
  }
  PhaseReport async{.name = "async", .kind = "async", .layout = report_.save_layout};
  PhaseReport recycled{.name = "manager.recycle", .kind = "manager", .layout = report_.save_layout};
  PhaseReport plain{.name = "manager.no_recycle", .kind = "manager", .layout = report_.save_layout};
  for (int rep = 0; rep < o_.repeat; ++rep) {
    // The save (loads need its checkpoint) between two write references, each after the
    // same delete + sync + pause: the disk's rate drifts during a run, and references taken
    // right before and right after the saves bracket what they met (their spread is
    // reported). The first save comes first: it tells the references how many bytes to write.
    // Then the loads and the read references.
    if (rep > 0) DCP_RETURN_IF_ERROR(RunReferenceWrite());
    DCP_RETURN_IF_ERROR(RunSave(rep, &save));
    DCP_RETURN_IF_ERROR(RunReferenceWrite());
    // Its checkpoint replaces the save's; the loads read either the same way.
    if (Wants("async")) DCP_RETURN_IF_ERROR(RunAsyncSave(&async));
    for (PhaseReport& p : loads) {
      DCP_RETURN_IF_ERROR(RunLoad(rep, &p, p.kind == "load" ? save_layout_ : load_layout_));
    }
    DCP_RETURN_IF_ERROR(RunReferenceReads(rep));
    if (Wants("load")) DCP_RETURN_IF_ERROR(RunReferencePattern("load", save_layout_));
    if (Wants("reshard")) DCP_RETURN_IF_ERROR(RunReferencePattern("reshard", load_layout_));
  }
  // Sequences of `repeat` timed saves each, after the loop: the write reference is measured.
  if (Wants("manager")) DCP_RETURN_IF_ERROR(RunManagerSequences(&recycled, &plain));
  PhaseReport tier_save{.name = "tier.save", .kind = "tier_save", .layout = report_.save_layout};
  PhaseReport tier_memory{
      .name = "tier.restore_memory", .kind = "tier_restore", .layout = report_.load_layout};
  PhaseReport tier_root{
      .name = "tier.restore_root", .kind = "tier_restore", .layout = report_.load_layout};
  if (Wants("tier")) DCP_RETURN_IF_ERROR(RunTierPhase(&tier_save, &tier_memory, &tier_root));
  PhaseReport inc_full{
      .name = "incremental.full_save", .kind = "save", .layout = report_.save_layout};
  PhaseReport inc_save{.name = "incremental.save", .kind = "save", .layout = report_.save_layout};
  PhaseReport inc_load_full{
      .name = "incremental.load_full", .kind = "load", .layout = report_.save_layout};
  PhaseReport inc_load{.name = "incremental.load", .kind = "load", .layout = report_.save_layout};
  if (Wants("incremental")) {
    DCP_RETURN_IF_ERROR(RunIncrementalPhase(&inc_full, &inc_save, &inc_load_full, &inc_load));
  }
  if (Wants("save")) report_.phases.push_back(std::move(save));
  if (!async.seconds.empty()) report_.phases.push_back(std::move(async));
  if (Wants("manager")) {
    report_.phases.push_back(std::move(recycled));
    report_.phases.push_back(std::move(plain));
  }
  for (PhaseReport& p : loads) report_.phases.push_back(std::move(p));
  if (Wants("incremental")) {
    for (PhaseReport* p : {&inc_full, &inc_save, &inc_load_full, &inc_load}) {
      report_.phases.push_back(std::move(*p));
    }
  }
  if (!tier_save.seconds.empty()) {
    report_.phases.push_back(std::move(tier_save));
    report_.phases.push_back(std::move(tier_memory));
    report_.phases.push_back(std::move(tier_root));
  }
  Finish();

  // Clean up: the scratch data (unless the caller named the directory) and the throttle.
  DCP_RETURN_IF_ERROR(comm_.Barrier());
  if (rank_ == 0) {
    (void)RemoveTree(ckpt_);
    (void)RemoveTree(ref_dir_);
    if (o_.dir.empty()) (void)RemoveTree(std::filesystem::path(ckpt_).parent_path().string());
  }
  if (!throttle_path_.empty()) ::unlink(throttle_path_.c_str());
  return std::move(report_);
}

std::string Fixed(double v, int digits) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.*f", digits, v);
  return b;
}

}  // namespace internal

using internal::Runner;

Result<BenchReport> RunBench(std::shared_ptr<Comm> comm, const BenchOptions& opts) {
  Runner runner(std::move(comm), opts);
  return runner.Run();
}

}  // namespace dcp::bench
