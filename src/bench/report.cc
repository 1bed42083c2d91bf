// What `dcp bench` prints: the table with its summary lines, and the JSON report whose schema
// docs/benchmarks.md documents.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/bench.h"
#include "bench/runner.h"
#include "dcp/format.h"

namespace dcp::bench {

using internal::Fixed;
using internal::GiBps;

namespace {

// CPU time of all ranks per GiB of the checkpoint, phase by phase, against its floor.
std::string CpuSummary(const BenchReport& r) {
  std::string out;
  char line[320];
  for (const PhaseReport& p : r.phases) {
    if (p.floor_cpu_seconds_per_gib <= 0) continue;
    if (out.empty()) {
      std::snprintf(line, sizeof(line),
                    "cpu (all ranks, user + system; floor: the references' I/O of the same bytes "
                    "+ one XXH3 pass %.3f s/GiB + a memcpy of staged or broadcast bytes):\n",
                    internal::Median(r.reference.hash_cpu_seconds_per_gib));
      out += line;
    }
    std::snprintf(line, sizeof(line), "  %-24s %7.3f s = %6.3f s/GiB, floor %6.3f s/GiB: %.2fx\n",
                  p.name.c_str(), p.median_cpu_seconds, p.cpu_seconds_per_gib,
                  p.floor_cpu_seconds_per_gib, p.cpu_ratio_to_floor);
    out += line;
  }
  return out;
}

// The incremental phase's lines: bytes written against bytes changed, time against the full
// save's, loads of both steps.
std::string IncrementalSummary(const BenchReport& r) {
  const PhaseReport *full = nullptr, *inc = nullptr, *load_full = nullptr, *load = nullptr;
  for (const PhaseReport& p : r.phases) {
    if (p.name == "incremental.full_save") full = &p;
    if (p.name == "incremental.save") inc = &p;
    if (p.name == "incremental.load_full") load_full = &p;
    if (p.name == "incremental.load") load = &p;
  }
  if (!full || !inc || !load_full || !load) return "";
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  char line[640];
  std::snprintf(line, sizeof(line),
                "incremental: %s of %s changed (%.2f%%); the save wrote %s = %.3fx the changed "
                "bytes, left %s in the base, and took %.4f s = 1/%.1f of the full save's "
                "%.4f s\n",
                HumanBytes(inc->bytes_changed).c_str(), HumanBytes(full->bytes_written).c_str(),
                100 * ratio(double(inc->bytes_changed), double(full->bytes_written)),
                HumanBytes(inc->bytes_written).c_str(),
                ratio(double(inc->bytes_written), double(inc->bytes_changed)),
                HumanBytes(inc->bytes_referenced).c_str(), inc->median_seconds,
                ratio(full->median_seconds, inc->median_seconds), full->median_seconds);
  std::string out = line;
  std::snprintf(line, sizeof(line),
                "incremental: load of the incremental step %.4f s = %.2fx the full step's "
                "%.4f s (%s cache)\n",
                load->median_seconds, ratio(load->median_seconds, load_full->median_seconds),
                load_full->median_seconds, r.options.cold ? "cold" : "warm");
  return out + line;
}

// The memory tier's lines: blocking against memcpy, the copies in memory, restore speed-up.
std::string TierSummary(const BenchReport& r) {
  const PhaseReport *save = nullptr, *memory = nullptr, *root = nullptr;
  for (const PhaseReport& p : r.phases) {
    if (p.name == "tier.save") save = &p;
    if (p.name == "tier.restore_memory") memory = &p;
    if (p.name == "tier.restore_root") root = &p;
  }
  if (!save || !memory || !root) return "";
  char line[640];
  std::string out;
  std::snprintf(
      line, sizeof(line),
      "tier: %d host(s), replicas %d; a save blocked the caller %.3f s = %.2fx a memcpy "
      "of the staged bytes (%.3f s), then replication took it to %.3f s; the last step "
      "occupies %s in the hosts' memory = %.2f copies of the checkpoint\n",
      r.tier_hosts, r.tier_replicas, save->median_blocked_seconds, save->blocked_ratio_to_memcpy,
      save->median_memcpy_seconds, save->median_seconds, HumanBytes(r.tier_bytes_in_memory).c_str(),
      r.unique_bytes ? static_cast<double>(r.tier_bytes_in_memory) / r.unique_bytes : 0.0);
  out += line;
  std::snprintf(line, sizeof(line),
                "tier: restore %s (new manager + load, %s layout): from memory %.3f s (%llu "
                "file(s) fetched), from the root %.3f s: %.2fx faster from memory\n",
                r.tier_host_lost ? "after losing the last host's memory" : "on one host",
                memory->layout.c_str(), memory->median_seconds,
                static_cast<unsigned long long>(memory->files_opened), root->median_seconds,
                memory->median_seconds > 0 ? root->median_seconds / memory->median_seconds : 0.0);
  out += line;
  return out;
}

// The load layouts' read patterns read raw, and the load phases against them.
std::string PatternSummary(const BenchReport& r) {
  const ReferenceReport& ref = r.reference;
  const double sequential = r.options.cold ? ref.read_cold_gibps : ref.read_warm_gibps;
  std::string out;
  char line[640];
  for (const ReferenceReport::Pattern& pattern : ref.patterns) {
    std::snprintf(line, sizeof(line),
                  "read pattern of the %s (%s: each stored chunk it needs read once, raw, by one "
                  "rank that needs it, in file order, a rank's adjacent chunks as one run): %s in "
                  "%llu runs, %s %.3f s, %.2f GiB/s = %.2fx the sequential read's rate",
                  pattern.kind.c_str(), pattern.layout.c_str(), HumanBytes(pattern.bytes).c_str(),
                  static_cast<unsigned long long>(pattern.runs), r.options.cold ? "cold" : "warm",
                  internal::Median(pattern.seconds), pattern.gibps,
                  sequential > 0 ? pattern.gibps / sequential : 0.0);
    out += line;
    for (const PhaseReport& p : r.phases) {
      if (p.kind != pattern.kind) continue;
      std::snprintf(line, sizeof(line), "; %s %.2fx its time", p.name.c_str(), p.ratio_to_pattern);
      out += line;
    }
    out += "\n";
  }
  return out;
}

}  // namespace

std::string FormatTable(const BenchReport& r) {
  const BenchOptions& o = r.options;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line),
                "dcp bench: %s, %d layers, width x%.2f%s: %llu tensors, %llu chunks, %s unique; "
                "%d rank(s) (%s); save %s, reshard to %s; cache %s; median of %d\n",
                o.workload.model.c_str(), o.workload.layers, o.workload.width_scale,
                o.workload.optimizer ? " + optimizer" : "",
                static_cast<unsigned long long>(r.tensors),
                static_cast<unsigned long long>(r.chunks), HumanBytes(r.unique_bytes).c_str(),
                r.ranks, r.backend.c_str(), r.save_layout.c_str(), r.load_layout.c_str(),
                o.cold ? "cold" : "warm", o.repeat);
  out += line;
  if (!r.throttle.empty()) out += "THROTTLED: " + r.throttle + "\n";
  const auto& ref = r.reference;
  std::snprintf(line, sizeof(line),
                "reference (same run, same directory, %d writer(s)/reader(s), %s): write %.2f "
                "GiB/s (%.2f-%.2f over %zu, before and after the saves), read cold %.2f GiB/s "
                "(resident before: %.3f), read warm %.2f GiB/s, memcpy %.2f GiB/s (1 thread)\n\n",
                r.ranks, HumanBytes(ref.bytes).c_str(), ref.write_gibps, ref.write_gibps_min,
                ref.write_gibps_max, ref.write_seconds.size(), ref.read_cold_gibps,
                ref.resident_fraction_before_cold_read, ref.read_warm_gibps,
                ref.memcpy_gibps_median);
  out += line;
  std::snprintf(line, sizeof(line), "%-22s %-8s %8s %7s %-9s %8s %6s %10s %10s %6s %6s %7s %8s\n",
                "phase", "layout", "seconds", "GiB/s", "reference", "ref s", "ratio", "written",
                "read", "files", "bcasts", "batches", "resident");
  out += line;
  for (const PhaseReport& p : r.phases) {
    const bool load = p.kind == "load" || p.kind == "reshard";
    std::snprintf(line, sizeof(line),
                  "%-22s %-8s %8.3f %7.3f %-9s %8.3f %6.2f %10s %10s %6llu %6s %7s %8s\n",
                  p.name.c_str(), p.layout.c_str(), p.median_seconds,
                  GiBps(r.unique_bytes, p.median_seconds), p.reference.c_str(), p.reference_seconds,
                  p.ratio_to_reference, load ? "-" : HumanBytes(p.bytes_written).c_str(),
                  load ? HumanBytes(p.bytes_read_storage).c_str() : "-",
                  static_cast<unsigned long long>(p.files_opened),
                  load ? std::to_string(p.broadcasts).c_str() : "-",
                  load ? std::to_string(p.batches).c_str() : "-",
                  load ? Fixed(p.resident_fraction_before, 3).c_str() : "-");
    out += line;
  }
  if (r.object_store) {
    // Requests per GiB of the checkpoint, per repetition: what the store is asked to do.
    const double gib = static_cast<double>(r.unique_bytes) / (1ull << 30) * o.repeat;
    std::snprintf(line, sizeof(line), "object storage requests per GiB: raw PUT %.0f, raw GET %.0f",
                  ref.write_requests / gib, ref.read_requests / gib);
    out += line;
    for (const PhaseReport& p : r.phases) {
      if (p.requests == 0) continue;
      std::snprintf(line, sizeof(line), ", %s %.0f", p.name.c_str(),
                    p.requests / (static_cast<double>(r.unique_bytes) / (1ull << 30) *
                                  static_cast<double>(p.seconds.size())));
      out += line;
    }
    out += "\n";
  }
  std::string memory;
  for (const PhaseReport& p : r.phases) {
    if (p.held_bytes == 0) continue;
    memory += (memory.empty() ? "" : ", ") + p.name + " +" + HumanBytes(p.peak_rss_extra_bytes) +
              " (" + Fixed(100.0 * p.peak_rss_extra_bytes / p.held_bytes, 1) + "%)";
  }
  if (!memory.empty()) {
    out +=
        "host memory, max over ranks: peak resident memory above the phase's start, and its "
        "share of the tensors a rank holds: " +
        memory + "\n";
  }
  for (const PhaseReport& p : r.phases) {
    if (p.kind != "async") continue;
    std::snprintf(line, sizeof(line),
                  "async: the caller was blocked %.3f s (staging %s, %.2f GiB/s), %.1f%% of the "
                  "%.3f s until the checkpoint was persisted\n",
                  p.median_blocked_seconds, HumanBytes(p.bytes_staged).c_str(),
                  GiBps(p.bytes_staged, p.median_blocked_seconds),
                  p.median_seconds > 0 ? 100 * p.median_blocked_seconds / p.median_seconds : 0.0,
                  p.median_seconds);
    out += line;
    std::snprintf(line, sizeof(line),
                  "async: blocked %.2fx a memcpy of the same bytes (%.3f s: each rank its "
                  "chunks, 1 thread, all at once); the first save %.3f s = %.2fx (%s)\n",
                  p.blocked_ratio_to_memcpy, p.median_memcpy_seconds,
                  p.blocked_seconds.empty() ? 0.0 : p.blocked_seconds[0],
                  p.first_blocked_ratio_to_memcpy,
                  o.async_prepare ? ("pool prepared ahead by AsyncSaver::Prepare in " +
                                     Fixed(p.prepare_seconds, 3) + " s")
                                        .c_str()
                                  : "no Prepare: the first save allocates the pool");
    out += line;
  }
  for (const PhaseReport& p : r.phases) {
    if (p.kind != "manager") continue;
    std::snprintf(line, sizeof(line),
                  "%s: a sequence of saves through the checkpoint manager (keep_last 2), median "
                  "of %zu after the first 3; %llu rank-file(s) overwrote a retired step's file\n",
                  p.name.c_str(), p.seconds.size(),
                  static_cast<unsigned long long>(p.files_recycled));
    out += line;
  }
  out += PatternSummary(r);
  out += TierSummary(r);
  out += IncrementalSummary(r);
  out += CpuSummary(r);
  out +=
      "\nGiB/s = unique bytes / seconds; ratio = seconds / reference seconds (1.00 = at the "
      "physical limit)\n";
  for (const std::string& n : r.notes) out += "note: " + n + "\n";
  return out;
}

