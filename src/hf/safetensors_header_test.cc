#include "hf/safetensors_header.h"

#include <gtest/gtest.h>

#include <string>

namespace dcp::hf {
namespace {

constexpr char kFile[] = "/models/x.safetensors";

std::string LengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out;
}

// A file: length prefix, `json`, `data_bytes` bytes of data.
std::string File(const std::string& json, size_t data_bytes) {
  return LengthPrefix(json.size()) + json + std::string(data_bytes, '\x5a');
}

Result<SafetensorsHeader> Parse(const std::string& file) {
  return ParseSafetensorsHeader(file, file.size(), kFile);
}

void ExpectError(const std::string& file, const std::vector<std::string>& fragments) {
  auto h = Parse(file);
  ASSERT_FALSE(h.ok()) << "parsed: " << file.substr(8);
  EXPECT_EQ(h.status().code(), StatusCode::kDataLoss) << h.status().ToString();
  EXPECT_NE(h.status().message().find(kFile), std::string::npos) << h.status().message();
  for (const std::string& f : fragments) {
    EXPECT_NE(h.status().message().find(f), std::string::npos)
        << "'" << f << "' not in: " << h.status().message();
  }
}

TEST(SafetensorsHeaderTest, ParsesAValidFileInDataOrder) {
  const std::string json = R"({"b":{"dtype":"F32","shape":[2,3],"data_offsets":[4,28]},)"
                           R"("__metadata__":{"format":"pt","note":"héllo"},)"
                           R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                           R"("s":{"dtype":"I64","shape":[],"data_offsets":[28,36]},)"
                           R"("e":{"dtype":"U8","shape":[0,5],"data_offsets":[36,36]}})";
  auto h = Parse(File(json, 36));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->tensors.size(), 4u);
  EXPECT_EQ(h->tensors[0].name, "a");
  EXPECT_EQ(h->tensors[0].dtype, DType::kBF16);
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[1].shape, (Shape{2, 3}));
  EXPECT_EQ(h->tensors[1].begin, 4u);
  EXPECT_EQ(h->tensors[1].end, 28u);
  EXPECT_EQ(h->tensors[2].name, "s");
  EXPECT_EQ(h->tensors[2].shape.rank(), 0);
  EXPECT_EQ(h->tensors[3].name, "e");
  EXPECT_EQ(h->metadata.at("format"), "pt");
  EXPECT_EQ(h->metadata.at("note"), "héllo");
  EXPECT_EQ(h->header_length, json.size());
  EXPECT_EQ(h->data_start(), 8 + json.size());
}

TEST(SafetensorsHeaderTest, AcceptsEmptyHeaderAndPadding) {
  auto h = Parse(File("{}      ", 0));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->tensors.empty());
  EXPECT_TRUE(h->metadata.empty());
}

TEST(SafetensorsHeaderTest, EveryDTypeWithWholeBytes) {
  for (int i = 0; i < kNumDTypes; ++i) {
    DType t = static_cast<DType>(i);
    uint64_t bytes = *DTypeBytes(t, 8);  // 8 elements fill whole bytes for every dtype
    std::string json = R"({"t":{"dtype":")" + std::string(DTypeName(t)) +
                       R"(","shape":[2,4],"data_offsets":[0,)" + std::to_string(bytes) + "]}}";
    auto h = Parse(File(json, bytes));
    ASSERT_TRUE(h.ok()) << DTypeName(t) << ": " << h.status().ToString();
    EXPECT_EQ(h->tensors[0].dtype, t);
  }
}

TEST(SafetensorsHeaderTest, FileShorterThanLengthPrefix) {
  ExpectError(std::string("\x02\x00\x00", 3), {"shorter than the 8-byte header length"});
}

TEST(SafetensorsHeaderTest, HeaderLengthBeyondFile) {
  ExpectError(LengthPrefix(1000) + "{}", {"header length 1000 runs beyond the end"});
}

TEST(SafetensorsHeaderTest, HeaderLengthOverCap) {
  ExpectError(LengthPrefix(kMaxHeaderBytes + 1) + "{}", {"exceeds the limit"});
  ExpectError(LengthPrefix(~uint64_t{0}) + "{}", {"exceeds the limit"});
}

