// dcp demo: save a model-shaped state dict, load it back into a different chunking, check
// every byte, and say what happened and how fast.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <set>

#include "dcp/async.h"
#include "dcp/checkpoint.h"
#include "dcp/format.h"
#include "tools/commands.h"
#include "tools/workload_flags.h"
#include "tools/world.h"
#include "workload/layout_spec.h"
#include "workload/model.h"
#include "workload/populate.h"

namespace dcp::tools {
namespace {

struct DemoArgs {
  std::string dir;
  // Save layout default: tp2,dp2 on 4 ranks, dp<world> otherwise; load layout default tp4.
  workload::WorkloadOptions workload{.layers = 4, .width_scale = 0.25};
};

double GiBps(uint64_t bytes, double s) { return s > 0 ? bytes / s / (1 << 30) : 0; }

// ---- Async save demo: the caller is blocked only while staging, training goes on ----

using DemoClock = std::chrono::steady_clock;
double Since(DemoClock::time_point t) {
  return std::chrono::duration<double>(DemoClock::now() - t).count();
}

// The largest of every rank's `v`.
double MaxOverRanks(Comm& comm, double v) {
  auto all = comm.AllGather(std::to_string(v));
  if (!all.ok()) throw Error(all.status());
  double m = 0;
  for (const std::string& s : *all) m = std::max(m, std::stod(s));
  return m;
}

// A simulated training step: fixed arithmetic on a small buffer, then an AllGather on the
// world comm (which also tells every rank whether every rank's save is done). Returns true
// when all ranks reported `done`.
bool TrainingStep(Comm& comm, std::vector<float>& work, bool done) {
  for (int rep = 0; rep < 8; ++rep) {
    for (size_t i = 0; i < work.size(); ++i) work[i] = work[i] * 0.999f + 1e-3f;
  }
  auto all = comm.AllGather(done ? "1" : "0");
  if (!all.ok()) throw Error(all.status());
  return std::all_of(all->begin(), all->end(), [](const std::string& s) { return s == "1"; });
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The physical reference, in this run: one thread memcpy of the same chunks into
// pre-faulted memory, every rank at once (as staging runs). The slowest rank's seconds.
double MemcpySeconds(Comm& comm, const StateDict& sd, std::vector<std::byte>& dst) {
  ThrowIfError(comm.Barrier());
  const auto t = DemoClock::now();
  uint64_t off = 0;
  for (const StateEntry& e : sd.entries()) {
    for (const TensorChunk& c : e.chunks) {
      std::memcpy(dst.data() + off, c.view.data, c.view.NumBytes());
      off += c.view.NumBytes();
    }
  }
  return MaxOverRanks(comm, Since(t));
}

// Rounds of: training steps alone, a synchronous save, the memcpy reference, and an async save
// with training steps until every rank's save is done. Medians over rounds: this machine is
// noisy, and the reference and the measured phase must meet the same conditions.
void AsyncSaveDemo(const std::shared_ptr<Comm>& comm, const StateDict& sd, uint64_t bytes,
                   const std::string& dir, const std::function<void(const std::string&)>& say) {
  char line[512];
  std::vector<std::byte> dst(bytes);
  std::memset(dst.data(), 0, dst.size());  // pre-faulted, as the staging pool is
  std::vector<float> work(1 << 18, 1.0f);

  // Prepare allocates and pre-faults the staging pool and derives the saver's communicator
  // ahead of time, so even the first async save blocks only for its copy; all reuse both.
  AsyncSaver saver;  // default options: staging threads per free core, persisting niced
  ThrowIfError(comm->Barrier());
  const auto prepare_start = DemoClock::now();
  saver.Prepare(sd, {.comm = comm});
  const double prepare_s = MaxOverRanks(*comm, Since(prepare_start));
  const AsyncSave first = saver.Save(sd, dir + "/step_300", {.comm = comm});
  first.Get();

  const int kRounds = 3, kAloneSteps = 10;
  std::vector<double> ratio, blocked, memcpy_s, sync_s, persist_s, step_alone, step_during;
  int steps = 0;
  StagingStats st;
  for (int round = 0; round < kRounds; ++round) {
    ThrowIfError(comm->Barrier());
    auto t = DemoClock::now();
    for (int i = 0; i < kAloneSteps; ++i) TrainingStep(*comm, work, false);
    step_alone.push_back(Since(t) / kAloneSteps);
    sync_s.push_back(save(sd, dir + "/step_200", {.comm = comm}).total_seconds);
    memcpy_s.push_back(MemcpySeconds(*comm, sd, dst));

    ThrowIfError(comm->Barrier());
    t = DemoClock::now();
    const AsyncSave h = saver.Save(sd, dir + "/step_400", {.comm = comm});
    blocked.push_back(MaxOverRanks(*comm, Since(t)));
    const auto persist_start = DemoClock::now();
    int n = 1;
    while (!TrainingStep(*comm, work, h.Poll())) ++n;
    persist_s.push_back(Since(persist_start));
    step_during.push_back(persist_s.back() / n);
    steps += n;
    h.Get();
    st = h.staging();
    ratio.push_back(blocked.back() / memcpy_s.back());
  }
  std::snprintf(line, sizeof(line),
                "async save -> %s/step_400 (median of %d): blocked %.3f s = %.2fx a plain memcpy "
                "of the same bytes (%.3f s, %.2f GiB/s); staging %s at %.2f GiB/s on %d "
                "thread(s), pool %s (Prepare ahead of time: %.3f s; the first async save then "
                "blocked %.3f s)",
                dir.c_str(), kRounds, Median(blocked), Median(ratio), Median(memcpy_s),
                GiBps(bytes, Median(memcpy_s)), HumanBytes(st.bytes_staged).c_str(),
                GiBps(st.bytes_staged, st.copy_seconds), st.threads,
                st.reused ? "reused" : "allocated", prepare_s, first.staging().blocked_seconds);
  say(line);
  const double alone = Median(step_alone), during = Median(step_during);
  std::snprintf(line, sizeof(line),
                "  persisted in the background in %.2f s (synchronous save %.2f s) while "
                "%d simulated training steps ran (each: compute + AllGather on the world comm): "
                "%.1f ms/step vs %.1f ms alone (%+.0f%%)",
                Median(persist_s), Median(sync_s), steps / kRounds, during * 1e3, alone * 1e3,
                alone > 0 ? (during / alone - 1) * 100 : 0.0);
  say(line);
}

int RunDemo(const DemoArgs& a) {
  std::shared_ptr<Comm> comm = WorldComm();
  const int rank = comm->rank(), world = comm->size();
  auto say = [&](const std::string& line) {
    if (rank == 0) std::cout << line << std::endl;
  };

  const workload::Workload w = ValueOrThrow(workload::MakeWorkload(
      a.workload, world == 4 ? std::string("tp2,dp2") : "dp" + std::to_string(world), "tp4"));
  const workload::ModelSpec* model = &w.model;
  const workload::LayoutSpec* save_layout = &w.save_layout;
  const workload::LayoutSpec* load_layout = &w.load_layout;
  if (save_layout->WorldSize() != world) {
    throw Error(InvalidArgument("save layout " + save_layout->ToString() + " needs " +
                                std::to_string(save_layout->WorldSize()) + " ranks, this job has " +
                                std::to_string(world)));
  }
  if (load_layout->WorldSize() % world != 0) {
    throw Error(InvalidArgument("load layout " + load_layout->ToString() +
                                " must use a multiple of " + std::to_string(world) + " ranks"));
  }

  std::string dir = a.dir;
  const bool keep = !dir.empty();
  if (!keep) {
    // One directory for all ranks: rank 0 names it.
    if (rank == 0) {
      dir = (std::filesystem::temp_directory_path() / ("dcp-demo-" + std::to_string(getpid())))
                .string();
    }
    ThrowIfError(comm->Broadcast(dir, 0));
  }
  const std::string ckpt = dir + "/step_100";

  char line[512];
  std::snprintf(line, sizeof(line),
                "dcp demo: %s, %d layers, width x%.2f: %zu tensors, %s bf16, %d rank(s) (%s)",
                a.workload.model.c_str(), a.workload.layers, a.workload.width_scale,
                model->tensors.size(), HumanBytes(model->TotalBytes()).c_str(), world,
                std::string(comm->backend()).c_str());
  say(line);

  auto sd = workload::PopulateStateDict(*model, *save_layout, rank);
  if (!sd.ok()) throw Error(sd.status());
  for (int round = 0; round < 2; ++round) {
    SaveResult r = save(sd->sd, ckpt, {.comm = comm});
    std::snprintf(line, sizeof(line),
                  "save %-7s -> %s: %s unique in %.2f s (%.2f GiB/s); plan+exchange %.3f s%s, "
                  "write %.2f s, commit %.3f s",
                  save_layout->ToString().c_str(), ckpt.c_str(), HumanBytes(r.unique_bytes).c_str(),
                  r.total_seconds, GiBps(r.unique_bytes, r.total_seconds), r.plan_seconds,
                  r.plan_cache_hit ? " (plan cache hit)" : "", r.write_seconds, r.commit_seconds);
    say(line);
    // Replicas are written once, by byte-balanced writers: show who wrote what.
    auto all = comm->AllGather(std::to_string(r.bytes_written));
    if (!all.ok()) throw Error(all.status());
    if (round == 0 && world > 1) {
      uint64_t sum = 0, lo = UINT64_MAX, hi = 0;
      std::string per_rank;
      for (size_t i = 0; i < all->size(); ++i) {
        uint64_t b = std::stoull((*all)[i]);
        sum += b;
        lo = std::min(lo, b);
        hi = std::max(hi, b);
        per_rank += (i ? ", " : "") + HumanBytes(b);
      }
      std::snprintf(line, sizeof(line),
                    "  written by rank: %s; total %s = unique bytes %s (held in memory: %s); "
                    "max/min %.3f",
                    per_rank.c_str(), HumanBytes(sum).c_str(), HumanBytes(r.unique_bytes).c_str(),
                    HumanBytes(sd->tensor_bytes * world).c_str(),
                    lo ? static_cast<double>(hi) / lo : 0.0);
      say(line);
    }
  }

  // Load into a different chunking: this process holds the chunks of every load rank v
  // with v % world == rank, in one state dict (a chunk held by several of them once), and
  // loads them in one call, as a process holding several shards would: each stored byte it
  // needs is read once, whatever number of its chunks it feeds.
  std::vector<workload::OwnedStateDict> parts;
  for (int v = rank; v < load_layout->WorldSize(); v += world) {
    auto dst = workload::MakeEmptyLike(*model, *load_layout, v);
    if (!dst.ok()) throw Error(dst.status());
    parts.push_back(std::move(dst).value());
  }
  StateDict dst;
  {
    std::set<std::pair<std::string, Box>> held;
    for (const workload::OwnedStateDict& part : parts) {
      for (const StateEntry& e : part.sd.entries()) {
        if (e.kind == StateEntry::Kind::kBytes) {
          if (!dst.find(e.fqn)) dst.add_bytes(e.fqn);
          continue;
        }
        if (e.chunks.empty() && !dst.find(e.fqn)) dst.add_empty(e.fqn, e.dtype, e.global_shape);
        for (const TensorChunk& c : e.chunks) {
          if (held.insert({e.fqn, c.box}).second) {
            dst.add(e.fqn, c.view, Chunk{e.global_shape, c.box.offsets});
          }
        }
      }
    }
  }
  // Sums (and the slowest rank's time) over all ranks.
  auto totals = [&](std::vector<double> mine) {
    std::string msg(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(double));
    auto all = comm->AllGather(msg);
    if (!all.ok()) throw Error(all.status());
    std::vector<double> sum(mine.size(), 0.0);
    for (const std::string& m : *all) {
      for (size_t i = 0; i < mine.size(); ++i) {
        double x;
        std::memcpy(&x, m.data() + i * sizeof(double), sizeof x);
        sum[i] = i == 0 ? std::max(sum[i], x) : sum[i] + x;
      }
    }
    return sum;
  };
  // Broadcast needs peers: one process loads once.
  for (bool broadcast : world > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
    // All ranks share this machine: broadcast within it explicitly to show read-once
    // (by default ranks of one host read through their shared page cache instead).
    LoadResult r = load(dst, ckpt,
                        {.comm = comm,
                         .broadcast = broadcast,
                         .broadcast_within_host = true,
                         .broadcast_cached = true});
    ThrowIfError(workload::VerifyStateDict(dst));
    auto t = totals({r.total_seconds, static_cast<double>(r.bytes_read),
                     static_cast<double>(r.files_opened), static_cast<double>(r.shared_shards),
                     static_cast<double>(r.shared_chunks), static_cast<double>(r.broadcasts),
                     static_cast<double>(r.batches)});
    std::snprintf(line, sizeof(line),
                  "load %-7s <- %s: broadcast %-3s %.2f s; storage read %s by all ranks (%.2fx "
                  "the checkpoint), %.0f file opens; %.0f shared shards and %.0f shared stored "
                  "chunks in %.0f broadcasts (%.0f batches); every byte checked: OK",
                  load_layout->ToString().c_str(), ckpt.c_str(), broadcast ? "on" : "off", t[0],
                  HumanBytes(static_cast<uint64_t>(t[1])).c_str(),
                  model->TotalBytes() ? t[1] / model->TotalBytes() : 0.0, t[2], t[3], t[4], t[5],
                  t[6]);
    say(line);
  }

  AsyncSaveDemo(comm, sd->sd, sd->tensor_bytes, dir, say);

  if (keep) {
    say("checkpoint kept: try `dcp inspect " + ckpt + "` and `dcp verify " + ckpt + "`");
  }
  ThrowIfError(comm->Barrier());
  if (!keep && rank == 0) std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

void AddDemo(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "demo", "Save a model-shaped state dict, load it resharded, check every byte");
  auto a = std::make_shared<DemoArgs>();
  cmd->add_option("--dir", a->dir, "keep the checkpoints in this directory");
  AddWorkloadFlags(cmd, &a->workload,
                   "e.g. dp4, tp2,dp2 (default tp2,dp2 on 4 ranks, else dp<ranks>)",
                   "e.g. tp4, ep4 (default tp4)");
  cmd->callback([=] { *exit_code = RunDemo(*a); });
}

}  // namespace dcp::tools
