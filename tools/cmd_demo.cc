// dcp demo: save a model-shaped state dict, load it back into a different chunking, check
// every byte, and say what happened and how fast.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "dcp/checkpoint.h"
#include "metadata/json.h"
#include "tools/commands.h"
#include "tools/world.h"
#include "workload/layout_spec.h"
#include "workload/model.h"
#include "workload/populate.h"

namespace dcp::tools {
namespace {

struct DemoArgs {
  std::string dir;
  std::string model = "qwen3-30b-a3b";
  int layers = 4;
  double width_scale = 0.25;
  std::string save_layout;  // default: tp2,dp2 on 4 ranks, dp<world> otherwise
  std::string load_layout = "tp4";
};

double GiBps(uint64_t bytes, double s) { return s > 0 ? bytes / s / (1 << 30) : 0; }

int RunDemo(const DemoArgs& a) {
  std::shared_ptr<Comm> comm = WorldComm();
  const int rank = comm->rank(), world = comm->size();
  auto say = [&](const std::string& line) {
    if (rank == 0) std::cout << line << std::endl;
  };

  auto model = workload::MakeModel(a.model, a.layers, a.width_scale);
  auto save_layout = workload::ParseLayout(
      !a.save_layout.empty() ? a.save_layout
      : world == 4           ? std::string("tp2,dp2")
                             : "dp" + std::to_string(world));
  auto load_layout = workload::ParseLayout(a.load_layout);
  for (const Status& s : {model.status(), save_layout.status(), load_layout.status()}) {
    if (!s.ok()) throw Error(s);
  }
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
  std::snprintf(line, sizeof(line), "dcp demo: %s, %d layers, width x%.2f: %zu tensors, %s bf16, %d rank(s) (%s)",
                a.model.c_str(), a.layers, a.width_scale, model->tensors.size(),
                metadata::HumanBytes(model->TotalBytes()).c_str(), world,
                std::string(comm->backend()).c_str());
  say(line);

  auto sd = workload::PopulateStateDict(*model, *save_layout, rank);
  if (!sd.ok()) throw Error(sd.status());
  for (int round = 0; round < 2; ++round) {
    SaveResult r = save(sd->sd, ckpt, {.comm = comm});
    std::snprintf(line, sizeof(line),
                  "save %-7s -> %s: %s unique in %.2f s (%.2f GiB/s); plan+exchange %.3f s%s, "
                  "write %.2f s, commit %.3f s",
                  save_layout->ToString().c_str(), ckpt.c_str(),
                  metadata::HumanBytes(r.unique_bytes).c_str(), r.total_seconds,
                  GiBps(r.unique_bytes, r.total_seconds), r.plan_seconds,
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
        per_rank += (i ? ", " : "") + metadata::HumanBytes(b);
      }
      std::snprintf(line, sizeof(line),
                    "  written by rank: %s; total %s = unique bytes %s (held in memory: %s); "
                    "max/min %.3f",
                    per_rank.c_str(), metadata::HumanBytes(sum).c_str(),
                    metadata::HumanBytes(r.unique_bytes).c_str(),
                    metadata::HumanBytes(sd->tensor_bytes * world).c_str(),
                    lo ? static_cast<double>(hi) / lo : 0.0);
      say(line);
    }
  }

  // Load into a different chunking: this process plays every load rank v with
  // v % world == rank, one after another.
  uint64_t bytes = 0, files = 0;
  double seconds = 0;
  for (int v = rank; v < load_layout->WorldSize(); v += world) {
    auto dst = workload::MakeEmptyLike(*model, *load_layout, v);
    if (!dst.ok()) throw Error(dst.status());
    LoadResult r = load(dst->sd, ckpt, {.comm = comm});
    bytes += r.bytes_read;
    files += r.files_opened;
    seconds += r.total_seconds;
    ThrowIfError(workload::VerifyStateDict(dst->sd));
  }
  std::snprintf(line, sizeof(line),
                "load %-7s <- %s: resharded, rank %d read %s in %.2f s (%.2f GiB/s), %llu file "
                "opens; every byte checked: OK",
                load_layout->ToString().c_str(), ckpt.c_str(), rank,
                metadata::HumanBytes(bytes).c_str(), seconds, GiBps(bytes, seconds),
                static_cast<unsigned long long>(files));
  say(line);
  if (keep) {
    say("checkpoint kept: try `dcp inspect " + ckpt + "` and `dcp verify " + ckpt + "`");
  }
  ThrowIfError(comm->Barrier());
  if (!keep && rank == 0) std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

void AddDemo(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("demo", "Save a model-shaped state dict, load it resharded, check every byte");
  auto a = std::make_shared<DemoArgs>();
  cmd->add_option("--dir", a->dir, "keep the checkpoints in this directory");
  cmd->add_option("--model", a->model, "qwen3-30b-a3b or llama-dense")->capture_default_str();
  cmd->add_option("--layers", a->layers, "transformer layers")->capture_default_str();
  cmd->add_option("--width-scale", a->width_scale, "shrink widths, keep the tensor count")->capture_default_str();
  cmd->add_option("--save-layout", a->save_layout, "e.g. dp4, tp2,dp2 (default dp<ranks>)");
  cmd->add_option("--load-layout", a->load_layout, "e.g. tp4, ep4")->capture_default_str();
  cmd->callback([=] { *exit_code = RunDemo(*a); });
}

}  // namespace dcp::tools
