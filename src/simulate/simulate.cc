#include "simulate/simulate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "checkpoint/broadcast_load.h"
#include "checkpoint/save.h"
#include "checkpoint/write_results.h"
#include "dcp/checkpoint.h"
#include "dcp/format.h"
#include "dcp/layout.h"
#include "dcp/state_dict.h"
#include "metadata/codec.h"
#include "metadata/metadata.h"
#include "planner/broadcast_plan.h"
#include "planner/load_plan.h"
#include "planner/plan_classes.h"
#include "planner/save_plan.h"
#include "workload/layout_spec.h"
#include "workload/model.h"
#include "workload/populate.h"

namespace dcp::simulate {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The bytes entries every workload state dict carries after its tensors (populate.h).
constexpr std::string_view kBytesEntries[] = {workload::kOptimParamGroups, workload::kTrainStep};

// The items `rank` holds under `layout`, in state dict order: what BuildLocalSavePlan lists
// for the state dict PopulateStateDict builds, without its memory.
Result<planner::LocalSavePlan> PlanFor(const workload::ModelSpec& model,
                                       const workload::LayoutSpec& layout, int rank) {
  DCP_ASSIGN_OR_RETURN(auto held, workload::ChunksForRank(model, layout, rank));
  planner::LocalSavePlan plan;
  plan.items.reserve(held.size() + std::size(kBytesEntries));
  for (auto& [i, box] : held) {
    const workload::TensorSpec& t = model.tensors[i];
    const uint64_t nbytes = *DTypeBytes(t.dtype, box.NumElements());
    plan.items.push_back({t.fqn, false, t.dtype, t.shape, std::move(box), nbytes});
  }
  for (std::string_view name : kBytesEntries) {
    plan.items.push_back({std::string(name), true, DType::kU8, Shape(), Box(),
                          workload::ExpectedBytesEntry(name).size()});
  }
  return plan;
}

// The ranks of a layout grouped as Save and Load group them (planner::GroupByPlanHash), with
// each class's plan.
struct SimClasses {
  std::vector<planner::LocalSavePlan> plans;  // one per class
  std::vector<std::vector<int>> holders;      // sorted ranks per class
  std::vector<uint64_t> encoded_sizes;        // per class
  std::vector<uint64_t> hash_of_rank;
};

// Ranks that differ only in their data-parallel coordinates hold the same chunks, so one plan
// is built per combination of the other coordinates and its hash given to all of them; the
// ranks are then grouped by hash with Save's own code. With `check`, every rank's plan is
// built and hashed.
Result<SimClasses> FindClasses(const workload::ModelSpec& model, const workload::LayoutSpec& layout,
                               bool check) {
  const std::vector<int> mesh = layout.MeshShape();
  const int n = layout.WorldSize();
  std::map<std::vector<int>, std::vector<int>> by_key;
  for (int r = 0; r < n; ++r) {
    std::vector<int> key = MeshCoords(r, mesh);
    for (size_t d = 0; d < mesh.size(); ++d) {
      if (layout.dims[d].axis == workload::MeshAxis::kDp) key[d] = 0;
    }
    by_key[std::move(key)].push_back(r);
  }
  SimClasses out;
  out.hash_of_rank.resize(n);
  struct Built {
    planner::LocalSavePlan plan;
    uint64_t encoded_size = 0;
  };
  std::unordered_map<uint64_t, Built> by_hash;
  for (auto& [key, ranks] : by_key) {
    DCP_ASSIGN_OR_RETURN(planner::LocalSavePlan plan, PlanFor(model, layout, ranks.front()));
    const std::string enc = planner::EncodeLocalPlan(plan);
    const uint64_t h = planner::PlanHash(enc);
    for (int r : ranks) out.hash_of_rank[r] = h;
    by_hash.try_emplace(h, Built{std::move(plan), enc.size()});
  }
  if (check) {
    for (int r = 0; r < n; ++r) {
      DCP_ASSIGN_OR_RETURN(planner::LocalSavePlan plan, PlanFor(model, layout, r));
      if (planner::PlanHash(planner::EncodeLocalPlan(plan)) != out.hash_of_rank[r]) {
        return Internal("simulate: rank " + std::to_string(r) + " of layout " + layout.ToString() +
                        " does not hold the plan of its class");
      }
    }
  }
  planner::PlanClasses classes = planner::GroupByPlanHash(out.hash_of_rank);
  for (auto& holders : classes.holders) {
    Built& b = by_hash.at(out.hash_of_rank[holders.front()]);
    out.plans.push_back(std::move(b.plan));
    out.encoded_sizes.push_back(b.encoded_size);
    out.holders.push_back(std::move(holders));
  }
  return out;
}

Distribution Distribute(const std::vector<uint64_t>& per_class,
                        const std::vector<std::vector<int>>& holders, int ranks) {
  Distribution d;
  d.min = UINT64_MAX;
  for (size_t c = 0; c < per_class.size(); ++c) {
    d.min = std::min(d.min, per_class[c]);
    d.max = std::max(d.max, per_class[c]);
    d.sum += per_class[c] * holders[c].size();
  }
  if (per_class.empty()) d.min = 0;
  d.mean = ranks ? static_cast<double>(d.sum) / ranks : 0;
  return d;
}

// The metadata a save of `plan` would commit, through save's own builder: the files laid out
// as the writers would (safetensors headers, block checksums), checksum values made up. Also
// the bytes each rank writes and the bytes of the write results gathered at rank 0.
Result<metadata::Metadata> BuildMetadata(const planner::GlobalSavePlan& plan, int n,
                                         std::vector<uint64_t>* bytes_written,
                                         uint64_t* gather_bytes) {
  const std::vector<checkpoint::Written> written =
      checkpoint::LayOutWrites(plan, n, metadata::kChecksumBlockSize);
  bytes_written->assign(n, 0);
  *gather_bytes = 0;
  for (int r = 0; r < n; ++r) {
    for (const auto* f : {&written[r].tensors, &written[r].bytes}) {
      for (const auto& range : f->ranges) (*bytes_written)[r] += range.byte_length;
    }
    *gather_bytes += 1 + checkpoint::EncodeWritten(written[r]).size();  // + the status tag
  }
  return checkpoint::BuildMetadata(plan, 0x5151dca7e5eedULL, written, n);
}

// A destination state dict for `plan`'s items whose views point at one dummy byte: the
// load planner checks that memory exists but never touches it.
StateDict DestinationFor(const planner::LocalSavePlan& plan) {
  static std::byte dummy;
  StateDict sd;
  for (const planner::SaveItem& it : plan.items) {
    if (it.is_bytes) {
      sd.add_bytes(it.fqn);
    } else {
      sd.add(it.fqn, TensorView(&dummy, it.dtype, it.box.lengths),
             Chunk{it.global_shape, it.box.offsets});
    }
  }
  return sd;
}

// The identity Load gathers for read-once broadcast: the rank's non-empty destination
// shards by (metadata tensor index, box), as checkpoint/load.cc builds it.
planner::LoadIdentity IdentityFor(const planner::LocalSavePlan& plan,
                                  const metadata::Metadata& md) {
  planner::LoadIdentity id;
  for (const planner::SaveItem& it : plan.items) {
    if (it.is_bytes || it.box.Empty()) continue;
    const metadata::TensorMeta* t = md.FindTensor(it.fqn);
    if (!t) continue;
    id.shards.push_back({static_cast<uint32_t>(t - md.tensors.data()), it.box, it.nbytes, true});
  }
  std::sort(id.shards.begin(), id.shards.end(), [](const auto& a, const auto& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.box < b.box;
  });
  return id;
}

// Read-once broadcast for the load classes: the plan every rank would compute, and the
// broadcasts and batches its execution would issue.
void PlanBroadcasts(const std::vector<planner::LocalSavePlan>& plans,
                    const std::vector<std::vector<int>>& holders, const metadata::Metadata& md,
                    int n, int ranks_per_host, SimulateReport* r) {
  std::vector<planner::LoadIdentity> ids;
  r->identity_exchange_bytes_per_rank = 8 * static_cast<uint64_t>(n);
  for (const auto& p : plans) {
    ids.push_back(IdentityFor(p, md));
    r->identity_exchange_bytes_per_rank += planner::EncodeLoadIdentity(ids.back()).size();
  }
  const auto t0 = Clock::now();
  // As Load with checksums verified: stored chunks that several ranks would each fetch are
  // read once, whole, and broadcast to their consumers.
  std::vector<uint64_t> hosts(n);
  for (int i = 0; i < n; ++i) hosts[i] = static_cast<uint64_t>(i / std::max(ranks_per_host, 1));
  planner::BroadcastPlan bp = planner::PlanBroadcast(ids, holders, n, {&md, true, &hosts});
  r->broadcast_plan_seconds = Since(t0);
  r->broadcast_planned = true;
  r->broadcast_groups = bp.groups.size();
  r->shared_shards = bp.shards.size();
  r->shared_chunks = bp.chunks.size();
  r->broadcast_batch_bytes = LoadOptions{}.broadcast_batch_bytes;
  // The very schedule Load executes (checkpoint/broadcast_load.cc) over MPI: shared stored
  // chunks by broadcast, shared shards by rounds of all-gathers in place.
  std::vector<uint64_t> ops_of_group(bp.groups.size(), 0);
  for (const planner::BroadcastOp& op : planner::ScheduleBroadcasts(bp, r->broadcast_batch_bytes)) {
    ++ops_of_group[op.group];
    ++r->broadcast_ops;
    if (op.items.size() > 1) ++r->broadcast_batches;
  }
  for (const planner::GatherOp& op : planner::ScheduleGathers(
           bp, checkpoint::GatherLimitsFor(LoadOptions{}.max_broadcast_buffer_bytes, true))) {
    ++ops_of_group[op.group];
    ++r->gather_ops;
  }
  std::vector<uint64_t> per_rank(n, 0), groups_of_rank(n, 0);
  for (size_t g = 0; g < bp.groups.size(); ++g) {
    for (int rank : bp.groups[g]) {
      per_rank[rank] += ops_of_group[g];
      ++groups_of_rank[rank];
    }
  }
  for (int i = 0; i < n; ++i) {
    if (groups_of_rank[i] == 0) continue;
    r->max_collectives_per_group =
        std::max(r->max_collectives_per_group,
                 static_cast<double>(per_rank[i]) / static_cast<double>(groups_of_rank[i]));
  }
  auto dist = [n](const std::vector<uint64_t>& v) {
    Distribution d;
    d.min = v.empty() ? 0 : *std::min_element(v.begin(), v.end());
    d.max = v.empty() ? 0 : *std::max_element(v.begin(), v.end());
    for (uint64_t x : v) d.sum += x;
    d.mean = n ? static_cast<double>(d.sum) / n : 0;
    return d;
  };
  r->collectives_per_rank = dist(per_rank);
  r->groups_per_rank = dist(groups_of_rank);
  r->read_bytes_broadcast = dist(bp.read_bytes);
}

}  // namespace

