// save_torch_hf: torch's HuggingFaceStorageWriter layout written by the engine, on real files
// and several ranks (threads with their own communicators).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "convert/convert.h"
#include "dcp/checkpoint.h"
#include "hf/hf_checkpoint.h"
#include "hf/torch_hf_format.h"
#include "test_util.h"
#include "testfs/fault_file_system.h"

namespace dcp {
namespace {

using testing::RunRanks;
using testing::TempDir;

storage::FileSystem& Fs() { return storage::PosixFileSystem(); }

std::vector<float> Iota(size_t n, float from) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = from + static_cast<float>(i);
  return v;
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

// The whole model: "w" (6 x 4, rows split over the ranks), "b" (5, replicated), "step" (I64).
struct Model {
  std::vector<float> w = Iota(24, 0), b = Iota(5, 100);
  std::vector<int64_t> step = {7};
};

// Rank r of `world` holds rows [6r/world, 6(r+1)/world) of w, and all of b and step.
void AddShards(StateDict& sd, Model& m, int rank, int world) {
  const int64_t lo = 6 * rank / world, hi = 6 * (rank + 1) / world;
  sd.add("w", TensorView{m.w.data() + lo * 4, DType::kF32, Shape{hi - lo, 4}},
         Chunk{Shape{6, 4}, Shape{lo, 0}});
  sd.add("b", TensorView{m.b.data(), DType::kF32, Shape{5}});
  sd.add("step", TensorView{m.step.data(), DType::kI64, Shape{1}});
}

// Loads the model back from `dir` (any HuggingFace source) and compares.
void ExpectLoads(const std::string& dir, const Model& want) {
  Model got;
  std::fill(got.w.begin(), got.w.end(), -1.f);
  std::fill(got.b.begin(), got.b.end(), -1.f);
  got.step = {0};
  StateDict sd;
  sd.add("w", TensorView{got.w.data(), DType::kF32, Shape{6, 4}});
  sd.add("b", TensorView{got.b.data(), DType::kF32, Shape{5}});
  sd.add("step", TensorView{got.step.data(), DType::kI64, Shape{1}});
  auto r = checkpoint::Load(sd, dir, LoadOptions{}, Fs());
  ASSERT_TRUE(r.ok()) << dir << ": " << r.status().ToString();
  EXPECT_EQ(got.w, want.w);
  EXPECT_EQ(got.b, want.b);
  EXPECT_EQ(got.step, want.step);
}

// Saves `m` from `world` ranks (AddShards), each rank's options and state dict adjusted by
// `adjust`, rank 1 on `rank1_fs` when given. Every rank's status; rank 0's result in `result0`.
std::vector<Status> SaveOnRanks(
    Model& m, int world, const std::string& dir,
    const std::function<void(int rank, TorchHfSaveOptions&, StateDict&)>& adjust = {},
    storage::FileSystem* rank1_fs = nullptr, TorchHfSaveResult* result0 = nullptr) {
  std::vector<Status> st(world);
  RunRanks(world, [&](const std::shared_ptr<Comm>& c) {
    StateDict sd;
    AddShards(sd, m, c->rank(), world);
    TorchHfSaveOptions o;
    o.comm = c;
    if (adjust) adjust(c->rank(), o, sd);
    auto r = convert::SaveTorchHf(sd, dir, o, c->rank() == 1 && rank1_fs ? *rank1_fs : Fs());
    st[c->rank()] = r.status();
    if (r.ok() && c->rank() == 0 && result0) *result0 = *r;
  });
  return st;
}

// The mapping most tests use, consolidated into `out`.
auto TwoFilesInto(const std::string& out) {
  return [out](int, TorchHfSaveOptions& o, StateDict&) {
    o.fqn_to_index = {{"w", 1}, {"step", 2}, {"b", 2}};
    o.consolidate_into = out;
  };
}

TEST(TorchHfSaveTest, ShardsOfEveryRankThenConsolidatedFiles) {
  TempDir tmp;
  const std::string sharded = tmp.Sub("out/sharded");
  std::filesystem::create_directories(sharded);
  // A shard of an earlier save on more ranks, and an index there: both must go.
  std::ofstream(storage::JoinPath(sharded, "shard-00003-model-00001-of-00002.safetensors")) << "x";
  std::ofstream(storage::JoinPath(sharded, "model.safetensors.index.json")) << "{}";
  Model model;
  TorchHfSaveResult res;
  for (const Status& s :
       SaveOnRanks(model, 2, sharded, TwoFilesInto(tmp.Sub("out")), nullptr, &res)) {
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // b and step are written once, not by both ranks.
  EXPECT_EQ(res.total_bytes, 24 * 4 + 5 * 4 + 8u);
  // w's rows from both ranks; b and step written once, by rank 1, as torch's dedup assigns them
  // (each replicated chunk, in order, to the holder with the fewest bytes so far: rank 0 holds
  // 48 bytes of w then); the earlier save's shard and index are gone.
  EXPECT_EQ(Names(sharded),
            (std::vector<std::string>{"shard-00001-model-00001-of-00002.safetensors",
                                      "shard-00002-model-00001-of-00002.safetensors",
                                      "shard-00002-model-00002-of-00002.safetensors"}));
  EXPECT_EQ(Names(tmp.Sub("out")),
            (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors",
                                      "model.safetensors.index.json", "sharded"}));
  // The consolidated files: whole tensors in the mapping's order, torch's header.
  std::ifstream in(tmp.Sub("out/model-00002-of-00002.safetensors"), std::ios::binary);
  std::string bytes(std::istreambuf_iterator<char>(in), {});
  EXPECT_EQ(bytes.substr(0, 8 + 2), hf::TorchConsolidatedHeader({{"step", DType::kI64, Shape{1}, 8},
                                                                 {"b", DType::kF32, Shape{5}, 20}})
                                        .substr(0, 10));
  EXPECT_EQ(bytes.size(), hf::TorchConsolidatedHeader({{"step", DType::kI64, Shape{1}, 8},
                                                       {"b", DType::kF32, Shape{5}, 20}})
                                  .size() +
                              28);
  std::ifstream idx(tmp.Sub("out/model.safetensors.index.json"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(idx), {}),
            hf::TorchIndexJson(124, {{"w", "model-00001-of-00002.safetensors"},
                                     {"step", "model-00002-of-00002.safetensors"},
                                     {"b", "model-00002-of-00002.safetensors"}}));
  ExpectLoads(sharded, model);
  ExpectLoads(tmp.Sub("out"), model);
}

TEST(TorchHfSaveTest, AFullStateDictOnSeveralRanksIsConsolidated) {
  TempDir tmp;
  Model model;
  auto full_state_dict = [](int, TorchHfSaveOptions& o, StateDict&) { o.save_distributed = false; };
  for (const Status& s : SaveOnRanks(model, 3, tmp.path(), full_state_dict)) {
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_EQ(Names(tmp.path()), (std::vector<std::string>{"model-00001-of-00001.safetensors",
                                                         "model.safetensors.index.json"}));
  ExpectLoads(tmp.path(), model);
}

TEST(TorchHfSaveTest, OneProcessOfAFullStateDictWritesTorchsIndex) {
  TempDir tmp;
  Model model;
  StateDict sd;
  AddShards(sd, model, 0, 1);
  TorchHfSaveOptions o;
  o.save_distributed = false;
  auto r = convert::SaveTorchHf(sd, tmp.path(), o, Fs());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::ifstream idx(tmp.Sub("model.safetensors.index.json"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(idx), {}),
            hf::TorchIndexJson(124, {{"w", "model-00001-of-00001.safetensors"},
                                     {"b", "model-00001-of-00001.safetensors"},
                                     {"step", "model-00001-of-00001.safetensors"}}));
  auto src = hf::OpenSource(Fs(), tmp.path());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  // safetensors' order in the file: I64 before F32, then by name.
  ASSERT_EQ(src->files[0].header.tensors.size(), 3u);
  EXPECT_EQ(src->files[0].header.tensors[0].name, "step");
  EXPECT_EQ(src->files[0].header.tensors[1].name, "b");
  EXPECT_EQ(src->files[0].header.metadata.at(std::string(hf::kShardingInfoKey)),
            R"({"w": {"saved_offsets": [0, 0]}, "b": {"saved_offsets": [0]}, )"
            R"("step": {"saved_offsets": [0]}})");
  ExpectLoads(tmp.path(), model);
}

TEST(TorchHfSaveTest, RefusesWhatSafetensorsCannotHoldOnEveryRank) {
  TempDir tmp;
  Model model;
  for (const Status& s : SaveOnRanks(model, 2, tmp.path(), [](int rank, auto&, StateDict&sd) {
         if (rank == 1) sd.add_bytes("loader_state", "pos=7");
       })) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("'loader_state' is not a tensor"), std::string::npos) << s.message();
  }
  StateDict sd;
  AddShards(sd, model, 0, 1);
  TorchHfSaveOptions o;
  o.fqn_to_index = {{"w", 1}, {"b", 1}};
  auto r = convert::SaveTorchHf(sd, tmp.path(), o, Fs());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gives no file for tensor 'step'"), std::string::npos)
      << r.status().message();
  EXPECT_TRUE(Names(tmp.path()).empty());
}

// torch's shard files converted to a dcp checkpoint (`dcp convert`): each chunk where its
// sharding info places it.
TEST(TorchHfSaveTest, ShardsConvertToADcpCheckpoint) {
  TempDir tmp;
  Model model;
  for (const Status& s : SaveOnRanks(model, 2, tmp.Sub("hf"))) ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<Status> st(2);
  for (int world : {1, 2}) {
    const std::string dst = tmp.Sub("dcp" + std::to_string(world));
    RunRanks(world, [&](const std::shared_ptr<Comm>& c) {
      st[c->rank()] = convert::HfToDcp(tmp.Sub("hf"), dst, {.comm = c}, Fs()).status();
    });
    for (int r = 0; r < world; ++r) ASSERT_TRUE(st[r].ok()) << st[r].ToString();
    ExpectLoads(dst, model);
  }
}

// Consolidated into the shards' own directory (torch's writer given a checkpoint_id with
// enable_consolidation); a dcp checkpoint and files of an earlier save there go, since readers
// would take them first or mix them in.
TEST(TorchHfSaveTest, ConsolidatedBesideItsShardsOverAnEarlierCheckpoint) {
  TempDir tmp;
  Model old_model;
  std::fill(old_model.w.begin(), old_model.w.end(), 9.f);
  {
    StateDict sd;
    AddShards(sd, old_model, 0, 1);
    ASSERT_TRUE(checkpoint::Save(sd, tmp.path(), SaveOptions{}, Fs()).ok());
  }
  std::ofstream(tmp.Sub("model-00001-of-00003.safetensors")) << "old";
  std::ofstream(tmp.Sub("model.safetensors")) << "old";  // would outrank torch's names
  Model model;
  for (const Status& s : SaveOnRanks(model, 2, tmp.path(), TwoFilesInto(tmp.path()))) {
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  const std::vector<std::string> names = Names(tmp.path());
  for (const std::string& n : names) {
    EXPECT_TRUE(n.rfind("data-", 0) == 0 || hf::IsTorchHfFileName(n) ||
                n == "model.safetensors.index.json")
        << n;
  }
  EXPECT_EQ(std::count_if(names.begin(), names.end(),
                          [](const std::string& n) { return n.rfind("shard-", 0) == 0; }),
            3);
  EXPECT_TRUE(std::count(names.begin(), names.end(), "model-00002-of-00002.safetensors"));
  // The earlier save's consolidated file is gone, not only outnumbered (its model.safetensors
  // fails the name check above).
  EXPECT_FALSE(std::count(names.begin(), names.end(), "model-00001-of-00003.safetensors"));
  ExpectLoads(tmp.path(), model);
}

// Ranks handed different mappings follow rank 0's (as torch does), never hang.
TEST(TorchHfSaveTest, RankZerosMappingHolds) {
  TempDir tmp;
  Model model;
  auto rank1_differs = [&](int rank, TorchHfSaveOptions& o, StateDict& sd) {
    TwoFilesInto(tmp.Sub("out"))(rank, o, sd);
    if (rank == 1) o.fqn_to_index = {{"w", 0}};
  };
  for (const Status& s : SaveOnRanks(model, 2, tmp.Sub("out/sharded"), rank1_differs)) {
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::ifstream idx(tmp.Sub("out/model.safetensors.index.json"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(idx), {}),
            hf::TorchIndexJson(124, {{"w", "model-00001-of-00002.safetensors"},
                                     {"step", "model-00002-of-00002.safetensors"},
                                     {"b", "model-00002-of-00002.safetensors"}}));
  ExpectLoads(tmp.Sub("out"), model);
}

// A save failing on one rank at any of its file operations fails on every rank, leaves no part
// file, and leaves directories that load the earlier save whole, the new one whole, or fail:
// never a mix of the two.
TEST(TorchHfSaveTest, ASaveFailingOnOneRankAnywhereNeverLeavesAMix) {
  TempDir tmp;
  Model a, b;
  for (float& x : b.w) x += 1000;
  for (float& x : b.b) x += 1000;
  b.step = {8};
  auto save = [&](Model& m, storage::FileSystem& fs1) {
    const std::vector<Status> st =
        SaveOnRanks(m, 2, tmp.Sub("out/sharded"), TwoFilesInto(tmp.Sub("out")), &fs1);
    EXPECT_EQ(st[0].ok(), st[1].ok()) << st[0].ToString() << " / " << st[1].ToString();
    return st[0];
  };
  testfs::FaultFileSystem counting(Fs());
  ASSERT_TRUE(save(b, counting).ok());
  const int64_t ops = counting.ops();
  ASSERT_GT(ops, 4);
  for (int64_t n = 0; n < ops; ++n) {
    SCOPED_TRACE("rank 1 failing from operation " + std::to_string(n) + " of " +
                 std::to_string(ops));
    std::filesystem::remove_all(tmp.Sub("out"));
    ASSERT_TRUE(save(a, Fs()).ok());
    testfs::FaultFileSystem fs(Fs());
    fs.FailAt(n);
    const Status st = save(b, fs);
    for (const std::string& dir : {tmp.Sub("out"), tmp.Sub("out/sharded")}) {
      if (st.ok()) {
        for (const std::string& n : Names(dir)) EXPECT_EQ(n.find(".part"), std::string::npos) << n;
      }
      Model got;
      StateDict sd;
      sd.add("w", TensorView{got.w.data(), DType::kF32, Shape{6, 4}});
      sd.add("b", TensorView{got.b.data(), DType::kF32, Shape{5}});
      sd.add("step", TensorView{got.step.data(), DType::kI64, Shape{1}});
      auto r = checkpoint::Load(sd, dir, LoadOptions{}, Fs());
      if (!r.ok()) {
        EXPECT_FALSE(st.ok()) << dir << ": " << r.status().ToString();
        continue;
      }
      const bool is_a = got.step == a.step;
      const Model& want = is_a ? a : b;
      EXPECT_EQ(got.w, want.w) << dir;
      EXPECT_EQ(got.b, want.b) << dir;
      if (st.ok()) EXPECT_FALSE(is_a) << dir;
    }
    // The next save goes through whatever the failed one left, and leaves no part behind.
    ASSERT_TRUE(save(b, Fs()).ok());
    for (const std::string& dir : {tmp.Sub("out"), tmp.Sub("out/sharded")}) {
      for (const std::string& n : Names(dir)) EXPECT_EQ(n.find(".part"), std::string::npos) << n;
      ExpectLoads(dir, b);
    }
  }
}

}  // namespace
}  // namespace dcp
