#include "hf/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <fstream>
#include <tuple>

#include "hf/torch_hf_format.h"
#include "storage/data_files.h"
#include "test_util.h"

namespace dcp::hf {
namespace {

using testing::TempDir;

storage::FileSystem& Fs() { return storage::PosixFileSystem(); }

// A safetensors file with U8 tensors of the given sizes, each filled with its index.
void WriteFile(const std::string& path, const std::vector<std::pair<std::string, int>>& tensors) {
  static std::vector<std::vector<std::byte>> keep;
  std::vector<storage::TensorToWrite> items;
  for (const auto& [name, n] : tensors) {
    keep.emplace_back(n, std::byte(items.size()));
    items.push_back({name, DType::kU8, Shape{n}, keep.back()});
  }
  ASSERT_TRUE(storage::WriteSafetensorsFile(Fs(), path, items).ok());
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(HfCheckpointTest, DetectsEachKind) {
  TempDir tmp;
  EXPECT_EQ(DetectSource(Fs(), tmp.path()), SourceKind::kNone);
  EXPECT_EQ(DetectSource(Fs(), tmp.Sub("missing.safetensors")), SourceKind::kNone);
  WriteFile(tmp.Sub("model.safetensors"), {{"a", 4}});
  EXPECT_EQ(DetectSource(Fs(), tmp.path()), SourceKind::kSingleFileDir);
  EXPECT_EQ(DetectSource(Fs(), tmp.Sub("model.safetensors")), SourceKind::kFile);
  WriteText(tmp.Sub("model.safetensors.index.json"), R"({"weight_map": {}})");
  EXPECT_EQ(DetectSource(Fs(), tmp.path()), SourceKind::kIndexedDir);
}

TEST(HfCheckpointTest, DataDirOf) {
  TempDir tmp;
  WriteFile(tmp.Sub("w.safetensors"), {{"a", 4}});
  EXPECT_EQ(DataDirOf(tmp.Sub("w.safetensors")), tmp.path());
  EXPECT_EQ(DataDirOf(tmp.path()), tmp.path());
  EXPECT_EQ(DataDirOf("/no/such/dir"), "/no/such/dir");
}

TEST(HfCheckpointTest, SingleFileToMetadata) {
  TempDir tmp;
  WriteFile(tmp.Sub("w.safetensors"), {{"z", 4}, {"a", 3}});
  auto src = OpenSource(Fs(), tmp.Sub("w.safetensors"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ(src->kind, SourceKind::kFile);
  EXPECT_EQ(src->data_dir, tmp.path());
  EXPECT_EQ(src->TotalTensorBytes(), 7u);
  metadata::Metadata md = ToMetadata(*src);
  EXPECT_FALSE(md.has_checksums);
  ASSERT_EQ(md.files.size(), 1u);
  EXPECT_EQ(md.files[0].name, "w.safetensors");
  ASSERT_EQ(md.tensors.size(), 2u);
  EXPECT_EQ(md.tensors[0].fqn, "a");  // sorted by name
  EXPECT_EQ(md.tensors[1].fqn, "z");
  const uint64_t data_start = src->files[0].header.data_start();
  EXPECT_EQ(md.tensors[1].chunks[0].byte_offset, data_start);
  EXPECT_EQ(md.tensors[0].chunks[0].byte_offset, data_start + 4);
  EXPECT_EQ(md.tensors[0].chunks[0].byte_length, 3u);
  EXPECT_EQ(md.tensors[0].chunks[0].box, Box::Whole(Shape{3}));
}

TEST(HfCheckpointTest, IndexedDirectory) {
  TempDir tmp;
  WriteFile(tmp.Sub("model-00001-of-00002.safetensors"), {{"a", 4}, {"b", 2}});
  WriteFile(tmp.Sub("model-00002-of-00002.safetensors"), {{"c", 8}});
  WriteText(tmp.Sub("model.safetensors.index.json"),
            R"({"metadata": {"total_size": 14}, "weight_map": {
                 "a": "model-00001-of-00002.safetensors",
                 "b": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors"}})");
  auto src = OpenSource(Fs(), tmp.path());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ(src->files.size(), 2u);
  EXPECT_EQ(src->TotalTensors(), 3u);
  metadata::Metadata md = ToMetadata(*src);
  ASSERT_EQ(md.tensors.size(), 3u);
  EXPECT_EQ(md.tensors[2].fqn, "c");
  EXPECT_EQ(md.files[md.tensors[2].chunks[0].file].name, "model-00002-of-00002.safetensors");
}

TEST(HfCheckpointTest, IndexNamingAMissingShard) {
  TempDir tmp;
  WriteFile(tmp.Sub("model-00001-of-00002.safetensors"), {{"a", 4}});
  WriteText(tmp.Sub("model.safetensors.index.json"),
            R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                               "b": "model-00002-of-00002.safetensors"}})");
  auto src = OpenSource(Fs(), tmp.path());
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), StatusCode::kNotFound);
  EXPECT_NE(src.status().message().find("names shard model-00002-of-00002.safetensors, which is "
                                        "missing"),
            std::string::npos)
      << src.status().message();
}

TEST(HfCheckpointTest, IndexErrors) {
  TempDir tmp;
  WriteFile(tmp.Sub("s1.safetensors"), {{"a", 4}});
  WriteFile(tmp.Sub("s2.safetensors"), {{"a", 4}});
  const std::string index = tmp.Sub("model.safetensors.index.json");
  auto expect = [&](const std::string& text, const std::string& fragment) {
    WriteText(index, text);
    auto src = OpenSource(Fs(), tmp.path());
    ASSERT_FALSE(src.ok()) << text;
    EXPECT_NE(src.status().message().find(fragment), std::string::npos) << src.status().message();
  };
  expect("{", "is not valid JSON");
  expect(R"({"metadata": {}})", "no \"weight_map\"");
  expect(R"({"weight_map": {"a": 1}})", "entry 'a' is not a file name");
  expect(R"({"weight_map": {"a": "../s1.safetensors"}})", "not a file name in");
  expect(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})",
         "places tensor 'b' in s1.safetensors, which does not hold it");
  expect(R"({"weight_map": {"a": "s1.safetensors", "x": "s2.safetensors"}})",
         "tensor 'a' is stored in both s1.safetensors and s2.safetensors");
}