Result<SimulateReport> Simulate(const SimulateOptions& o) {
  SimulateReport r;
  r.options = o;
  const int n = o.ranks;
  if (n < 1) return InvalidArgument("simulate: --ranks must be >= 1");
  DCP_ASSIGN_OR_RETURN(workload::Workload w,
                       workload::MakeWorkload(o.workload, "dp" + std::to_string(n)));
  const workload::ModelSpec& model = w.model;
  const workload::LayoutSpec& save_layout = w.save_layout;
  const workload::LayoutSpec& load_layout = w.load_layout;
  r.model_bytes = model.TotalBytes();
  // The load runs on --ranks ranks; the save may have run on another number (a checkpoint
  // written by one rank and loaded by many replicas).
  if (load_layout.WorldSize() != n) {
    return InvalidArgument("simulate: layout " + load_layout.ToString() + " has " +
                           std::to_string(load_layout.WorldSize()) + " ranks, --ranks is " +
                           std::to_string(n));
  }
  const int save_n = save_layout.WorldSize();
  r.save_layout = save_layout.ToString();
  r.load_layout = load_layout.ToString();

  // What one real rank does before the exchange: its local plan, encoded and hashed.
  auto t0 = Clock::now();
  {
    DCP_ASSIGN_OR_RETURN(planner::LocalSavePlan mine, PlanFor(model, save_layout, 0));
    const std::string enc = planner::EncodeLocalPlan(mine);
    volatile uint64_t h = planner::PlanHash(enc);
    (void)h;
  }
  r.local_plan_seconds = Since(t0);

  // Save: classes, then the global plan over the distinct plans.
  t0 = Clock::now();
  DCP_ASSIGN_OR_RETURN(SimClasses save, FindClasses(model, save_layout, o.check_classes));
  r.classes_seconds = Since(t0);
  r.classes_checked = o.check_classes;
  r.save_plan_classes = static_cast<int>(save.plans.size());
  for (const auto& p : save.plans) r.save_plan_items += p.items.size();
  t0 = Clock::now();
  DCP_ASSIGN_OR_RETURN(planner::GlobalSavePlan plan,
                       planner::PlanSave(save.plans, save.holders, save_n));
  r.plan_seconds = Since(t0);

  // A cache hit costs the digest over the gathered hashes (save.cc).
  {
    t0 = Clock::now();
    volatile uint64_t digest = planner::DigestOfPlanHashes(save.hash_of_rank);
    (void)digest;
    r.cache_hit_plan_seconds = Since(t0);
  }
  r.hello_bytes_per_rank = checkpoint::kSaveHelloBytes * static_cast<uint64_t>(save_n);
  for (uint64_t s : save.encoded_sizes) {
    r.plans_bytes_per_rank += s;
    r.max_encoded_plan_bytes = std::max(r.max_encoded_plan_bytes, s);
  }
  r.exchange_bytes_per_rank = r.hello_bytes_per_rank + r.plans_bytes_per_rank;

  // Metadata.
  t0 = Clock::now();
  std::vector<uint64_t> written;
  DCP_ASSIGN_OR_RETURN(metadata::Metadata md,
                       BuildMetadata(plan, save_n, &written, &r.commit_gather_bytes));
  r.metadata_build_seconds = Since(t0);
  r.tensors = md.tensors.size();
  r.bytes_entries = md.bytes.size();
  r.chunks = md.TotalChunks();
  r.unique_bytes = md.TotalDataBytes();
  r.metadata_files = md.files.size();
  r.bytes_written.min = UINT64_MAX;
  for (uint64_t w : written) {
    r.bytes_written.min = std::min(r.bytes_written.min, w);
    r.bytes_written.max = std::max(r.bytes_written.max, w);
    r.bytes_written.sum += w;
    r.writers += w > 0;
  }
  r.bytes_written.mean = static_cast<double>(r.bytes_written.sum) / save_n;
  t0 = Clock::now();
  const std::string encoded = metadata::Encode(md);
  r.metadata_encode_seconds = Since(t0);
  r.metadata_bytes = encoded.size();
  t0 = Clock::now();
  DCP_ASSIGN_OR_RETURN(metadata::Metadata decoded, metadata::Decode(encoded));
  r.metadata_decode_seconds = Since(t0);
  if (decoded.TotalChunks() != r.chunks)
    return Internal("simulate: metadata round trip lost chunks");

  // Load: one representative per distinct destination plan.
  DCP_ASSIGN_OR_RETURN(SimClasses load, FindClasses(model, load_layout, o.check_classes));
  r.load_plan_classes = static_cast<int>(load.plans.size());
  std::vector<uint64_t> read_bytes(load.plans.size()), files(load.plans.size());
  std::unordered_set<uint64_t> needed;  // (tensor << 32 | stored chunk), over all classes
  for (size_t c = 0; c < load.plans.size(); ++c) {
    StateDict sd = DestinationFor(load.plans[c]);
    t0 = Clock::now();
    DCP_ASSIGN_OR_RETURN(planner::LocalLoadPlan lp,
                         planner::PlanLoad(sd, md, false, "<simulated>"));
    const double s = Since(t0);
    r.load_plan_seconds += s;
    r.load_plan_max_seconds = std::max(r.load_plan_max_seconds, s);
    r.load_read_items += lp.reads.size();
    // Without broadcast a rank reads each stored chunk it needs once, whole (checksums).
    std::unordered_set<uint64_t> mine;
    std::unordered_set<uint32_t> my_files;
    for (const planner::ReadItem& it : lp.reads) {
      const uint64_t key = uint64_t{it.tensor} << 32 | it.stored;
      if (!mine.insert(key).second) continue;
      const auto& sc = md.tensors[it.tensor].chunks[it.stored];
      read_bytes[c] += sc.byte_length;
      my_files.insert(sc.file);
      needed.insert(key);
    }
    for (const planner::BytesRead& b : lp.bytes) {
      read_bytes[c] += md.bytes[b.bytes].byte_length;
      my_files.insert(md.bytes[b.bytes].file);
    }
    files[c] = my_files.size();
  }
  r.read_bytes_no_broadcast = Distribute(read_bytes, load.holders, n);
  r.files_opened_no_broadcast = Distribute(files, load.holders, n);
  for (uint64_t key : needed)
    r.read_bytes_once += md.tensors[key >> 32].chunks[key & 0xffffffff].byte_length;
  for (const auto& b : md.bytes) r.read_bytes_once += b.byte_length;
  PlanBroadcasts(load.plans, load.holders, md, n, o.ranks_per_host, &r);
  return r;
}

