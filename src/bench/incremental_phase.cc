// `dcp bench --phases incremental`: a full save, then a fraction of the state trained (whole
// tensors in name order, each that fits within --incremental-changed of the checkpoint's
// bytes; the rest frozen, as in parameter-efficient fine-tuning), then an incremental save against
// the full one; and loads of both steps with the same cache state. Every byte of both loads
// is checked.
#include <array>
#include <set>

#include "bench/runner.h"
#include "checkpoint/load.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/save.h"

namespace dcp::bench::internal {
namespace {

// The tensors a run trains: in name order, each that still fits within `fraction` of the
// checkpoint's bytes (adapters and norms are small beside frozen weights).
std::set<std::string> TrainedTensors(const metadata::Metadata& md, double fraction) {
  const double want = fraction * static_cast<double>(md.TotalDataBytes());
  std::set<std::string> out;
  double have = 0;
  for (const auto& t : md.tensors) {
    double bytes = 0;
    for (const auto& c : t.chunks) bytes += static_cast<double>(c.byte_length);
    if (have + bytes > want) continue;
    out.insert(t.fqn);
    have += bytes;
  }
  return out;
}

// Training stand-in: flips every byte of the chunks of `trained` (its own inverse).
void Flip(StateDict& sd, const std::set<std::string>& trained) {
  for (const StateEntry& e : sd.entries()) {
    if (!trained.count(e.fqn)) continue;
    for (const TensorChunk& c : e.chunks) {
      std::byte* p = c.view.bytes();
      for (uint64_t i = 0; i < c.view.NumBytes(); ++i) p[i] ^= std::byte{0xff};
    }
  }
}

}  // namespace

Status Runner::RunIncrementalPhase(PhaseReport* full, PhaseReport* incremental,
                                   PhaseReport* load_full, PhaseReport* load_incremental) {
  const std::string parent = storage::ParentPath(ckpt_);
  const std::string base = storage::JoinPath(parent, "incremental_base");
  const std::string step = storage::JoinPath(parent, "incremental_step");
  std::set<std::string> trained;
  for (int rep = 0; rep < o_.repeat; ++rep) {
    DCP_RETURN_IF_ERROR(DeleteAndSettle(step));
    DCP_RETURN_IF_ERROR(DeleteAndSettle(base));
    SaveResult r;
    DCP_ASSIGN_OR_RETURN(double s, Timed([&] {
                           auto res = checkpoint::Save(source_.sd, base,
                                                       SaveOptions{.comm = comm_ptr_}, *fs_);
                           if (res.ok()) r = *res;
                           return res.status();
                         }));
    Took(full, s);
    DCP_ASSIGN_OR_RETURN(auto full_sums, SumAtRoot(comm_, {r.bytes_written}));
    if (rank_ == 0) full->bytes_written = full_sums[0];
    if (trained.empty()) {
      // Every rank reads the metadata: each must flip the same tensors.
      DCP_ASSIGN_OR_RETURN(metadata::Metadata md, checkpoint::ReadMetadata(*fs_, base));
      trained = TrainedTensors(md, o_.incremental_changed);
      uint64_t changed = 0;
      for (const auto& t : md.tensors) {
        if (!trained.count(t.fqn)) continue;
        for (const auto& c : t.chunks) changed += c.byte_length;
      }
      incremental->bytes_changed = changed;
    }
    Flip(source_.sd, trained);
    // The same delete + sync + pause as before the full save.
    DCP_RETURN_IF_ERROR(DeleteAndSettle(step));
    DCP_ASSIGN_OR_RETURN(s, Timed([&] {
                           SaveOptions so{.comm = comm_ptr_};
                           so.incremental_base = base;
                           auto res = checkpoint::Save(source_.sd, step, so, *fs_);
                           if (res.ok()) r = *res;
                           return res.status();
                         }));
    Took(incremental, s);
    DCP_ASSIGN_OR_RETURN(auto sums, SumAtRoot(comm_, {r.bytes_written, r.bytes_referenced}));
    if (rank_ == 0) {
      incremental->bytes_written = sums[0];
      incremental->bytes_referenced = sums[1];
    }
    Flip(source_.sd, trained);  // the source as the other phases know it
    // Loads of each step with the cache state of --cache (for the incremental step, its own
    // files and the base's it references). Alternating which goes first, as the tier phase:
    // the first read after the saves pays for memory the second one finds faulted in.
    const std::array<PhaseReport*, 2> order = rep % 2 == 0
                                                  ? std::array{load_full, load_incremental}
                                                  : std::array{load_incremental, load_full};
    for (PhaseReport* p : order) {
      const bool inc = p == load_incremental;
      auto dst = workload::MakeEmptyLike(model_, save_layout_, rank_);
      DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, dst.status()));
      DCP_RETURN_IF_ERROR(PrepareCache(base, o_.cold).status());
      if (inc) DCP_RETURN_IF_ERROR(PrepareCache(step, o_.cold).status());
      LoadResult lr;
      DCP_ASSIGN_OR_RETURN(double ls, Timed([&] {
                             auto res = checkpoint::Load(dst->sd, inc ? step : base,
                                                         LoadOptions{.comm = comm_ptr_}, *fs_);
                             if (res.ok()) lr = *res;
                             return res.status();
                           }));
      Took(p, ls);
      if (inc) Flip(dst->sd, trained);  // back to the pattern, to check every byte
      DCP_RETURN_IF_ERROR(AgreeOnStatus(
          comm_, workload::VerifyStateDict(dst->sd).Annotate("bench: " + p->name + ": ")));
      DCP_ASSIGN_OR_RETURN(auto read, SumAtRoot(comm_, {lr.bytes_read, lr.files_opened}));
      if (rank_ == 0) {
        p->bytes_read_storage = read[0];
        p->files_opened = read[1];
      }
    }
  }
  return OnRoot([&] {
    (void)RemoveTree(step);
    (void)RemoveTree(base);
    return OkStatus();
  });
}

}  // namespace dcp::bench::internal