TEST(HfCheckpointTest, NotASource) {
  TempDir tmp;
  auto src = OpenSource(Fs(), tmp.path());
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(src.status().message().find("is not a HuggingFace checkpoint"), std::string::npos);
}

TEST(HfCheckpointTest, MalformedShardNamesFile) {
  TempDir tmp;
  WriteText(tmp.Sub("model.safetensors"), std::string("\x04\0\0\0\0\0\0\0{}", 10) + "xyz");
  auto src = OpenSource(Fs(), tmp.path());
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(src.status().message().find(tmp.Sub("model.safetensors")), std::string::npos)
      << src.status().message();
}

// A shard as torch's HuggingFaceStorageWriter writes it: U8 chunks at the given offsets,
// each filled with `fill`; `info` overrides the sharding info's text.
void WriteShard(const std::string& path,
                const std::vector<std::tuple<std::string, Shape, Shape>>& chunks, std::byte fill,
                const std::string* info = nullptr) {
  static std::vector<std::vector<std::byte>> keep;
  std::vector<ShardedTensor> offsets;
  std::vector<storage::TensorToWrite> items;
  for (const auto& [name, at, shape] : chunks) {
    keep.emplace_back(*shape.NumElements(), fill);
    items.push_back({name, DType::kU8, shape, keep.back()});
    offsets.push_back({name, at});
  }
  storage::SafetensorsHeader header(std::vector<std::pair<std::string, std::string>>{
      {std::string(kShardingInfoKey), info ? *info : ShardingInfoJson(offsets)}});
  for (const auto& t : items) header.Add(t.key, t.dtype, t.shape, t.data.size());
  ASSERT_TRUE(
      storage::WriteSafetensorsFileWithHeader(Fs(), path, std::move(header).Finish(), items).ok());
}