std::string FormatReport(const SimulateReport& r) {
  const auto& o = r.options;
  std::string out;
  char line[640];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof(line), fmt, args...);
    out += line;
  };
  add("dcp simulate: %s, %d layers, width x%.2f%s; %d ranks; save %s, load %s\n",
      o.workload.model.c_str(), o.workload.layers, o.workload.width_scale,
      o.workload.optimizer ? " + optimizer" : "", o.ranks, r.save_layout.c_str(),
      r.load_layout.c_str());
  add("  checkpoint: %llu tensors, %llu stored chunks, %llu bytes entries, %s unique (model %s)\n",
      (unsigned long long)r.tensors, (unsigned long long)r.chunks,
      (unsigned long long)r.bytes_entries, HumanBytes(r.unique_bytes).c_str(),
      HumanBytes(r.model_bytes).c_str());
  add("save plan: %d distinct local plans (%llu items in all)%s; per rank: local plan %.3f s; "
      "global plan (PlanSave) %.3f s; [simulator: classes %.3f s]\n",
      r.save_plan_classes, (unsigned long long)r.save_plan_items,
      r.classes_checked ? ", checked rank by rank" : "", r.local_plan_seconds, r.plan_seconds,
      r.classes_seconds);
  add("  exchange per rank: hello %s + distinct plans %s = %s (largest plan %s); plan cache hit: "
      "%s, %.6f s\n",
      HumanBytes(r.hello_bytes_per_rank).c_str(), HumanBytes(r.plans_bytes_per_rank).c_str(),
      HumanBytes(r.exchange_bytes_per_rank).c_str(), HumanBytes(r.max_encoded_plan_bytes).c_str(),
      HumanBytes(r.hello_bytes_per_rank).c_str(), r.cache_hit_plan_seconds);
  add("  written per rank: max %s, mean %s, min %s; %llu writers; sum %s (= unique: %s); "
      "commit gather at rank 0 %s\n",
      HumanBytes(r.bytes_written.max).c_str(),
      HumanBytes(static_cast<uint64_t>(r.bytes_written.mean)).c_str(),
      HumanBytes(r.bytes_written.min).c_str(), (unsigned long long)r.writers,
      HumanBytes(r.bytes_written.sum).c_str(), r.bytes_written.sum == r.unique_bytes ? "yes" : "NO",
      HumanBytes(r.commit_gather_bytes).c_str());
  add("metadata: %s (%.1f B/chunk), %llu files; build %.3f s, encode %.3f s, decode %.3f s\n",
      HumanBytes(r.metadata_bytes).c_str(),
      r.chunks ? static_cast<double>(r.metadata_bytes) / r.chunks : 0.0,
      (unsigned long long)r.metadata_files, r.metadata_build_seconds, r.metadata_encode_seconds,
      r.metadata_decode_seconds);
  add("load plan: %d distinct destination plans, %llu read items; PlanLoad %.3f s in all, "
      "%.3f s for the slowest rank\n",
      r.load_plan_classes, (unsigned long long)r.load_read_items, r.load_plan_seconds,
      r.load_plan_max_seconds);
  add("  read per rank without broadcast: max %s, mean %s; job total %s vs %s if every needed "
      "chunk were read once; files opened per rank max %llu\n",
      HumanBytes(r.read_bytes_no_broadcast.max).c_str(),
      HumanBytes(static_cast<uint64_t>(r.read_bytes_no_broadcast.mean)).c_str(),
      HumanBytes(r.read_bytes_no_broadcast.sum).c_str(), HumanBytes(r.read_bytes_once).c_str(),
      (unsigned long long)r.files_opened_no_broadcast.max);
  if (r.broadcast_planned) {
    add("  with read-once broadcast: PlanBroadcast %.3f s; identities exchanged %s per rank; "
        "%llu groups, %llu shared shards, %llu shared stored chunks; job-wide %llu all-gathers "
        "and %llu broadcasts (%llu batches of < %s); collective calls per rank max %llu, mean "
        "%.1f, in max %llu groups (at most %.2f calls per group)\n",
        r.broadcast_plan_seconds, HumanBytes(r.identity_exchange_bytes_per_rank).c_str(),
        (unsigned long long)r.broadcast_groups, (unsigned long long)r.shared_shards,
        (unsigned long long)r.shared_chunks, (unsigned long long)r.gather_ops,
        (unsigned long long)r.broadcast_ops, (unsigned long long)r.broadcast_batches,
        HumanBytes(r.broadcast_batch_bytes).c_str(), (unsigned long long)r.collectives_per_rank.max,
        r.collectives_per_rank.mean, (unsigned long long)r.groups_per_rank.max,
        r.max_collectives_per_group);
    add("    read per rank: max %s, mean %s; job total %s\n",
        HumanBytes(r.read_bytes_broadcast.max).c_str(),
        HumanBytes(static_cast<uint64_t>(r.read_bytes_broadcast.mean)).c_str(),
        HumanBytes(r.read_bytes_broadcast.sum).c_str());
  }
  return out;
}

