// dcp convert SRC DST [--to hf]: HuggingFace safetensors <-> dcp checkpoints, streaming.
#include <filesystem>
#include <iostream>
#include <optional>
#include <set>

#include "dcp/convert.h"
#include "dcp/format.h"
#include "tools/commands.h"
#include "tools/progress.h"
#include "tools/world.h"

namespace dcp::tools {
namespace {

struct ConvertArgs {
  std::string src, dst;
  std::string to = "dcp";
  std::string max_shard_size = "5GB";
  std::string buffer_size = "256MB";
  bool quiet = false;
  bool overwrite = false;
  bool size_options_given = false;  // --max-shard-size or --buffer-size on the command line
};

double GiBps(uint64_t bytes, double s) { return s > 0 ? bytes / s / (1 << 30) : 0; }

// Names of the data files in `dir` now (none when it does not exist yet).
std::set<std::string> DataFiles(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("data-", 0) == 0) out.insert(n);
  }
  return out;
}

void ToDcp(const ConvertArgs& a, const std::shared_ptr<Comm>& comm) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(a.src) / "dcp.metadata", ec) ||
      std::filesystem::exists(std::filesystem::path(a.src) / "dcp.metadata.rank0", ec)) {
    throw Error(
        InvalidArgument(a.src +
                        " is a dcp checkpoint, and dcp convert writes dcp by default; to export "
                        "it to HuggingFace safetensors, add --to hf"));
  }
  if (a.size_options_given) {
    throw Error(InvalidArgument(
        "--max-shard-size and --buffer-size apply to --to hf only (a dcp checkpoint "
        "has one data file per rank)"));
  }
  if (a.overwrite) {
    throw Error(InvalidArgument(
        "--overwrite applies to --to hf only (a dcp save replaces the checkpoint in "
        "DST atomically anyway)"));
  }
  const bool show = comm->rank() == 0 && !a.quiet;
  std::optional<Progress> progress;
  std::optional<PollProgress> poll;
  // The save is one call: progress is the growth of the new data files in DST (every rank's,
  // on a shared file system).
  const std::set<std::string> before = DataFiles(a.dst);
  HfToDcpOptions opts{.comm = comm};
  opts.on_start = [&](uint64_t total, uint64_t) {
    if (!show || a.dst.starts_with("s3://")) return;  // progress watches local files grow
    progress.emplace("dcp convert " + a.src, total, 0, "data files written");
    poll.emplace(*progress, [&a, &before, total]() -> std::pair<uint64_t, uint64_t> {
      uint64_t bytes = 0, files = 0;
      std::error_code ec;
      for (const std::string& n : DataFiles(a.dst)) {
        if (before.count(n)) continue;
        uint64_t size = std::filesystem::file_size(std::filesystem::path(a.dst) / n, ec);
        if (!ec) bytes += size, ++files;
      }
      // The files also hold safetensors headers, which the total (tensor bytes) does not count:
      // never show more than 100%.
      return {std::min(bytes, total), files};
    });
  };
  const std::optional<HfToDcpResult> r = convert_hf_to_dcp(a.src, a.dst, opts);
  poll.reset();  // stops the progress line before the summary
  if (comm->rank() == 0 && !r->dropped_metadata_keys.empty()) {
    std::string names;
    for (const std::string& n : r->dropped_metadata_keys) names += (names.empty() ? "" : ", ") + n;
    std::cerr << "dcp convert: warning: the source's __metadata__ keys " << names
              << " are not kept (a dcp checkpoint holds tensors and bytes entries only)\n";
  }
  if (comm->rank() == 0) {
    std::printf(
        "converted %s (HuggingFace, %s) to dcp checkpoint %s on %d rank(s) in %.2f s: "
        "%.2f GiB/s\n",
        a.src.c_str(), HumanBytes(r->total_bytes).c_str(), a.dst.c_str(), comm->size(), r->seconds,
        GiBps(r->total_bytes, r->seconds));
  }
}

