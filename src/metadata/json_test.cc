#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "dcp/metadata.h"
#include "metadata/codec.h"

namespace dcp::metadata {
namespace {

Metadata SampleMetadata() {
  Metadata md;
  md.save_id = 0x00ab00000000cd01ULL;
  md.world_size = 2;
  md.files = {{"data-00ab00000000cd01-r00000.safetensors", 4096},
              {"data-00ab00000000cd01-r00001.safetensors", 4096},
              {"data-00ab00000000cd01-r00000.bytes", 8}};
  TensorMeta w;
  w.fqn = "layer.weight";
  w.dtype = DType::kBF16;
  w.global_shape = Shape{4, 8};
  StoredChunk c0;
  c0.box = Box{Shape{0, 0}, Shape{2, 8}};
  c0.file = 0;
  c0.byte_offset = 128;
  c0.byte_length = 32;
  c0.xxh3 = 0x0123456789abcdefULL;
  StoredChunk c1 = c0;
  c1.box = Box{Shape{2, 0}, Shape{2, 8}};
  c1.file = 1;
  c1.xxh3 = 1;
  w.chunks = {c0, c1};
  TensorMeta s;
  s.fqn = "scale";
  s.dtype = DType::kF8_E4M3;
  s.global_shape = Shape{};
  StoredChunk c2;
  c2.box = Box{Shape{}, Shape{}};
  c2.byte_offset = 160;
  c2.byte_length = 1;
  s.chunks = {c2};
  md.tensors = {w, s};
  md.bytes = {{"step", 2, 0, 8, 0xfeedULL}};
  return md;
}

TEST(MetadataToJsonTest, FollowsTheSchema) {
  nlohmann::json j = nlohmann::json::parse(MetadataToJson(SampleMetadata()));
  EXPECT_EQ(j["format_version"], 3);
  EXPECT_EQ(j["save_id"], "00ab00000000cd01");
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["block_size"], 0);

  ASSERT_EQ(j["files"].size(), 3u);
  EXPECT_EQ(j["files"][1],
            (nlohmann::json{{"name", "data-00ab00000000cd01-r00001.safetensors"}, {"size", 4096}}));

  ASSERT_EQ(j["tensors"].size(), 2u);
  const nlohmann::json& w = j["tensors"][0];
  EXPECT_EQ(w["fqn"], "layer.weight");
  EXPECT_EQ(w["dtype"], "BF16");
  EXPECT_EQ(w["shape"], nlohmann::json::array({4, 8}));
  ASSERT_EQ(w["chunks"].size(), 2u);
  EXPECT_EQ(w["chunks"][1], (nlohmann::json{{"offsets", {2, 0}},
                                            {"lengths", {2, 8}},
                                            {"file", "data-00ab00000000cd01-r00001.safetensors"},
                                            {"byte_offset", 128},
                                            {"byte_length", 32},
                                            {"xxh3", "0000000000000001"}}));
  EXPECT_EQ(w["chunks"][0]["xxh3"], "0123456789abcdef");

  // A 0-d tensor has empty shape, offsets and lengths arrays (not null).
  const nlohmann::json& s = j["tensors"][1];
  EXPECT_EQ(s["dtype"], "F8_E4M3");
  EXPECT_TRUE(s["shape"].is_array());
  EXPECT_TRUE(s["shape"].empty());
  EXPECT_TRUE(s["chunks"][0]["offsets"].is_array());
  EXPECT_TRUE(s["chunks"][0]["lengths"].empty());

  ASSERT_EQ(j["bytes"].size(), 1u);
  EXPECT_EQ(j["bytes"][0], (nlohmann::json{{"fqn", "step"},
                                           {"file", "data-00ab00000000cd01-r00000.bytes"},
                                           {"byte_offset", 0},
                                           {"byte_length", 8},
                                           {"xxh3", "000000000000feed"}}));

