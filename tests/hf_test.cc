// HuggingFace safetensors in and out: conversions both ways, direct loads, and the errors a
// malformed source gives through the public entry points.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "checkpoint/metadata_io.h"
#include "checkpoint/names.h"
#include "checkpoint/verify.h"
#include "convert/convert.h"
#include "dcp/checkpoint.h"
#include "hf/hf_checkpoint.h"
#include "hf/safetensors_header.h"
#include "storage/data_files.h"
#include "test_util.h"
#include "testfs/fault_file_system.h"
#include "testfs/forwarding_file_system.h"

namespace dcp {
namespace {

using testing::RunRanks;
using testing::TempDir;

storage::FileSystem& Fs() { return storage::PosixFileSystem(); }

struct T {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<std::byte> data;
};

T Random(std::string name, DType dtype, Shape shape, uint32_t seed) {
  T t{std::move(name), dtype, shape, {}};
  t.data.resize(*DTypeBytes(dtype, *shape.NumElements()));
  std::mt19937 rng(seed);
  for (auto& b : t.data) b = std::byte(rng());
  return t;
}

void WriteHf(const std::string& path, const std::vector<T>& tensors) {
  std::vector<storage::TensorToWrite> items;
  for (const T& t : tensors) items.push_back({t.name, t.dtype, t.shape, t.data});
  auto w = storage::WriteSafetensorsFile(Fs(), path, items);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every tensor of an HF source by name: dtype, shape and bytes, read through the parser.
std::map<std::string, T> ReadHf(const std::string& path) {
  std::map<std::string, T> out;
  auto src = hf::OpenSource(Fs(), path);
  EXPECT_TRUE(src.ok()) << src.status().ToString();
  if (!src.ok()) return out;
  for (const hf::ShardFile& f : src->files) {
    std::string bytes = Slurp(storage::JoinPath(src->data_dir, f.name));
    for (const hf::HeaderTensor& h : f.header.tensors) {
      T t{h.name, h.dtype, h.shape, {}};
      const char* p = bytes.data() + f.header.data_start() + h.begin;
      t.data.assign(reinterpret_cast<const std::byte*>(p),
                    reinterpret_cast<const std::byte*>(p) + (h.end - h.begin));
      out[h.name] = std::move(t);
    }
  }
  return out;
}

void ExpectSame(const std::vector<T>& want, const std::map<std::string, T>& got) {
  ASSERT_EQ(got.size(), want.size());
  for (const T& w : want) {
    auto it = got.find(w.name);
    ASSERT_NE(it, got.end()) << w.name;
    EXPECT_EQ(it->second.dtype, w.dtype) << w.name;
    EXPECT_EQ(it->second.shape, w.shape) << w.name;
    EXPECT_TRUE(it->second.data == w.data) << w.name << ": bytes differ";
  }
}

// One tensor of every dtype (8 x 6 elements: whole bytes for F4 and F6 too), a scalar and an
// empty one.
std::vector<T> EveryDType() {
  std::vector<T> out;
  for (int i = 0; i < kNumDTypes; ++i) {
    DType d = static_cast<DType>(i);
    out.push_back(Random("model.layers." + std::to_string(i) + "." + std::string(DTypeName(d)), d,
                         Shape{8, 6}, 100 + i));
  }
  out.push_back(Random("model.scalar", DType::kF32, Shape{}, 7));
  out.push_back(Random("model.empty", DType::kBF16, Shape{0, 4}, 8));
  return out;
}

DcpToHfOptions HfOptions(uint64_t max_shard = 5'000'000'000, uint64_t buffer = 256 << 20) {
  DcpToHfOptions o;
  o.max_shard_bytes = max_shard;
  o.buffer_bytes = buffer;
  return o;
}

// The real file system, but creating the first dcp data file first truncates `victim` (as
// another job rewriting the model while `dcp convert` reads it).
class ShrinkingSource final : public testfs::ForwardingFileSystem {
 public:
  explicit ShrinkingSource(std::string victim) : victim_(std::move(victim)) {}
  Result<std::unique_ptr<storage::WritableFile>> NewWritableFile(const std::string& p) override {
    if (!shrunk_ && checkpoint::IsDcpDataFileName(std::filesystem::path(p).filename().string())) {
      shrunk_ = true;
      std::filesystem::resize_file(victim_, 4096);
    }
    return base().NewWritableFile(p);
  }
  // Metadata put in place after the source shrank: a commit of what was read.
  Status Rename(const std::string& a, const std::string& b) override {
    if (shrunk_ && std::filesystem::path(b).filename() == checkpoint::kMetadataName) {
      committed_after_shrink_ = true;
    }
    return base().Rename(a, b);
  }
  bool committed_after_shrink() const { return committed_after_shrink_; }

 private:
  std::string victim_;
  bool shrunk_ = false;
  bool committed_after_shrink_ = false;
};

// Issue 19 item 6: a source file shrinking while it is converted used to kill the process with
// SIGBUS (its mapping's pages past the new end); now it is one clear error naming the file, and
// nothing is committed: a checkpoint already in the destination stays loadable as it was (the
// check runs before the commit, not after it with an uncommit that lost the earlier one).
TEST(HfConvertTest, ASourceShrinkingDuringTheConversionIsAClearError) {
  TempDir tmp;
  const std::string first = tmp.Sub("first.safetensors");
  const T big0 = Random("big", DType::kU8, Shape{4 << 20}, 5);
  WriteHf(first, {big0, Random("small", DType::kF32, Shape{8}, 6)});
  ASSERT_TRUE(convert::HfToDcp(first, tmp.Sub("dcp"), {}, Fs()).ok());
  const std::string src = tmp.Sub("model.safetensors");
  WriteHf(src, {Random("big", DType::kU8, Shape{4 << 20}, 1),
                Random("small", DType::kF32, Shape{8}, 2)});
  ShrinkingSource fs(src);
  auto r = convert::HfToDcp(src, tmp.Sub("dcp"), {}, fs);
  ASSERT_FALSE(r.ok()) << "a conversion of a shrinking source succeeded";
  const std::string msg = r.status().message();
  EXPECT_NE(msg.find("source file " + src + " changed size during the conversion"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("4096 now"), std::string::npos) << msg;
  EXPECT_NE(msg.find("read as zeros"), std::string::npos) << msg;  // the SIGBUS was caught
  EXPECT_FALSE(fs.committed_after_shrink()) << "a checkpoint of the shrunk source was committed";
  std::vector<std::byte> got(big0.data.size());
  StateDict dst;
  dst.add("big", TensorView(got.data(), DType::kU8, {4 << 20}));
  ASSERT_NO_THROW(load(dst, tmp.Sub("dcp"), {.allow_partial = true}));
  EXPECT_TRUE(got == big0.data) << "the earlier checkpoint in the destination was damaged";
  // Once the source is whole again, the conversion goes through.
  WriteHf(src, {Random("big", DType::kU8, Shape{4 << 20}, 1),
                Random("small", DType::kF32, Shape{8}, 2)});
  ASSERT_TRUE(convert::HfToDcp(src, tmp.Sub("dcp"), {}, Fs()).ok());
}

// Issue 19 item 6: metadata built from HuggingFace headers reaches the reader as built; it is
// encoded only for a broadcast to other ranks, never encoded and decoded again on rank 0.
TEST(HfConvertTest, HfMetadataIsUsedAsBuilt) {
  TempDir tmp;
  WriteHf(tmp.Sub("model.safetensors"), {Random("a", DType::kF32, Shape{4}, 3)});
  auto found = checkpoint::FindMetadata(Fs(), tmp.Sub("model.safetensors"));
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_TRUE(found->built.has_value());
  EXPECT_TRUE(found->encoded.empty());
  EXPECT_EQ(found->built->tensors.size(), 1u);
}

TEST(HfConvertTest, SingleFileRoundTripEveryDType) {
  TempDir tmp;
  const std::vector<T> model = EveryDType();
  WriteHf(tmp.Sub("model.safetensors"), model);

  auto to_dcp = convert::HfToDcp(tmp.Sub("model.safetensors"), tmp.Sub("dcp"), {}, Fs());
  ASSERT_TRUE(to_dcp.ok()) << to_dcp.status().ToString();
  EXPECT_EQ(to_dcp->tensors, model.size());
  auto verified = checkpoint::Verify(Fs(), tmp.Sub("dcp"));  // a real dcp checkpoint
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_EQ(verified->tensors, model.size());

  auto to_hf = convert::DcpToHf(tmp.Sub("dcp"), tmp.Sub("hf"), HfOptions(), Fs());
  ASSERT_TRUE(to_hf.ok()) << to_hf.status().ToString();
  EXPECT_EQ(to_hf->shards_total, 1u);
  EXPECT_TRUE(testing::ListFiles(tmp.Sub("hf"), "model.safetensors.index").empty());
  ExpectSame(model, ReadHf(tmp.Sub("hf")));

  // The output header: __metadata__ {"format": "pt"}, padded to 8.
  auto h = hf::ReadSafetensorsHeader(Fs(), tmp.Sub("hf/model.safetensors"));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(h->data_start() % 8, 0u);
  // Bitwise the same tensor bytes as the source file.
  ExpectSame(model, ReadHf(tmp.Sub("model.safetensors")));
}

TEST(HfConvertTest, ShardedRoundTripWithIndex) {
  TempDir tmp;
  // Source: an indexed directory of two shards.
  std::vector<T> a = {Random("embed", DType::kBF16, Shape{64, 32}, 1),  // 4096 B
                      Random("huge", DType::kF32, Shape{100, 50}, 2),   // 20000 B > cap
                      Random("ln.bias", DType::kF64, Shape{3}, 3)};     // 24 B
  std::vector<T> b = {Random("ln.weight", DType::kU8, Shape{5}, 4),     // 5 B
                      Random("proj", DType::kI32, Shape{200}, 5),       // 800 B
                      Random("q", DType::kF16, Shape{1000}, 6),         // 2000 B
                      Random("v", DType::kF4, Shape{2, 50}, 7)};        // 50 B
  std::filesystem::create_directories(tmp.Sub("src"));
  WriteHf(tmp.Sub("src/model-00001-of-00002.safetensors"), a);
  WriteHf(tmp.Sub("src/model-00002-of-00002.safetensors"), b);
  nlohmann::json index;
  for (const T& t : a) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const T& t : b) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  std::ofstream(tmp.Sub("src/model.safetensors.index.json")) << index.dump();
  std::vector<T> all = a;
  all.insert(all.end(), b.begin(), b.end());

  ASSERT_TRUE(convert::HfToDcp(tmp.Sub("src"), tmp.Sub("dcp"), {}, Fs()).ok());
  // Cap 5000 bytes, and a small buffer so shards are written in several groups.
  auto r = convert::DcpToHf(tmp.Sub("dcp"), tmp.Sub("hf"), HfOptions(5000, 1000), Fs());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // fqn order: embed(4096) | huge(20000) | ln.bias ln.weight proj q v (2879) -> 3 shards.
  EXPECT_EQ(r->shards_total, 3u);
  ExpectSame(all, ReadHf(tmp.Sub("hf")));

  auto idx = nlohmann::json::parse(Slurp(tmp.Sub("hf/model.safetensors.index.json")));
  uint64_t sum = 0;
  for (const T& t : all) sum += t.data.size();
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), sum);
  EXPECT_EQ(idx["weight_map"].size(), all.size());
  EXPECT_EQ(idx["weight_map"]["huge"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(idx["weight_map"]["embed"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(idx["weight_map"]["q"], "model-00003-of-00003.safetensors");
  // The tensor larger than the cap sits alone in its shard.
  auto huge = hf::ReadSafetensorsHeader(Fs(), tmp.Sub("hf/model-00002-of-00003.safetensors"));
  ASSERT_TRUE(huge.ok());
  EXPECT_EQ(huge->tensors.size(), 1u);
  // Every tensor aligned to its element size in the file.
  auto third = hf::ReadSafetensorsHeader(Fs(), tmp.Sub("hf/model-00003-of-00003.safetensors"));
  ASSERT_TRUE(third.ok());
  for (const hf::HeaderTensor& t : third->tensors) {
    uint64_t elem = std::max(1, DTypeBits(t.dtype) / 8);
    EXPECT_EQ((third->data_start() + t.begin) % elem, 0u) << t.name;
  }
  // Index text as transformers writes it: indent 2, keys sorted.
  const std::string text = Slurp(tmp.Sub("hf/model.safetensors.index.json"));
  EXPECT_EQ(text.rfind("{\n  \"metadata\": {\n    \"total_size\": ", 0), 0u) << text;
  EXPECT_LT(text.find("\"embed\""), text.find("\"huge\""));
}

TEST(HfConvertTest, ShardPlan) {
  std::vector<convert::OutTensor> t = {{"a", DType::kU8, Shape{3}, 3},
                                       {"b", DType::kF64, Shape{1}, 8},
                                       {"c", DType::kU8, Shape{20}, 20},
                                       {"d", DType::kU8, Shape{1}, 1}};
  auto shards = convert::PlanShards(t, 12);
  ASSERT_EQ(shards.size(), 3u);
  EXPECT_EQ(shards[0].tensors, (std::vector<size_t>{1, 0}));  // widest first
  EXPECT_EQ(shards[0].bytes, 11u);
  EXPECT_EQ(shards[1].tensors, (std::vector<size_t>{2}));
  EXPECT_EQ(shards[2].tensors, (std::vector<size_t>{3}));
  EXPECT_EQ(shards[2].file, "model-00003-of-00003.safetensors");
  EXPECT_EQ(convert::PlanShards(t, 100).size(), 1u);
  EXPECT_EQ(convert::PlanShards(t, 100)[0].file, "model.safetensors");
}

TEST(HfConvertTest, ParseByteSize) {
  EXPECT_EQ(*ParseByteSize("5GB"), 5'000'000'000u);
  EXPECT_EQ(*ParseByteSize("500MB"), 500'000'000u);
  EXPECT_EQ(*ParseByteSize("10kb"), 10'000u);
  EXPECT_EQ(*ParseByteSize("2GiB"), uint64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("1.5 MB"), 1'500'000u);
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  for (const char* bad : {"", "GB", "5XB", "-1GB", "0", "1.2.3MB"}) {
    EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
  }
}

TEST(HfConvertTest, BytesEntriesAreSkipped) {
  TempDir tmp;
  std::vector<float> w(16, 1.5f);
  StateDict sd;
  sd.add("w", TensorView{w.data(), DType::kF32, Shape{4, 4}});
  sd.add_bytes("optim.state", std::string_view("opaque"));
  save(sd, tmp.Sub("dcp"));
  auto r = convert::DcpToHf(tmp.Sub("dcp"), tmp.Sub("hf"), HfOptions(), Fs());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->skipped_bytes_entries, std::vector<std::string>{"optim.state"});
  EXPECT_EQ(ReadHf(tmp.Sub("hf")).size(), 1u);
}

// A sharded dcp checkpoint (4 chunks per tensor) consolidates into full tensors.
TEST(HfConvertTest, ConsolidatesChunks) {
  TempDir tmp;
  T full = Random("w", DType::kBF16, Shape{8, 6}, 9);
  StateDict sd;
  for (int r = 0; r < 4; ++r) {
    sd.add("w", TensorView{full.data.data() + r * 2 * 6 * 2, DType::kBF16, Shape{2, 6}},
           Chunk{Shape{8, 6}, Shape{2 * r, 0}});
  }
  save(sd, tmp.Sub("dcp"));
  ASSERT_TRUE(convert::DcpToHf(tmp.Sub("dcp"), tmp.Sub("hf"), HfOptions(), Fs()).ok());
  ExpectSame({full}, ReadHf(tmp.Sub("hf")));
}

// Several ranks: each converts a share of the source files, one collective save; back to HF,
// shard i written by rank i % world.
TEST(HfConvertTest, MultiRankBothWays) {
  TempDir tmp;
  std::vector<T> all;
  nlohmann::json index;
  std::filesystem::create_directories(tmp.Sub("src"));
  for (int f = 0; f < 5; ++f) {
    std::vector<T> part;
    for (int k = 0; k < 3; ++k) {
      part.push_back(Random("l" + std::to_string(f) + ".t" + std::to_string(k), DType::kF32,
                            Shape{10 + f, 7}, 10 * f + k));
    }
    const std::string name = "part" + std::to_string(f) + ".safetensors";
    WriteHf(tmp.Sub("src/" + name), part);
    for (const T& t : part) index["weight_map"][t.name] = name;
    all.insert(all.end(), part.begin(), part.end());
  }
  std::ofstream(tmp.Sub("src/model.safetensors.index.json")) << index.dump();

  std::vector<Status> st(4);
  RunRanks(4, [&](const std::shared_ptr<Comm>& c) {
    auto r = convert::HfToDcp(tmp.Sub("src"), tmp.Sub("dcp"), {.comm = c}, Fs());
    st[c->rank()] = r.status();
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(checkpoint::Verify(Fs(), tmp.Sub("dcp")).ok());

  std::vector<uint64_t> shards_by_rank(3);
  RunRanks(3, [&](const std::shared_ptr<Comm>& c) {
    DcpToHfOptions o = HfOptions(1000, 600);
    o.comm = c;
    auto r = convert::DcpToHf(tmp.Sub("dcp"), tmp.Sub("hf"), o, Fs());
    st[c->rank()] = r.status();
    if (r.ok()) shards_by_rank[c->rank()] = r->shards;
  });
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(st[i].ok()) << st[i].ToString();
  EXPECT_GT(shards_by_rank[1], 0u);
  EXPECT_GT(shards_by_rank[2], 0u);
  ExpectSame(all, ReadHf(tmp.Sub("hf")));
}

TEST(HfConvertTest, AssignFilesBalancesBytes) {
  EXPECT_EQ(convert::AssignFiles({10, 50, 30, 20}, 2),
            (std::vector<int>{0, 0, 1, 1}));  // 50, 30, 20, then 10 at a tie
  EXPECT_EQ(convert::AssignFiles({5, 5, 5}, 4), (std::vector<int>{0, 1, 2}));
}

// ---- Loading a HuggingFace checkpoint directly.

TEST(HfLoadTest, LoadsFileAndDirectory) {
  TempDir tmp;
  const std::vector<T> model = EveryDType();
  WriteHf(tmp.Sub("model.safetensors"), model);
  for (const std::string& source : {tmp.Sub("model.safetensors"), tmp.path()}) {
    SCOPED_TRACE(source);
    std::vector<std::vector<std::byte>> bufs;
    StateDict sd;
    for (const T& t : model) {
      bufs.emplace_back(t.data.size() + 1);  // +1: never a null pointer for empty tensors
      sd.add(t.name, TensorView{bufs.back().data(), t.dtype, t.shape});
    }
    LoadResult r = load(sd, source);  // checksums requested, skipped: HF has none
    EXPECT_EQ(r.entries_loaded, model.size());
    for (size_t i = 0; i < model.size(); ++i) {
      EXPECT_TRUE(std::equal(model[i].data.begin(), model[i].data.end(), bufs[i].begin()))
          << model[i].name;
    }
  }
}

TEST(HfLoadTest, StripAndAddPrefix) {
  TempDir tmp;
  T a = Random("model.layers.0.w", DType::kF32, Shape{4}, 1);
  T b = Random("lm_head.weight", DType::kF32, Shape{4}, 2);
  WriteHf(tmp.Sub("model.safetensors"), {a, b});
  std::vector<std::byte> x(16), y(16);
  StateDict sd;
  sd.add("backbone.layers.0.w", TensorView{x.data(), DType::kF32, Shape{4}});
  sd.add("backbone.lm_head.weight", TensorView{y.data(), DType::kF32, Shape{4}});
  load(sd, tmp.path(), {.strip_prefix = "model.", .add_prefix = "backbone."});
  EXPECT_TRUE(x == a.data);
  EXPECT_TRUE(y == b.data);

  // Without the mapping the names do not match.
  EXPECT_THROW(load(sd, tmp.path()), Error);
  // Two names mapped onto one: a clear error.
  WriteHf(tmp.Sub("model.safetensors"), {a, Random("layers.0.w", DType::kF32, Shape{4}, 3)});
  try {
    load(sd, tmp.path(), {.strip_prefix = "model."});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("maps both 'layers.0.w' and 'model.layers.0.w' to "
                                         "'layers.0.w'"),
              std::string::npos)
        << e.what();
  }
}

TEST(HfLoadTest, RenameAppliesToDcpCheckpointsToo) {
  TempDir tmp;
  std::vector<float> w(4, 2.0f), out(4, 0.0f);
  StateDict sd;
  sd.add("net.w", TensorView{w.data(), DType::kF32, Shape{4}});
  save(sd, tmp.path());
  StateDict dst;
  dst.add("w", TensorView{out.data(), DType::kF32, Shape{4}});
  load(dst, tmp.path(), {.strip_prefix = "net."});
  EXPECT_EQ(out, w);
}

TEST(HfLoadTest, MalformedSourcesFailClearly) {
  TempDir tmp;
  std::vector<std::byte> buf(16);
  StateDict sd;
  sd.add("a", TensorView{buf.data(), DType::kF32, Shape{4}});
  auto expect = [&](const std::string& source, const std::string& fragment) {
    try {
      load(sd, source);
      FAIL() << "no error for " << source;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  std::filesystem::create_directories(tmp.Sub("idx"));
  std::ofstream(tmp.Sub("idx/model.safetensors.index.json"))
      << R"({"weight_map": {"a": "model-00001-of-00001.safetensors"}})";
  expect(tmp.Sub("idx"), "names shard model-00001-of-00001.safetensors, which is missing");
  std::ofstream(tmp.Sub("bad.safetensors")) << std::string("\x02\0\0\0\0\0\0\0{}xx", 12);
  expect(tmp.Sub("bad.safetensors"), "2 trailing bytes");
}

// Four ranks load a TP4 slice of every tensor straight from a HuggingFace directory.
TEST(HfLoadTest, ThreadRanksLoadTensorParallelSlices) {
  TempDir tmp;
  std::vector<T> model = {Random("model.embed.weight", DType::kBF16, Shape{16, 12}, 1),
                          Random("model.mlp.up.weight", DType::kF32, Shape{8, 20}, 2),
                          Random("model.norm.weight", DType::kF32, Shape{8}, 3)};
  std::filesystem::create_directories(tmp.Sub("hf"));
  WriteHf(tmp.Sub("hf/model-00001-of-00002.safetensors"), {model[0]});
  WriteHf(tmp.Sub("hf/model-00002-of-00002.safetensors"), {model[1], model[2]});
  nlohmann::json index;
  index["weight_map"] = {{model[0].name, "model-00001-of-00002.safetensors"},
                         {model[1].name, "model-00002-of-00002.safetensors"},
                         {model[2].name, "model-00002-of-00002.safetensors"}};
  std::ofstream(tmp.Sub("hf/model.safetensors.index.json")) << index.dump();

  std::vector<std::string> errors(4);
  RunRanks(4, [&](const std::shared_ptr<Comm>& c) {
    const int r = c->rank();
    std::vector<std::vector<std::byte>> bufs;
    StateDict sd;
    for (const T& t : model) {
      // Rows [r*n/4, (r+1)*n/4) of each tensor.
      const int64_t rows = t.shape[0] / 4;
      Shape local = t.shape, offsets = Shape::Zeros(t.shape.rank());
      local[0] = rows;
      offsets[0] = rows * r;
      bufs.emplace_back(t.data.size() / 4);
      sd.add(t.name, TensorView{bufs.back().data(), t.dtype, local}, Chunk{t.shape, offsets});
    }
    try {
      load(sd, tmp.Sub("hf"), {.comm = c});
    } catch (const Error& e) {
      errors[r] = e.what();
      return;
    }
    for (size_t i = 0; i < model.size(); ++i) {
      const size_t slice = model[i].data.size() / 4;
      if (!std::equal(bufs[i].begin(), bufs[i].end(), model[i].data.begin() + r * slice)) {
        errors[r] = "rank " + std::to_string(r) + ": " + model[i].name + " differs";
      }
    }
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

TEST(HfLoadTest, VerifyChecksSizesOnly) {
  TempDir tmp;
  WriteHf(tmp.Sub("model.safetensors"), {Random("a", DType::kF32, Shape{4}, 1)});
  auto r = checkpoint::Verify(Fs(), tmp.Sub("model.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors, 1u);
  EXPECT_EQ(r->bytes_checked, 0u);
}

TEST(HfCliTest, ConvertBothWays) {
  TempDir tmp;
  const std::vector<T> model = EveryDType();
  WriteHf(tmp.Sub("model.safetensors"), model);
  std::string out;
  const std::string cli = DCP_CLI_PATH;
  ASSERT_EQ(testing::RunCommand(
                cli + " convert " + tmp.Sub("model.safetensors") + " " + tmp.Sub("dcp"), &out),
            0)
      << out;
  EXPECT_NE(out.find("to dcp checkpoint"), std::string::npos) << out;
  ASSERT_EQ(testing::RunCommand(cli + " convert " + tmp.Sub("dcp") + " " + tmp.Sub("hf") +
                                    " --to hf --max-shard-size 1KB",
                                &out),
            0)
      << out;
  EXPECT_NE(out.find("shard(s)"), std::string::npos) << out;
  ExpectSame(model, ReadHf(tmp.Sub("hf")));
  EXPECT_EQ(testing::RunCommand(cli + " convert " + tmp.Sub("nothing") + " " + tmp.Sub("x"), &out),
            1);
  EXPECT_NE(out.find("dcp convert: "), std::string::npos) << out;
  EXPECT_NE(out.find("is not a HuggingFace checkpoint"), std::string::npos) << out;
  EXPECT_EQ(testing::RunCommand(cli + " convert " + tmp.Sub("dcp") + " " + tmp.Sub("y") +
                                    " --to hf --max-shard-size 5XB",
                                &out),
            1);
  EXPECT_NE(out.find("bad size '5XB'"), std::string::npos) << out;
}

// ---- Issue 11: exports never leave a loadable mix; linear in tensors; clear CLI ---------------

// Names in `dir`, hidden ones included.
std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    out.insert(e.path().filename().string());
  }
  return out;
}

// Two models of the same tensor names (different bytes), each converted to a dcp checkpoint.
struct TwoCheckpoints {
  std::vector<T> a, b;
  std::string ckpt_a, ckpt_b;
};

TwoCheckpoints MakeTwo(TempDir& tmp) {
  TwoCheckpoints c;
  for (int i = 0; i < 6; ++i) {
    const std::string name = "layer." + std::to_string(i) + ".weight";
    c.a.push_back(Random(name, DType::kF32, Shape{16, 8}, 10 + i));  // 512 B each
    c.b.push_back(Random(name, DType::kF32, Shape{16, 8}, 50 + i));
  }
  WriteHf(tmp.Sub("a.safetensors"), c.a);
  WriteHf(tmp.Sub("b.safetensors"), c.b);
  c.ckpt_a = tmp.Sub("ckpt_a");
  c.ckpt_b = tmp.Sub("ckpt_b");
  EXPECT_TRUE(convert::HfToDcp(tmp.Sub("a.safetensors"), c.ckpt_a, {}, Fs()).ok());
  EXPECT_TRUE(convert::HfToDcp(tmp.Sub("b.safetensors"), c.ckpt_b, {}, Fs()).ok());
  return c;
}

TEST(HfExportTest, NonEmptyDestinationRefusedUnlessOverwrite) {
  TempDir tmp;
  TwoCheckpoints c = MakeTwo(tmp);
  const std::string out = tmp.Sub("out/hf");
  // 3 shards of two tensors: the earlier export has an index and three shard files.
  ASSERT_TRUE(convert::DcpToHf(c.ckpt_a, out, HfOptions(1024), Fs()).ok());
  ExpectSame(c.a, ReadHf(out));
  const std::set<std::string> first = Entries(out);
  EXPECT_EQ(first.size(), 4u);

  auto again = convert::DcpToHf(c.ckpt_b, out, HfOptions(1024), Fs());
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("is not empty"), std::string::npos)
      << again.status().ToString();
  EXPECT_NE(again.status().message().find("--overwrite"), std::string::npos);
  ExpectSame(c.a, ReadHf(out));  // untouched
  EXPECT_EQ(Entries(out), first);

  // Replaced by one file: no index or shard of the earlier export is left behind.
  DcpToHfOptions o = HfOptions();
  o.overwrite = true;
  auto r = convert::DcpToHf(c.ckpt_b, out, o, Fs());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Entries(out), std::set<std::string>{"model.safetensors"});
  ExpectSame(c.b, ReadHf(out));
  // No staging or old directory left beside it.
  EXPECT_EQ(Entries(tmp.Sub("out")), std::set<std::string>{"hf"});

  // Exporting into the source itself is refused, overwrite or not.
  auto self = convert::DcpToHf(c.ckpt_b, c.ckpt_b, o, Fs());
  ASSERT_FALSE(self.ok());
  EXPECT_NE(self.status().message().find("is (or contains) the source"), std::string::npos)
      << self.status().ToString();
  auto parent = convert::DcpToHf(c.ckpt_b, tmp.path(), o, Fs());
  ASSERT_FALSE(parent.ok());
}

TEST(HfExportTest, SourceChangedDuringExportFails) {
  TempDir tmp;
  TwoCheckpoints c = MakeTwo(tmp);
  const std::string src = tmp.Sub("live");
  ASSERT_TRUE(convert::HfToDcp(tmp.Sub("a.safetensors"), src, {}, Fs()).ok());
  const std::string out = tmp.Sub("out");
  DcpToHfOptions o = HfOptions(1024, 512);  // 3 shards, loaded tensor by tensor
  int calls = 0;
  auto after_shard = [&](size_t) {
    // Another job saves over the source after the first shard.
    if (calls++ == 0) {
      ASSERT_TRUE(convert::HfToDcp(tmp.Sub("b.safetensors"), src, {}, Fs()).ok());
    }
  };
  auto r = convert::DcpToHf(src, out, o, Fs(), after_shard);
  ASSERT_FALSE(r.ok()) << "exported a mix of two checkpoints";
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("changed during the export"), std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(calls, 1);
  // Nothing exported, nothing left beside it.
  EXPECT_FALSE(std::filesystem::exists(out));
  for (const std::string& e : Entries(tmp.path())) {
    EXPECT_EQ(e.find("dcp-export"), std::string::npos) << e;
  }
}

TEST(HfExportTest, FailedOrKilledOverwriteLeavesOldOrNewExport) {
  // A failure at every mutating file-system operation of an overwriting export in turn (every
  // later operation failing too, as if the process had died there): the destination always
  // holds the whole old export or the whole new one, never a mix.
  TempDir tmp;
  TwoCheckpoints c = MakeTwo(tmp);
  const std::string out = tmp.Sub("out");
  // The old export: three shards and an index; the new one: one file, loaded in 512 B groups.
  DcpToHfOptions o = HfOptions(5'000'000'000, 512);
  o.overwrite = true;
  auto count = [&] {
    std::filesystem::remove_all(out);
    EXPECT_TRUE(convert::DcpToHf(c.ckpt_a, out, HfOptions(1024), Fs()).ok());
    testfs::FaultFileSystem fs(Fs());
    EXPECT_TRUE(convert::DcpToHf(c.ckpt_b, out, o, fs).ok());
    return fs.ops();
  };
  const int64_t ops = count();
  ASSERT_GT(ops, 8);
  int old_seen = 0, new_seen = 0;
  for (int64_t n = 0; n <= ops; ++n) {
    SCOPED_TRACE("failing from operation " + std::to_string(n) + " of " + std::to_string(ops));
    std::filesystem::remove_all(out);
    ASSERT_TRUE(convert::DcpToHf(c.ckpt_a, out, HfOptions(1024), Fs()).ok());
    testfs::FaultFileSystem fs(Fs());
    fs.FailAt(n);
    auto r = convert::DcpToHf(c.ckpt_b, out, o, fs);
    fs.SimulateCrash();
    auto got = ReadHf(out);
    ASSERT_EQ(got.size(), c.a.size());
    const bool is_old = got.begin()->second.data == c.a[0].data;
    ExpectSame(is_old ? c.a : c.b, got);
    if (is_old) {
      ++old_seen;
      EXPECT_FALSE(r.ok());
      // The old export, exactly: its index and its three shards.
      EXPECT_EQ(Entries(out).size(), 4u);
    } else {
      ++new_seen;
      EXPECT_EQ(Entries(out), std::set<std::string>{"model.safetensors"});
    }
  }
  EXPECT_GT(old_seen, 0);
  EXPECT_GT(new_seen, 0);
}

TEST(HfConvertTest, ManyTensorsInOneFileConvertQuickly) {
  // Issue 11 item 8: writing a safetensors header was quadratic in its tensor count (200k tensors
  // took minutes). 50k tiny tensors, both ways, with every name and offset checked.
  TempDir tmp;
  constexpr int kTensors = 50000;
  std::vector<T> model;
  model.reserve(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    T t{"t." + std::to_string(i), DType::kI32, Shape{1}, std::vector<std::byte>(4)};
    std::memcpy(t.data.data(), &i, 4);
    model.push_back(std::move(t));
  }
  WriteHf(tmp.Sub("model.safetensors"), model);
  ASSERT_TRUE(convert::HfToDcp(tmp.Sub("model.safetensors"), tmp.Sub("dcp"), {}, Fs()).ok());
  auto r = convert::DcpToHf(tmp.Sub("dcp"), tmp.Sub("hf"), HfOptions(), Fs());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->total_tensors, static_cast<uint64_t>(kTensors));
  auto h = hf::ReadSafetensorsHeader(Fs(), tmp.Sub("hf/model.safetensors"));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->tensors.size(), static_cast<size_t>(kTensors));
  // One dtype: data order is fqn order, 4 bytes apart.
  std::vector<std::string> names;
  for (const T& t : model) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  for (size_t i = 0; i < names.size(); ++i) {
    ASSERT_EQ(h->tensors[i].name, names[i]);
    ASSERT_EQ(h->tensors[i].begin, 4 * i);
    ASSERT_EQ(h->tensors[i].end, 4 * i + 4);
  }
  ExpectSame(model, ReadHf(tmp.Sub("hf")));
}

TEST(HfCliTest, ClearMessages) {
  TempDir tmp;
  const std::string cli = DCP_CLI_PATH;
  std::string out;
  // A source file with custom __metadata__ keys, written by hand.
  {
    const std::string json = R"({"__metadata__":{"format":"pt","base_model":"x","step":"7"},)"
                             R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(uint64_t{json.size()} >> (8 * i));
    file += json + std::string(8, '\x01');
    std::ofstream(tmp.Sub("model.safetensors"), std::ios::binary) << file;
  }
  const std::string hf_file = tmp.Sub("model.safetensors");

  // verify / inspect on an HF source say there are no checksums.
  ASSERT_EQ(testing::RunCommand(cli + " verify " + hf_file, &out), 0) << out;
  EXPECT_NE(out.find("HuggingFace source: no checksums, sizes checked"), std::string::npos) << out;
  EXPECT_EQ(out.find("0 B checked"), std::string::npos) << out;
  ASSERT_EQ(testing::RunCommand(cli + " inspect " + hf_file, &out), 0) << out;
  EXPECT_NE(out.find("HuggingFace source: no checksums, sizes checked"), std::string::npos) << out;
  EXPECT_EQ(out.find("save 0000000000000000"), std::string::npos) << out;

  // Size options do not apply to HF -> dcp.
  EXPECT_EQ(testing::RunCommand(
                cli + " convert --quiet " + hf_file + " " + tmp.Sub("d0") + " --max-shard-size 1GB",
                &out),
            1);
  EXPECT_NE(out.find("apply to --to hf only"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(tmp.Sub("d0")));

  // Custom __metadata__ keys are named in a warning.
  ASSERT_EQ(testing::RunCommand(cli + " convert --quiet " + hf_file + " " + tmp.Sub("d"), &out), 0)
      << out;
  EXPECT_NE(out.find("warning: the source's __metadata__ keys base_model, step are not kept"),
            std::string::npos)
      << out;

  // dcp -> dcp without --to hf: the hint.
  EXPECT_EQ(testing::RunCommand(cli + " convert " + tmp.Sub("d") + " " + tmp.Sub("e"), &out), 1);
  EXPECT_NE(out.find("is a dcp checkpoint"), std::string::npos) << out;
  EXPECT_NE(out.find("add --to hf"), std::string::npos) << out;

  // A second export is refused; --overwrite replaces it.
  ASSERT_EQ(testing::RunCommand(
                cli + " convert --quiet " + tmp.Sub("d") + " " + tmp.Sub("hf") + " --to hf", &out),
            0)
      << out;
  EXPECT_EQ(testing::RunCommand(
                cli + " convert --quiet " + tmp.Sub("d") + " " + tmp.Sub("hf") + " --to hf", &out),
            1);
  EXPECT_NE(out.find("is not empty"), std::string::npos) << out;
  EXPECT_EQ(testing::RunCommand(cli + " convert --quiet " + tmp.Sub("d") + " " + tmp.Sub("hf") +
                                    " --to hf --overwrite",
                                &out),
            0)
      << out;
}

TEST(HfCliTest, FifoInsteadOfAFileIsRefusedNotWaitedOn) {
  // Issue 11 item 9: a FIFO in place of dcp.metadata or a data file blocked verify forever.
  TempDir tmp;
  WriteHf(tmp.Sub("a.safetensors"), {Random("w", DType::kF32, Shape{4}, 1)});
  ASSERT_TRUE(convert::HfToDcp(tmp.Sub("a.safetensors"), tmp.Sub("ckpt"), {}, Fs()).ok());
  const std::string cli = DCP_CLI_PATH;
  std::string out;
  // A data file replaced by a FIFO.
  std::string data_file;
  for (const std::string& n : Entries(tmp.Sub("ckpt"))) {
    if (n.rfind("data-", 0) == 0) data_file = tmp.Sub("ckpt/" + n);
  }
  ASSERT_FALSE(data_file.empty());
  std::filesystem::remove(data_file);
  ASSERT_EQ(::mkfifo(data_file.c_str(), 0644), 0);
  EXPECT_NE(testing::RunCommand(cli + " verify " + tmp.Sub("ckpt"), &out), 0);
  EXPECT_NE(out.find("it is a FIFO, not a regular file"), std::string::npos) << out;
  EXPECT_NE(out.find(data_file), std::string::npos) << out;
  // The metadata replaced by a FIFO.
  const std::string md = tmp.Sub("ckpt/dcp.metadata");
  std::filesystem::remove(md);
  ASSERT_EQ(::mkfifo(md.c_str(), 0644), 0);
  EXPECT_NE(testing::RunCommand(cli + " verify " + tmp.Sub("ckpt"), &out), 0);
  EXPECT_NE(out.find("it is a FIFO, not a regular file"), std::string::npos) << out;
}

}  // namespace
}  // namespace dcp