void ToHf(const ConvertArgs& a, const std::shared_ptr<Comm>& comm) {
  DcpToHfOptions opts{.comm = comm};
  opts.max_shard_bytes = ValueOrThrow(ParseByteSize(a.max_shard_size));
  opts.buffer_bytes = ValueOrThrow(ParseByteSize(a.buffer_size));
  opts.overwrite = a.overwrite;
  const bool show = comm->rank() == 0 && !a.quiet;
  std::optional<Progress> progress;
  opts.on_start = [&](uint64_t my_bytes, uint64_t my_tensors) {
    if (show) {
      progress.emplace("dcp convert " + a.src + (comm->size() > 1 ? " (rank 0)" : ""), my_bytes,
                       my_tensors, "tensors");
    }
  };
  opts.progress = [&](uint64_t bytes, uint64_t tensors) {
    if (progress) progress->Update(bytes, tensors);
  };
  std::optional<DcpToHfResult> r;
  try {
    r = convert_dcp_to_hf(a.src, a.dst, opts);
  } catch (...) {
    if (progress) progress->Finish();
    throw;
  }
  if (progress) progress->Finish();
  if (comm->rank() != 0) return;
  if (!r->skipped_bytes_entries.empty()) {
    std::string names;
    for (const std::string& n : r->skipped_bytes_entries) names += (names.empty() ? "" : ", ") + n;
    std::cerr << "dcp convert: warning: skipped " << r->skipped_bytes_entries.size()
              << " bytes entr" << (r->skipped_bytes_entries.size() == 1 ? "y" : "ies")
              << " (safetensors holds tensors only): " << names << "\n";
  }
  std::printf(
      "converted %s (%llu tensors, %s) to HuggingFace %s: %llu shard(s) on %d rank(s) in "
      "%.2f s: %.2f GiB/s\n",
      a.src.c_str(), (unsigned long long)r->total_tensors, HumanBytes(r->total_bytes).c_str(),
      a.dst.c_str(), (unsigned long long)r->shards_total, comm->size(), r->seconds,
      GiBps(r->total_bytes, r->seconds));
}

}  // namespace

void AddConvert(CLI::App& app, int* /*exit_code: errors are thrown*/) {
  auto* cmd = app.add_subcommand(
      "convert", "Convert a HuggingFace safetensors checkpoint to dcp, or back with --to hf");
  auto a = std::make_shared<ConvertArgs>();
  cmd->add_option("src", a->src,
                  "source: a .safetensors file or a HuggingFace directory (model.safetensors or "
                  "model.safetensors.index.json), or a dcp checkpoint with --to hf")
      ->required();
  cmd->add_option("dst", a->dst, "output directory")->required();
  cmd->add_option("--to", a->to, "output format: dcp (default) or hf")
      ->check(CLI::IsMember({"dcp", "hf"}));
  auto* max_shard = cmd->add_option(
      "--max-shard-size", a->max_shard_size,
      "--to hf: largest output file (KB/MB/GB are powers of 10, KiB/MiB/GiB of 2); a "
      "larger tensor gets a file of its own (default 5GB)");
  auto* buffer =
      cmd->add_option("--buffer-size", a->buffer_size,
                      "--to hf: tensors are loaded in groups of up to this size (default 256MB)");
  cmd->add_flag("--overwrite", a->overwrite,
                "--to hf: replace a non-empty DST (atomically: the old export stays until the "
                "new one is complete)");
  cmd->add_flag("--quiet", a->quiet, "no progress line");
  cmd->callback([=] {
    // Errors reach main(), which prints an error every rank agreed on once.
    a->size_options_given = max_shard->count() > 0 || buffer->count() > 0;
    std::shared_ptr<Comm> comm = WorldComm();
    if (a->to == "hf") {
      ToHf(*a, comm);
    } else {
      ToDcp(*a, comm);
    }
  });
}

}  // namespace dcp::tools