std::string ReportJson(const SimulateReport& r) {
  using nlohmann::json;
  const auto& o = r.options;
  auto dist = [](const Distribution& d) {
    return json{{"min", d.min}, {"max", d.max}, {"mean", d.mean}, {"sum", d.sum}};
  };
  json j;
  j["workload"] = o.workload.model;
  j["layers"] = o.workload.layers;
  j["width_scale"] = o.workload.width_scale;
  j["optimizer"] = o.workload.optimizer;
  j["ranks"] = o.ranks;
  j["save_layout"] = r.save_layout;
  j["load_layout"] = r.load_layout;
  j["tensors"] = r.tensors;
  j["chunks"] = r.chunks;
  j["bytes_entries"] = r.bytes_entries;
  j["unique_bytes"] = r.unique_bytes;
  j["model_bytes"] = r.model_bytes;
  j["save"] = {{"distinct_plans", r.save_plan_classes},
               {"plan_items", r.save_plan_items},
               {"classes_checked", r.classes_checked},
               {"local_plan_seconds", r.local_plan_seconds},
               {"classes_seconds", r.classes_seconds},
               {"plan_seconds", r.plan_seconds},
               {"bytes_written_per_rank", dist(r.bytes_written)},
               {"writers", r.writers},
               {"exchange_bytes_per_rank",
                {{"hello", r.hello_bytes_per_rank},
                 {"plans", r.plans_bytes_per_rank},
                 {"total", r.exchange_bytes_per_rank},
                 {"largest_plan", r.max_encoded_plan_bytes}}},
               {"plan_cache_hit",
                {{"exchange_bytes_per_rank", r.hello_bytes_per_rank},
                 {"plan_seconds", r.cache_hit_plan_seconds}}},
               {"commit_gather_bytes", r.commit_gather_bytes}};
  j["metadata"] = {{"bytes", r.metadata_bytes},
                   {"files", r.metadata_files},
                   {"bytes_per_chunk", r.chunks ? double(r.metadata_bytes) / r.chunks : 0.0},
                   {"build_seconds", r.metadata_build_seconds},
                   {"encode_seconds", r.metadata_encode_seconds},
                   {"decode_seconds", r.metadata_decode_seconds}};
  j["load"] = {{"distinct_plans", r.load_plan_classes},
               {"read_items", r.load_read_items},
               {"plan_seconds_total", r.load_plan_seconds},
               {"plan_seconds_max", r.load_plan_max_seconds},
               {"read_bytes_per_rank_no_broadcast", dist(r.read_bytes_no_broadcast)},
               {"files_opened_per_rank_no_broadcast", dist(r.files_opened_no_broadcast)},
               {"read_bytes_once", r.read_bytes_once},
               {"broadcast",
                r.broadcast_planned
                    ? json{{"plan_seconds", r.broadcast_plan_seconds},
                           {"identity_exchange_bytes_per_rank", r.identity_exchange_bytes_per_rank},
                           {"groups", r.broadcast_groups},
                           {"shared_shards", r.shared_shards},
                           {"shared_chunks", r.shared_chunks},
                           {"broadcasts", r.broadcast_ops},
                           {"batches", r.broadcast_batches},
                           {"batch_bytes", r.broadcast_batch_bytes},
                           {"gathers", r.gather_ops},
                           {"collectives_per_rank", dist(r.collectives_per_rank)},
                           {"groups_per_rank", dist(r.groups_per_rank)},
                           {"max_collectives_per_group", r.max_collectives_per_group},
                           {"read_bytes_per_rank", dist(r.read_bytes_broadcast)}}
                    : json(nullptr)}};
  return j.dump(2) + "\n";
}

}  // namespace dcp::simulate
