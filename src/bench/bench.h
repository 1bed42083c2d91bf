// `dcp bench`: save and load a synthetic model-shaped state dict, and measure the physical
// limits of the same directory in the same run, so every phase is reported as a ratio to
// what the hardware can do right now (docs/benchmarks.md).
//
// Every rank of `comm` calls RunBench with the same options; the report is complete on
// rank 0 (other ranks get their own view, without the gathered totals).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dcp/comm.h"
#include "dcp/status.h"
#include "workload/workload.h"

namespace dcp::bench {

struct BenchOptions {
  // Save layout default "dp<ranks>"; the reshard phase's load layout default "tp<ranks>".
  workload::WorkloadOptions workload{.layers = 2, .width_scale = 0.1};
  // and/or "async", "manager" (sequences of saves with retention, with/without recycling),
  // "tier" (async saves to the memory tier with replication; restore after losing the last
  // host's memory, from memory and from the root), "incremental" (a full save, then one
  // against it after --incremental-changed of the bytes changed; loads of both)
  std::vector<std::string> phases = {"save", "load", "reshard"};
  bool cold = true;  // cold page cache before loads (else warm: read just before)
  int repeat = 1;
  std::string dir;           // scratch directory (emptied); default under the temp dir
  double storage_gibps = 0;  // > 0: cap storage reads at this aggregate rate
  // tier: where the hosts' memory is (MemoryTierOptions::dir's parent): a tmpfs, by default
  // /dev/shm; one mounted with huge pages reads faster.
  std::string tier_dir = "/dev/shm";
  double pause_seconds = 2;  // after delete + sync, before each timed write
  bool verify = true;        // check every loaded byte (first repetition, untimed)
  // async: AsyncSaver::Prepare before the first save (timed on its own, prepare_seconds), as
  // a job would before its training loop; false: the first Save allocates the pool itself.
  bool async_prepare = true;
  // Loads: LoadOptions::max_broadcast_buffer_bytes, in MiB.
  uint64_t load_max_broadcast_buffer_mib = 256;
  // incremental: the fraction of the checkpoint's bytes trained between the full save and the
  // incremental one (whole tensors in name order, each that still fits); the rest is frozen.
  double incremental_changed = 0.01;
};

struct PhaseReport {
  // "save", "async", "load.broadcast", "load.no_broadcast", "load.default", "reshard....",
  // "manager.recycle", "manager.no_recycle"
  std::string name;
  std::string kind;  // "save", "async", "load", "reshard", "manager"
  std::string layout;
  bool broadcast = false;
  // Loads: the load's own choice (broadcast unless every rank finds its reads cached), not
  // the plan `broadcast` names.
  bool default_plan = false;
  std::vector<double> seconds;  // one per repetition, barrier to barrier
  double median_seconds = 0;
  // Sums over ranks, from the last repetition.
  uint64_t bytes_written = 0;
  uint64_t bytes_read_storage = 0;
  uint64_t files_opened = 0;
  uint64_t broadcasts = 0;
  uint64_t batches = 0;
  uint64_t shards_read_for_others = 0;
  uint64_t bytes_sent = 0;
  uint64_t plan_cache_hits = 0;  // save: repetitions whose plan came from the cache
  uint64_t files_recycled = 0;   // manager: timed rank-saves that overwrote a retired file
  // async: how long Save blocked the caller (staging copy), barrier to barrier.
  std::vector<double> blocked_seconds;
  double median_blocked_seconds = 0;
  uint64_t bytes_staged = 0;  // async: sum over ranks
  // async: the staging reference, every repetition: each rank copies its own chunks with one
  // memcpy per chunk, one thread, into pre-faulted memory, all ranks at once, barrier to
  // barrier; and how long AsyncSaver::Prepare took (0: not called).
  std::vector<double> memcpy_seconds;
  double median_memcpy_seconds = 0;
  double prepare_seconds = 0;
  double first_blocked_ratio_to_memcpy = 0;  // blocked_seconds[0] / median_memcpy_seconds
  double blocked_ratio_to_memcpy = 0;        // median_blocked_seconds / median_memcpy_seconds
  double resident_fraction_before = 0;       // loads: page-cache residency right before (max)
  std::string reference;                     // "write", "read_cold" or "read_warm"
  double reference_seconds = 0;              // median
  double ratio_to_reference = 0;             // median_seconds / reference_seconds
  double ratio_to_pattern = 0;  // loads: median_seconds / their layout's read pattern's median
  uint64_t requests = 0;        // object storage: requests of all ranks, summed over repetitions
  // Host memory, max over ranks and repetitions: how far the process's resident memory rose
  // during the phase above what it held at its start (the caller's tensors, a load's
  // destination, a prepared staging pool are already resident then), and the tensor bytes
  // the rank holds (its state; a load's destination). 0 when the kernel gives no peak.
  uint64_t peak_rss_extra_bytes = 0;
  uint64_t held_bytes = 0;
  // incremental: the bytes of the tensors trained since the base, and what the save left in
  // the base's files (sums over ranks).
  uint64_t bytes_changed = 0;
  uint64_t bytes_referenced = 0;
  // CPU time of all ranks inside the timed window (user + system, every thread), one per
  // repetition; per GiB of the checkpoint; and the floor's: the reference I/O of the bytes the
  // phase moved, one XXH3 pass over them, and a memcpy of what it staged or a broadcast
  // carried, from CPU costs measured in the same run (docs/benchmarks.md, "CPU against the
  // floor"). Save, async, manager, load, reshard and incremental phases.
  std::vector<double> cpu_seconds;
  double median_cpu_seconds = 0;
  double cpu_seconds_per_gib = 0;
  double floor_cpu_seconds_per_gib = 0;
  double cpu_ratio_to_floor = 0;
};

struct ReferenceReport {
  uint64_t bytes = 0;  // = unique bytes, split evenly over the ranks
  std::vector<double> write_seconds, read_cold_seconds, read_warm_seconds, memcpy_gibps;
  double write_gibps = 0, read_cold_gibps = 0, read_warm_gibps = 0, memcpy_gibps_median = 0;
  // The write reference's spread: the slowest and fastest of its measurements (right after
  // every save repetition, and right before every one but the first).
  double write_gibps_min = 0, write_gibps_max = 0;
  // CPU time of all ranks in each reference (as PhaseReport::cpu_seconds), and of one XXH3
  // pass over every rank's own state from memory, all ranks at once, per GiB hashed.
  std::vector<double> write_cpu_seconds, read_cold_cpu_seconds, read_warm_cpu_seconds;
  std::vector<double> hash_cpu_seconds_per_gib;
  double resident_fraction_before_cold_read = 0;  // max over repetitions
  // The read patterns of the load layouts (bench/read_pattern.h), read raw with the loads'
  // cache state every repetition: "load" (the save layout) and "reshard" (--load-layout), for
  // the load phases run.
  struct Pattern {
    std::string kind;  // "load" or "reshard"
    std::string layout;
    std::vector<double> seconds;
    double gibps = 0;
    uint64_t bytes = 0, runs = 0;  // of all ranks, one repetition's
  };
  std::vector<Pattern> patterns;
  // Object storage: requests of all ranks, summed over repetitions (writes; cold reads).
  uint64_t write_requests = 0, read_requests = 0;
};

struct BenchReport {
  BenchOptions options;
  int ranks = 1;
  std::string backend;
  std::string save_layout, load_layout;
  std::string throttle;  // empty when off; else how the cap is applied
  uint64_t unique_bytes = 0;
  uint64_t tensors = 0, chunks = 0, bytes_entries = 0;
  ReferenceReport reference;
  std::vector<PhaseReport> phases;
  std::vector<std::string> notes;  // skipped phases and the like
  bool scratch_in_memory = false;  // tmpfs/ramfs: "cold" cannot be cold (see notes)
  bool object_store = false;       // s3:// scratch: references are raw PUTs and GETs
  // tier: hosts (by host name, DCP_HOST_ID to emulate them), the partner copies kept, the
  // bytes of the last saved step in all hosts' memory (own files + replicas), and whether a
  // host's memory was removed before each restore (more than one host).
  int tier_hosts = 0;
  int tier_replicas = 0;
  uint64_t tier_bytes_in_memory = 0;
  bool tier_host_lost = false;
};

Result<BenchReport> RunBench(std::shared_ptr<Comm> comm, const BenchOptions& opts);

std::string FormatTable(const BenchReport& r);
std::string ReportJson(const BenchReport& r);  // the schema in docs/benchmarks.md

}  // namespace dcp::bench