std::string ReportJson(const BenchReport& r) {
  using nlohmann::json;
  const BenchOptions& o = r.options;
  json j;
  j["workload"] = o.workload.model;
  j["layers"] = o.workload.layers;
  j["width_scale"] = o.workload.width_scale;
  j["optimizer"] = o.workload.optimizer;
  j["ranks"] = r.ranks;
  j["backend"] = r.backend;
  j["save_layout"] = r.save_layout;
  j["load_layout"] = r.load_layout;
  j["cache"] = o.cold ? "cold" : "warm";
  j["repeat"] = o.repeat;
  j["load_max_broadcast_buffer_bytes"] = o.load_max_broadcast_buffer_mib << 20;
  j["unique_bytes"] = r.unique_bytes;
  j["tensors"] = r.tensors;
  j["chunks"] = r.chunks;
  j["bytes_entries"] = r.bytes_entries;
  j["storage_throttle"] = r.throttle.empty()
                              ? json(nullptr)
                              : json{{"gib_per_s", o.storage_gibps}, {"scope", r.throttle}};
  const auto& ref = r.reference;
  j["reference"] = {{"bytes", ref.bytes},
                    {"write_gib_per_s", ref.write_gibps},
                    {"write_gib_per_s_min", ref.write_gibps_min},
                    {"write_gib_per_s_max", ref.write_gibps_max},
                    {"read_cold_gib_per_s", ref.read_cold_gibps},
                    {"read_warm_gib_per_s", ref.read_warm_gibps},
                    {"memcpy_gib_per_s", ref.memcpy_gibps_median},
                    {"write_seconds", ref.write_seconds},
                    {"read_cold_seconds", ref.read_cold_seconds},
                    {"read_warm_seconds", ref.read_warm_seconds},
                    {"resident_fraction_before_cold_read", ref.resident_fraction_before_cold_read},
                    {"write_requests", ref.write_requests},
                    {"write_cpu_seconds", ref.write_cpu_seconds},
                    {"read_cold_cpu_seconds", ref.read_cold_cpu_seconds},
                    {"read_warm_cpu_seconds", ref.read_warm_cpu_seconds},
                    {"hash_cpu_seconds_per_gib", internal::Median(ref.hash_cpu_seconds_per_gib)},
                    {"read_cold_requests", ref.read_requests}};
  json patterns = json::object();
  for (const ReferenceReport::Pattern& p : ref.patterns) {
    patterns[p.kind] = {{"layout", p.layout},        {"seconds", internal::Median(p.seconds)},
                        {"seconds_each", p.seconds}, {"gib_per_s", p.gibps},
                        {"bytes", p.bytes},          {"runs", p.runs}};
  }
  j["reference"]["read_patterns"] = patterns;
  json phases = json::object();
  for (const PhaseReport& p : r.phases) {
    const double first_blocked = p.blocked_seconds.empty() ? 0.0 : p.blocked_seconds[0];
    phases[p.name] = {{"kind", p.kind},
                      {"layout", p.layout},
                      {"broadcast", p.broadcast},
                      {"seconds", p.median_seconds},
                      {"seconds_each", p.seconds},
                      {"gib_per_s", GiBps(r.unique_bytes, p.median_seconds)},
                      {"bytes_written", p.bytes_written},
                      {"bytes_read_storage", p.bytes_read_storage},
                      {"files_opened", p.files_opened},
                      {"broadcasts", p.broadcasts},
                      {"batches", p.batches},
                      {"shards_read_for_others", p.shards_read_for_others},
                      {"bytes_sent", p.bytes_sent},
                      {"plan_cache_hits", p.plan_cache_hits},
                      {"files_recycled", p.files_recycled},
                      {"blocked_seconds", p.median_blocked_seconds},
                      {"blocked_seconds_each", p.blocked_seconds},
                      {"bytes_staged", p.bytes_staged},
                      {"memcpy_seconds", p.median_memcpy_seconds},
                      {"memcpy_seconds_each", p.memcpy_seconds},
                      {"prepared", p.kind == "async" && o.async_prepare},
                      {"prepare_seconds", p.prepare_seconds},
                      {"first_blocked_seconds", first_blocked},
                      {"first_blocked_ratio_to_memcpy", p.first_blocked_ratio_to_memcpy},
                      {"blocked_ratio_to_memcpy", p.blocked_ratio_to_memcpy},
                      {"resident_fraction_before", p.resident_fraction_before},
                      {"reference", p.reference},
                      {"reference_seconds", p.reference_seconds},
                      {"ratio_to_reference", p.ratio_to_reference},
                      {"ratio_to_pattern", p.ratio_to_pattern},
                      {"requests", p.requests},
                      {"peak_rss_extra_bytes", p.peak_rss_extra_bytes},
                      {"held_bytes", p.held_bytes},
                      {"cpu_seconds", p.median_cpu_seconds},
                      {"cpu_seconds_each", p.cpu_seconds},
                      {"cpu_seconds_per_gib", p.cpu_seconds_per_gib},
                      {"floor_cpu_seconds_per_gib", p.floor_cpu_seconds_per_gib},
                      {"cpu_ratio_to_floor", p.cpu_ratio_to_floor}};
    if (p.name == "incremental.save") {
      phases[p.name]["bytes_changed"] = p.bytes_changed;
      phases[p.name]["bytes_referenced"] = p.bytes_referenced;
    }
  }
  j["phases"] = phases;
  j["notes"] = r.notes;
  if (r.tier_hosts > 0) {
    j["tier"] = {{"hosts", r.tier_hosts},
                 {"replicas", r.tier_replicas},
                 {"bytes_in_memory", r.tier_bytes_in_memory},
                 {"copies", r.unique_bytes ? static_cast<double>(r.tier_bytes_in_memory) /
                                                 static_cast<double>(r.unique_bytes)
                                           : 0.0},
                 {"host_lost", r.tier_host_lost}};
  }
  j["scratch_in_memory"] = r.scratch_in_memory;
  j["object_store"] = r.object_store;
  return j.dump(2) + "\n";
}

}  // namespace dcp::bench