TEST(SafetensorsHeaderTest, InvalidJson) {
  ExpectError(File(R"({"a":{"dtype":"F32",)", 0), {"not valid JSON"});
  ExpectError(File(R"({"a" 1})", 0), {"not valid JSON"});
  ExpectError(File("{}x", 0), {"not valid JSON"});
  ExpectError(File(std::string("{\"\xff\xfe\":{}}"), 0), {"not valid JSON"});  // not UTF-8
  ExpectError(File(R"({}/*c*/)", 0), {"not valid JSON"});
}

TEST(SafetensorsHeaderTest, WrongJsonShape) {
  ExpectError(File("[1,2]", 0), {"not a JSON object"});
  ExpectError(File(R"({"a":[1]})", 0), {"tensor 'a'", "not an object"});
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4),
              {"tensor 'a'", "unknown field 'x'"});
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[1]}})", 4),
              {"tensor 'a'", "lacks one of dtype, shape, data_offsets"});
  ExpectError(File(R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4),
              {"tensor 'a'", "twice"});
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
              {"tensor 'a'", "negative"});
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
              {"tensor 'a'", "non-integer"});
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4),
              {"tensor 'a'", "more than 2 data_offsets"});
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", 4),
              {"tensor 'a'", "1 data_offsets"});
  ExpectError(File(R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4),
              {"tensor 'a'", "a dtype string"});
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", 4),
              {"tensor 'a'", "an array"});
}

TEST(SafetensorsHeaderTest, MetadataMustBeAFlatStringMap) {
  ExpectError(File(R"({"__metadata__":{"a":{"b":"c"}}})", 0), {"flat string map"});
  ExpectError(File(R"({"__metadata__":{"a":1}})", 0), {"'a'", "not a string"});
  ExpectError(File(R"({"__metadata__":["a"]})", 0), {"__metadata__ is an array"});
  ExpectError(File(R"({"__metadata__":{"a":"1","a":"2"}})", 0), {"duplicate key 'a'"});
  ExpectError(File(R"({"__metadata__":{},"__metadata__":{}})", 0), {"duplicate", "__metadata__"});
}

TEST(SafetensorsHeaderTest, UnknownDType) {
  ExpectError(File(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16),
              {"tensor 'w'", "unknown dtype 'F128'"});
}

TEST(SafetensorsHeaderTest, DuplicateNames) {
  ExpectError(File(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                   R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                   2),
              {"tensor 'w'", "appears twice"});
}

TEST(SafetensorsHeaderTest, TooManyDimensions) {
  ExpectError(File(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1),
              {"tensor 'w'", "more than 8 dimensions"});
}

TEST(SafetensorsHeaderTest, Gap) {
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                   20),
              {"tensor 'b'", "starts at data offset 12", "ends at 8", "gap"});
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
              {"tensor 'a'", "starts at data offset 4", "gap"});
}

TEST(SafetensorsHeaderTest, Overlap) {
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                   12),
              {"tensor 'b'", "starts at data offset 4", "overlap"});
}

TEST(SafetensorsHeaderTest, WrongSize) {
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
              {"tensor 'a'", "needs 12 bytes", "span 8"});
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,0]}})", 8),
              {"tensor 'a'", "end before they begin"});
}

TEST(SafetensorsHeaderTest, SizeOverflow) {
  ExpectError(
      File(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
      {"tensor 'a'", "too many elements"});
  ExpectError(
      File(R"({"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]}})", 8),
      {"tensor 'a'", "overflows 64 bits"});
}

TEST(SafetensorsHeaderTest, SubByteDTypes) {
  // F4: two elements a byte; F6: four elements in three bytes.
  EXPECT_TRUE(Parse(File(R"({"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", 2)).ok());
  EXPECT_TRUE(
      Parse(File(R"({"a":{"dtype":"F6_E2M3","shape":[2,4],"data_offsets":[0,6]}})", 6)).ok());
  ExpectError(File(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2),
              {"tensor 'a'", "does not fill whole bytes"});
  ExpectError(File(R"({"a":{"dtype":"F6_E3M2","shape":[2],"data_offsets":[0,2]}})", 2),
              {"tensor 'a'", "does not fill whole bytes"});
}

TEST(SafetensorsHeaderTest, TrailingBytes) {
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12),
              {"4 trailing bytes"});
  ExpectError(File("{}", 3), {"3 trailing bytes"});
}

TEST(SafetensorsHeaderTest, DataBeyondFile) {
  ExpectError(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 6),
              {"tensor 'a'", "beyond the 6 data bytes"});
}

}  // namespace
}  // namespace dcp::hf
