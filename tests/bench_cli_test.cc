// `dcp bench` and `dcp simulate` end to end: the documented JSON keys are there and the
// invariants hold (docs/benchmarks.md). No timing assertions.
#include <gtest/gtest.h>
#include <sys/vfs.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace dcp {
namespace {

using nlohmann::json;

json RunJson(const std::string& args, const std::string& json_path) {
  std::string out;
  const int rc = testing::RunCommand(std::string(DCP_CLI_PATH) + " " + args, &out);
  EXPECT_EQ(rc, 0) << out;
  std::ifstream in(json_path);
  EXPECT_TRUE(in.good()) << "no " << json_path << "; output:\n" << out;
  return in.good() ? json::parse(in) : json();
}

void ExpectKeys(const json& j, std::initializer_list<const char*> keys, const std::string& where) {
  for (const char* k : keys) EXPECT_TRUE(j.contains(k)) << where << " lacks \"" << k << "\"";
}

TEST(BenchCliTest, TinyBenchWritesTheDocumentedKeys) {
  testing::TempDir tmp;
  const std::string out = tmp.Sub("bench.json");
  json j = RunJson("bench --layers 1 --width-scale 0.05 --pause 0 --repeat 2 --dir " +
                       tmp.Sub("scratch") + " --json " + out,
                   out);
  ASSERT_TRUE(j.is_object());
  ExpectKeys(j,
             {"workload", "ranks", "unique_bytes", "tensors", "chunks", "phases", "reference",
              "storage_throttle", "cache", "repeat"},
             "report");
  EXPECT_EQ(j["workload"], "qwen3-30b-a3b");
  EXPECT_EQ(j["ranks"], 1);
  EXPECT_GT(j["unique_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["tensors"], 3 + 393);
  EXPECT_TRUE(j["storage_throttle"].is_null());
  ExpectKeys(j["reference"],
             {"write_gib_per_s", "read_cold_gib_per_s", "read_warm_gib_per_s", "memcpy_gib_per_s"},
             "reference");
  for (const char* name : {"save", "load.broadcast", "load.no_broadcast", "load.default",
                           "reshard.broadcast", "reshard.no_broadcast", "reshard.default"}) {
    ASSERT_TRUE(j["phases"].contains(name)) << name;
    const json& p = j["phases"][name];
    ExpectKeys(p,
               {"seconds", "gib_per_s", "bytes_written", "bytes_read_storage", "files_opened",
                "broadcasts", "batches", "reference_seconds", "ratio_to_reference"},
               name);
    EXPECT_EQ(p["seconds_each"].size(), 2u) << name;
  }
  // One rank writes everything once and a same-layout load reads it all back.
  EXPECT_EQ(j["phases"]["save"]["bytes_written"], j["unique_bytes"]);
  // Host memory: the tensors a rank holds are the state (one rank: all of it), and the rise
  // of resident memory during a phase is measured, not assumed (a real save needs something).
  EXPECT_GT(j["phases"]["save"]["held_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(j["phases"]["save"]["peak_rss_extra_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["load_max_broadcast_buffer_bytes"], uint64_t{256} << 20);
  EXPECT_EQ(j["phases"]["load.no_broadcast"]["bytes_read_storage"], j["unique_bytes"]);
  // The load layouts' read patterns: every stored chunk once (the unique bytes but for the
  // few bytes of the non-tensor entries), measured every repetition, the loads timed against
  // them.
  const uint64_t unique = j["unique_bytes"].get<uint64_t>();
  for (const char* kind : {"load", "reshard"}) {
    ASSERT_TRUE(j["reference"]["read_patterns"].contains(kind)) << kind;
    const json& pattern = j["reference"]["read_patterns"][kind];
    ExpectKeys(pattern, {"layout", "seconds", "seconds_each", "gib_per_s", "bytes", "runs"}, kind);
    EXPECT_LE(pattern["bytes"].get<uint64_t>(), unique) << kind;
    EXPECT_GT(pattern["bytes"].get<uint64_t>(), unique - unique / 100) << kind;
    EXPECT_EQ(pattern["seconds_each"].size(), 2u) << kind;
    EXPECT_GT(j["phases"][std::string(kind) + ".broadcast"]["ratio_to_pattern"].get<double>(), 0);
  }
  EXPECT_EQ(j["reference"]["read_patterns"]["reshard"]["layout"], j["load_layout"]);
  EXPECT_EQ(j["phases"]["save"]["ratio_to_pattern"], 0);
  // Cold means cold: the kernel held none of the checkpoint right before the load -- unless
  // the scratch directory is in memory (tmpfs), which the report must then say.
  struct statfs fs_info;
  ASSERT_EQ(::statfs(tmp.path().c_str(), &fs_info), 0);
  const bool in_memory = fs_info.f_type == 0x01021994 /* tmpfs */ ||
                         fs_info.f_type == static_cast<decltype(fs_info.f_type)>(0x858458f6);
  EXPECT_EQ(j["scratch_in_memory"], in_memory);
  if (in_memory) {
    EXPECT_NE(j["notes"].dump().find("in-memory file system"), std::string::npos) << j["notes"];
  } else {
    EXPECT_LT(j["phases"]["load.no_broadcast"]["resident_fraction_before"].get<double>(), 0.05);
  }
  // The scratch directory is left empty.
  EXPECT_TRUE(testing::ListFiles(tmp.Sub("scratch")).empty());
}

TEST(BenchCliTest, ThrottledWarmLoadOnly) {
  testing::TempDir tmp;
  const std::string out = tmp.Sub("bench.json");
  json j = RunJson(
      "bench --layers 1 --width-scale 0.05 --pause 0 --phases load --cache warm "
      "--storage-gibps 4 --no-verify --dir " +
          tmp.Sub("scratch") + " --json " + out,
      out);
  ASSERT_TRUE(j.is_object());
  ASSERT_TRUE(j["storage_throttle"].is_object());
  EXPECT_EQ(j["storage_throttle"]["gib_per_s"], 4.0);
  EXPECT_EQ(j["cache"], "warm");
  EXPECT_FALSE(j["phases"].contains("save"));
  EXPECT_FALSE(j["phases"].contains("reshard.broadcast"));
  EXPECT_EQ(j["phases"]["load.broadcast"]["reference"], "read_warm");
  // Only the load phases run have a pattern.
  EXPECT_TRUE(j["reference"]["read_patterns"].contains("load"));
  EXPECT_FALSE(j["reference"]["read_patterns"].contains("reshard"));
}

// The manager phase: two sequences of saves with retention; only the recycling one overwrites
// retired files (one per timed save of this one rank), and both write the whole state each time.
TEST(BenchCliTest, ManagerSequencesWithAndWithoutRecycling) {
  testing::TempDir tmp;
  const std::string out = tmp.Sub("bench.json");
  json j = RunJson(
      "bench --layers 1 --width-scale 0.05 --pause 0 --repeat 2 --phases manager "
      "--dir " +
          tmp.Sub("scratch") + " --json " + out,
      out);
  ASSERT_TRUE(j.is_object());
  for (const char* name : {"manager.recycle", "manager.no_recycle"}) {
    ASSERT_TRUE(j["phases"].contains(name)) << name;
    const json& p = j["phases"][name];
    EXPECT_EQ(p["kind"], "manager") << name;
    EXPECT_EQ(p["reference"], "write") << name;
    EXPECT_EQ(p["seconds_each"].size(), 2u) << name;
    EXPECT_EQ(p["bytes_written"], j["unique_bytes"]) << name;
  }
  EXPECT_EQ(j["phases"]["manager.recycle"]["files_recycled"], 2);
  EXPECT_EQ(j["phases"]["manager.no_recycle"]["files_recycled"], 0);
  EXPECT_FALSE(j["phases"].contains("save"));
  EXPECT_TRUE(testing::ListFiles(tmp.Sub("scratch")).empty());
}

TEST(BenchCliTest, BadPhaseFailsWithOneLine) {
  std::string out;
  EXPECT_NE(testing::RunCommand(std::string(DCP_CLI_PATH) + " bench --phases save,lod", &out), 0);
  EXPECT_NE(out.find("unknown phase 'lod'"), std::string::npos) << out;
}

TEST(SimulateCliTest, SixtyFourRanksKeysAndDedupInvariants) {
  testing::TempDir tmp;
  const std::string out = tmp.Sub("sim.json");
  json j = RunJson(
      "simulate --ranks 64 --layers 2 --save-layout tp2,ep4,dp8 --load-layout "
      "tp4,dp16 --check-classes --json " +
          out,
      out);
  ASSERT_TRUE(j.is_object());
  ExpectKeys(j,
             {"workload", "ranks", "unique_bytes", "tensors", "chunks", "save", "metadata", "load"},
             "report");
  EXPECT_EQ(j["ranks"], 64);
  const json& save = j["save"];
  ExpectKeys(save,
             {"distinct_plans", "plan_seconds", "bytes_written_per_rank", "exchange_bytes_per_rank",
              "plan_cache_hit"},
             "save");
  // tp2 x ep4 distinct plans; dp replicas share theirs (checked rank by rank).
  EXPECT_EQ(save["distinct_plans"], 8);
  EXPECT_EQ(save["classes_checked"], true);
  // Dedup: every unique byte written exactly once, nothing else.
  EXPECT_EQ(save["bytes_written_per_rank"]["sum"], j["unique_bytes"]);
  EXPECT_GE(j["unique_bytes"].get<uint64_t>(), j["model_bytes"].get<uint64_t>());
  const json& ex = save["exchange_bytes_per_rank"];
  // The figures themselves are checked against a real save's (MultiRankThreads,
  // SimulatePredictsTheExchangeOfARealSave); here, how they relate.
  EXPECT_EQ(ex["total"].get<uint64_t>(), ex["hello"].get<uint64_t>() + ex["plans"].get<uint64_t>());
  EXPECT_EQ(save["plan_cache_hit"]["exchange_bytes_per_rank"], ex["hello"]);
  EXPECT_EQ(ex["hello"].get<uint64_t>() % 64, 0u);  // the same hello from every rank
  ExpectKeys(j["metadata"], {"bytes", "encode_seconds", "decode_seconds"}, "metadata");
  EXPECT_GT(j["metadata"]["bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["load"]["distinct_plans"], 4);
  // Every needed stored chunk is read at least once; without broadcast, often more.
  EXPECT_GE(j["load"]["read_bytes_per_rank_no_broadcast"]["sum"].get<uint64_t>(),
            j["load"]["read_bytes_once"].get<uint64_t>());
  EXPECT_EQ(j["load"]["read_bytes_once"], j["unique_bytes"]);
  // Read-once broadcast: every stored tensor byte read from storage exactly once.
  const json& b = j["load"]["broadcast"];
  ASSERT_TRUE(b.is_object());
  ExpectKeys(b,
             {"groups", "shared_shards", "broadcasts", "batches", "gathers", "collectives_per_rank",
              "groups_per_rank", "max_collectives_per_group", "read_bytes_per_rank"},
             "broadcast");
  // Shared shards go by a few all-gather rounds per group (4 by default); stored chunks
  // shared by a reshard add their broadcasts.
  EXPECT_GT(b["gathers"].get<uint64_t>(), 0u);
  EXPECT_LE(b["gathers"].get<uint64_t>(), 4 * b["groups"].get<uint64_t>());
  EXPECT_LE(b["collectives_per_rank"]["max"].get<uint64_t>(),
            4 * b["groups_per_rank"]["max"].get<uint64_t>() + b["broadcasts"].get<uint64_t>());
  // At least the 4 tp shards' 16 replicas and the world-replicated norms; stored chunks
  // read once for several consumers add their own groups.
  EXPECT_GE(b["groups"].get<int>(), 5);
  EXPECT_EQ(b["read_bytes_per_rank"]["sum"], j["model_bytes"]);
}

TEST(SimulateCliTest, AOneRankCheckpointLoadedBy64ReplicasIsReadBalanced) {
  // Issue 20 item 3: written by one rank (each tensor one stored chunk with 1 MiB checksum
  // blocks), loaded by 64 replicas on 8 hosts: slabs cut inside the chunks at blocks keep every
  // reader near the mean, each stored byte read once, in 4 all-gathers per rank.
  std::string out;
  ASSERT_EQ(testing::RunCommand(std::string(DCP_CLI_PATH) +
                                    " simulate --layers 2 --width-scale 0.25 --ranks 64 "
                                    "--save-layout dp1 --load-layout dp64 --json -",
                                &out),
            0)
      << out;
  const json j = json::parse(out.substr(out.find('{')));
  const json& b = j["load"]["broadcast"];
  const json& read = b["read_bytes_per_rank"];
  EXPECT_LE(read["max"].get<double>(), 1.2 * read["mean"].get<double>());
  EXPECT_LE(read["sum"].get<uint64_t>(), j["unique_bytes"].get<uint64_t>());
  EXPECT_GT(read["sum"].get<uint64_t>(), j["unique_bytes"].get<uint64_t>() - 4096);
  EXPECT_EQ(b["shared_chunks"], 0);
  EXPECT_EQ(b["collectives_per_rank"]["max"], 4);
}

TEST(SimulateCliTest, LayoutMustMatchRanks) {
  std::string out;
  EXPECT_NE(testing::RunCommand(
                std::string(DCP_CLI_PATH) + " simulate --ranks 64 --save-layout tp8,dp4", &out),
            0);
  EXPECT_NE(out.find("tp8,dp4 has 32 ranks"), std::string::npos) << out;
}

}  // namespace
}  // namespace dcp
