#include "hf/torch_hf_format.h"

#include <gtest/gtest.h>

namespace dcp::hf {
namespace {

TEST(TorchHfFormatTest, FileNamesAreTorchs) {
  EXPECT_EQ(TorchHfFileName(2, 5), "model-00002-of-00005.safetensors");
  EXPECT_EQ(TorchHfFileName(1, 1, 3), "shard-00003-model-00001-of-00001.safetensors");
  EXPECT_EQ(TorchHfFileName(1, 123456), "model-00001-of-123456.safetensors");
  EXPECT_TRUE(IsTorchHfFileName("model-00002-of-00005.safetensors"));
  EXPECT_TRUE(IsTorchHfFileName("shard-00003-model-00001-of-00001.safetensors"));
  EXPECT_TRUE(IsTorchHfFileName("model-00001-of-123456.safetensors"));
  EXPECT_FALSE(IsTorchHfFileName("model.safetensors"));
  EXPECT_FALSE(IsTorchHfFileName("data-1-r0.safetensors"));
  EXPECT_FALSE(IsTorchHfFileName("model-0001-of-00005.safetensors"));
  EXPECT_FALSE(IsTorchHfFileName("shard-00001-model-00001-of-00001.safetensors.tmp"));
  EXPECT_FALSE(IsTorchHfFileName("shard-1-model-00001-of-00001.safetensors"));
}

// Python: json.dumps(s) for each.
TEST(TorchHfFormatTest, StringsAreEscapedAsPythonsJsonDoes) {
  EXPECT_EQ(PyJsonString("a.b"), R"("a.b")");
  EXPECT_EQ(PyJsonString("q\"b\\s/"), R"("q\"b\\s/")");
  EXPECT_EQ(PyJsonString("\n\t\r\b\f\x01\x7f"), R"("\n\t\r\b\f\u0001\u007f")");
  EXPECT_EQ(PyJsonString("\xc3\xa9"), R"("\u00e9")");                // é
  EXPECT_EQ(PyJsonString("\xe2\x82\xac"), R"("\u20ac")");            // €
  EXPECT_EQ(PyJsonString("\xf0\x9f\x98\x80"), R"("\ud83d\ude00")");  // 😀
  EXPECT_EQ(PyJsonString("\xff"), R"("\ufffd")");                    // not UTF-8
  EXPECT_EQ(PyJsonString("\xc3"), R"("\ufffd")");                    // cut short
}

TEST(TorchHfFormatTest, SafetensorsOrdersByDtypeWidestFirstThenName) {
  // As safetensors 0.8 serializes: U64 I64 F64 C64 F32 U32 I32 BF16 F16 U16 I16 F8_E8M0
  // F8_E4M3 F8_E5M2 I8 U8 F4 BOOL.
  const DType order[] = {
      DType::kU64,     DType::kI64,     DType::kF64, DType::kC64, DType::kF32, DType::kU32,
      DType::kI32,     DType::kBF16,    DType::kF16, DType::kU16, DType::kI16, DType::kF8_E8M0,
      DType::kF8_E4M3, DType::kF8_E5M2, DType::kI8,  DType::kU8,  DType::kF4,  DType::kBool};
  for (size_t i = 0; i + 1 < std::size(order); ++i) {
    EXPECT_TRUE(SafetensorsOrderLess(order[i], "z", order[i + 1], "a")) << i;
    EXPECT_FALSE(SafetensorsOrderLess(order[i + 1], "a", order[i], "z")) << i;
  }
  EXPECT_TRUE(SafetensorsOrderLess(DType::kF32, "a", DType::kF32, "b"));
  EXPECT_FALSE(SafetensorsOrderLess(DType::kF32, "b", DType::kF32, "a"));
}

// Expected orders printed by CPython 3.11: `s = set(); [s.add(x) for x in c]; list(s)`.
TEST(TorchHfFormatTest, PythonSetOrderIsCPythons) {
  const std::vector<std::pair<std::vector<int>, std::vector<int>>> cases = {
      {{7, 15}, {15, 7}},
      {{1, 8}, {8, 1}},
      {{0, 4, 8, 12}, {0, 8, 4, 12}},
      {{3, 11}, {11, 3}},
      {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
       {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}},
      {{0, 8, 16, 24, 32}, {0, 32, 8, 16, 24}},
      {{5, 13, 21, 29, 37, 45, 53, 61}, {37, 5, 13, 45, 61, 21, 53, 29}},
      {{100, 107, 114, 121, 128, 135}, {128, 100, 135, 107, 114, 121}},
      {{2, 10, 18, 26, 34, 42, 50, 58, 66, 74, 82, 90, 98, 106, 114, 122},
       {2, 34, 58, 66, 90, 98, 122, 10, 42, 74, 106, 18, 50, 82, 114, 26}},
  };
  for (const auto& [added, order] : cases) {
    EXPECT_EQ(PythonSetOrder(added), order) << ::testing::PrintToString(added);
  }
}

TEST(TorchHfFormatTest, ShardingInfoIsPythonJson) {
  EXPECT_EQ(ShardingInfoJson({{"b.weight", Shape{4, 0}}, {"\xc3\xa9", Shape{}}}),
            R"({"b.weight": {"saved_offsets": [4, 0]}, "\u00e9": {"saved_offsets": []}})");
  EXPECT_EQ(ShardingInfoJson({}), "{}");
}

TEST(TorchHfFormatTest, ConsolidatedHeaderIsTorchs) {
  const std::string h = TorchConsolidatedHeader(
      {{"w", DType::kF32, Shape{2, 3}, 24}, {"s", DType::kBF16, Shape{}, 2}});
  const std::string json = R"({"w": {"shape": [2, 3], "dtype": "F32", "data_offsets": [0, 24]}, )"
                           R"("s": {"shape": [], "dtype": "BF16", "data_offsets": [24, 26]}})";
  ASSERT_EQ(h.size(), 8 + json.size());
  EXPECT_EQ(static_cast<unsigned char>(h[0]), json.size());
  EXPECT_EQ(h.substr(1, 7), std::string(7, '\0'));
  EXPECT_EQ(h.substr(8), json);  // no padding: torch writes none
}

TEST(TorchHfFormatTest, IndexIsJsonDumpWithIndentTwo) {
  EXPECT_EQ(TorchIndexJson(26, {{"w", "model-00001-of-00002.safetensors"},
                                {"s", "model-00002-of-00002.safetensors"}}),
            "{\n  \"metadata\": {\n    \"total_size\": 26\n  },\n  \"weight_map\": {\n"
            "    \"w\": \"model-00001-of-00002.safetensors\",\n"
            "    \"s\": \"model-00002-of-00002.safetensors\"\n  }\n}");
  EXPECT_EQ(TorchIndexJson(0, {}),
            "{\n  \"metadata\": {\n    \"total_size\": 0\n  },\n  \"weight_map\": {}\n}");
}

}  // namespace
}  // namespace dcp::hf