TEST(HfCheckpointTest, TorchShardsAreChunksOfOneTensor) {
  TempDir tmp;
  WriteShard(tmp.Sub("shard-00001-model-00001-of-00001.safetensors"),
             {{"w", Shape{0, 0}, Shape{2, 4}}, {"b", Shape{0}, Shape{3}}}, std::byte{1});
  WriteShard(tmp.Sub("shard-00002-model-00001-of-00001.safetensors"),
             {{"w", Shape{2, 0}, Shape{3, 4}}}, std::byte{2});
  WriteFile(tmp.Sub("notes.safetensors"), {{"x", 1}});  // not torch's: not read
  EXPECT_EQ(DetectSource(Fs(), tmp.path()), SourceKind::kTorchFilesDir);
  auto src = OpenSource(Fs(), tmp.path());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_EQ(src->files.size(), 2u);
  metadata::Metadata md = ToMetadata(*src);
  ASSERT_EQ(md.tensors.size(), 2u);
  EXPECT_EQ(md.tensors[0].fqn, "b");
  EXPECT_EQ(md.tensors[0].global_shape, (Shape{3}));
  const metadata::TensorMeta& w = md.tensors[1];
  EXPECT_EQ(w.global_shape, (Shape{5, 4}));
  ASSERT_EQ(w.chunks.size(), 2u);
  EXPECT_EQ(w.chunks[0].box, (Box{Shape{0, 0}, Shape{2, 4}}));
  EXPECT_EQ(w.chunks[1].box, (Box{Shape{2, 0}, Shape{3, 4}}));
  EXPECT_EQ(md.files[w.chunks[1].file].name, "shard-00002-model-00001-of-00001.safetensors");
  EXPECT_EQ(w.chunks[1].byte_length, 12u);
}

TEST(HfCheckpointTest, ADcpDataDirectoryIsNoSource) {
  TempDir tmp;
  WriteFile(tmp.Sub("data-1-r0.safetensors"), {{"a", 4}});
  EXPECT_EQ(DetectSource(Fs(), tmp.path()), SourceKind::kNone);
}

TEST(HfCheckpointTest, BadTorchShardsAreNamed) {
  auto expect = [](auto write, const std::string& fragment) {
    TempDir tmp;
    write(tmp);
    auto src = OpenSource(Fs(), tmp.path());
    ASSERT_FALSE(src.ok()) << fragment;
    EXPECT_EQ(src.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(src.status().message().find(fragment), std::string::npos) << src.status().message();
  };
  const std::string a = "shard-00001-model-00001-of-00001.safetensors";
  const std::string b = "shard-00002-model-00001-of-00001.safetensors";
  expect(
      [&](TempDir& t) {
        WriteShard(t.Sub(a), {{"w", Shape{0}, Shape{4}}}, std::byte{1});
        WriteShard(t.Sub(b), {{"w", Shape{3}, Shape{4}}}, std::byte{2});
      },
      "tensor 'w' has overlapping chunks");
  expect(
      [&](TempDir& t) {
        WriteShard(t.Sub(a), {{"w", Shape{0}, Shape{4}}}, std::byte{1});
        WriteFile(t.Sub(b), {{"w", 4}});
      },
      "tensor 'w' is stored in both " + a + " and " + b + " (not as chunks of it)");
  const std::string no_entry = R"({"v": {"saved_offsets": [0]}})";
  expect(
      [&](TempDir& t) {
        WriteShard(t.Sub(a), {{"w", Shape{0}, Shape{4}}}, std::byte{1}, &no_entry);
      },
      "gives no saved_offsets for tensor 'w'");
  const std::string wrong_rank = R"({"w": {"saved_offsets": [0, 0]}})";
  expect(
      [&](TempDir& t) {
        WriteShard(t.Sub(a), {{"w", Shape{0}, Shape{4}}}, std::byte{1}, &wrong_rank);
      },
      "tensor 'w' of 1 dimensions has 2 saved_offsets");
  const std::string negative = R"({"w": {"saved_offsets": [-1]}})";
  expect(
      [&](TempDir& t) {
        WriteShard(t.Sub(a), {{"w", Shape{0}, Shape{4}}}, std::byte{1}, &negative);
      },
      "tensor 'w' has a bad offset -1");
  const std::string huge = R"({"w": {"saved_offsets": [4611686018427387000, 0]}})";
  expect(
      [&](TempDir& t) {
        WriteShard(t.Sub(a), {{"w", Shape{0, 0}, Shape{4, 4}}}, std::byte{1});
        WriteShard(t.Sub(b), {{"w", Shape{0, 0}, Shape{4, 4}}}, std::byte{2}, &huge);
      },
      "tensor 'w' of shape [4611686018427387004, 4] (where its chunks reach) is too large");
  const std::string garbage = "[1";
  expect(
      [&](TempDir& t) {
        WriteShard(t.Sub(a), {{"w", Shape{0}, Shape{4}}}, std::byte{1}, &garbage);
      },
      "DCP_SHARDING_INFO is not a JSON object");
}

}  // namespace
}  // namespace dcp::hf
