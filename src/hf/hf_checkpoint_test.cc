#include "hf/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <fstream>

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

}  // namespace
}  // namespace dcp::hf