  EXPECT_EQ(j["totals"], (nlohmann::json{{"tensors", 2},
                                         {"chunks", 3},
                                         {"bytes_entries", 1},
                                         {"files", 3},
                                         {"data_bytes", 32 + 32 + 1 + 8},
                                         {"file_bytes", 4096 + 4096 + 8},
                                         {"referenced_file_bytes", 0}}));
}

// An incremental checkpoint: files in a base's directory carry "base", as do the chunks in
// them; the format version is 4; the summary says what is referenced and where.
TEST(MetadataToJsonTest, ShowsReferencesToBases) {
  Metadata md = SampleMetadata();
  md.files[1].base = "step_000000100";
  nlohmann::json j = nlohmann::json::parse(MetadataToJson(md));
  EXPECT_EQ(j["format_version"], 4);
  EXPECT_EQ(j["files"][1]["base"], "step_000000100");
  EXPECT_FALSE(j["files"][0].contains("base"));
  EXPECT_EQ(j["tensors"][0]["chunks"][1]["file"], "data-00ab00000000cd01-r00001.safetensors");
  EXPECT_EQ(j["tensors"][0]["chunks"][1]["base"], "step_000000100");
  EXPECT_FALSE(j["tensors"][0]["chunks"][0].contains("base"));
  EXPECT_EQ(j["totals"]["referenced_file_bytes"], 4096);
  const std::string summary = MetadataSummary(md, /*list_chunks=*/true);
  EXPECT_NE(summary.find("format version 4"), std::string::npos) << summary;
  EXPECT_NE(summary.find("../step_000000100/data-00ab00000000cd01-r00001.safetensors"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("references: 1 file (4.0 KiB) in the base directory step_000000100"),
            std::string::npos)
      << summary;
}

TEST(MetadataToJsonTest, ShowsBlockChecksums) {
  Metadata md = SampleMetadata();
  md.block_size = 16;
  md.tensors[0].chunks[0].block_xxh3 = {0xa, 0xb};
  nlohmann::json j = nlohmann::json::parse(MetadataToJson(md));
  EXPECT_EQ(j["block_size"], 16);
  EXPECT_EQ(j["tensors"][0]["chunks"][0]["block_xxh3"],
            nlohmann::json::array({"000000000000000a", "000000000000000b"}));
  EXPECT_FALSE(j["tensors"][0]["chunks"][1].contains("block_xxh3"));  // one block: none
}

TEST(MetadataToJsonTest, EmptyMetadataHasEmptyArrays) {
  nlohmann::json j = nlohmann::json::parse(MetadataToJson(Metadata{}));
  EXPECT_TRUE(j["files"].is_array() && j["files"].empty());
  EXPECT_TRUE(j["tensors"].is_array() && j["tensors"].empty());
  EXPECT_TRUE(j["bytes"].is_array() && j["bytes"].empty());
  EXPECT_EQ(j["totals"]["chunks"], 0);
}

TEST(MetadataToJsonTest, SameViewAfterDecode) {
  Result<Metadata> md = Decode(Encode(SampleMetadata()));
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_EQ(MetadataToJson(*md), MetadataToJson(SampleMetadata()));
  // Parses back from its own dump: what `dcp inspect --json` consumers do.
  const std::string text = MetadataToJson(*md);
  EXPECT_EQ(nlohmann::json::parse(text)["totals"]["file_bytes"], 8200);
}

TEST(MetadataSummaryTest, OneLinePerEntryThenTotals) {
  std::string text = MetadataSummary(SampleMetadata(), /*list_chunks=*/false);
  EXPECT_NE(text.find("save 00ab00000000cd01"), std::string::npos) << text;
  EXPECT_NE(text.find("written by 2 ranks"), std::string::npos) << text;
  EXPECT_NE(text.find("layer.weight  BF16 [4, 8]  2 chunks  64 B\n"), std::string::npos) << text;
  EXPECT_NE(text.find("scale         F8_E4M3 []  1 chunk  1 B\n"), std::string::npos) << text;
  EXPECT_NE(text.find("step          8 B\n"), std::string::npos) << text;
  EXPECT_NE(text.find("totals: 2 tensors, 3 chunks, 1 bytes entries, 3 files, 73 B of data in "
                      "8.0 KiB of files\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("xxh3"), std::string::npos) << text;  // no chunk lines
}

TEST(MetadataSummaryTest, ListsChunksOnRequest) {
  std::string text = MetadataSummary(SampleMetadata(), /*list_chunks=*/true);
  EXPECT_NE(text.find("    {offsets [2, 0], lengths [2, 8]}  "
                      "data-00ab00000000cd01-r00001.safetensors @128 +32  xxh3 0000000000000001\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("data-00ab00000000cd01-r00000.bytes @0 +8  xxh3 000000000000feed"),
            std::string::npos)
      << text;
}

TEST(MetadataSummaryTest, HumanSizes) {
  Metadata md;
  md.files = {{"f", uint64_t{3} << 29}};
  TensorMeta t;
  t.fqn = "big";
  t.dtype = DType::kU8;
  t.global_shape = Shape{int64_t{3} << 29};
  StoredChunk c;
  c.box = Box::Whole(t.global_shape);
  c.byte_length = uint64_t{3} << 29;
  t.chunks = {c};
  md.tensors = {t};
  std::string text = MetadataSummary(md, false);
  EXPECT_NE(text.find("big  U8 [1610612736]  1 chunk  1.5 GiB\n"), std::string::npos) << text;
  EXPECT_NE(text.find("written by 1 rank\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace dcp::metadata
