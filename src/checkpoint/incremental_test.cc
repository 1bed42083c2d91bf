// Incremental saves as pure functions: which bases are allowed, the byte-equality rule, and
// how write reports with references become metadata.
#include "checkpoint/incremental.h"

#include <gtest/gtest.h>

#include "checkpoint/incremental_copy.h"
#include "checkpoint/write_results.h"
#include "core/checksum.h"
#include "metadata/codec.h"
#include "storage/data_files.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {
namespace {

TEST(Incremental, TheBaseIsASiblingOfTheCheckpoint) {
  EXPECT_TRUE(CheckIncrementalBase("/ckpt/step_2", "/ckpt/step_1").ok());
  EXPECT_TRUE(CheckIncrementalBase("/ckpt/step_2/", "/ckpt//step_1").ok());
  EXPECT_TRUE(CheckIncrementalBase("step_2", "step_1").ok());
  EXPECT_TRUE(CheckIncrementalBase("s3://b/run/step_2", "s3://b/run/step_1").ok());
  for (auto [dir, base] : std::vector<std::pair<std::string, std::string>>{
           {"/ckpt/step_2", "/other/step_1"},   // another parent
           {"/ckpt/step_2", "/ckpt/a/step_1"},  // below a sibling
           {"/ckpt/step_2", "/ckpt/step_2"},    // itself
           {"/ckpt/step_2", "ckpt/step_1"},     // relative against absolute
           {"s3://b/step_2", "s3://c/step_2"},  // another bucket
           {"s3://b", "s3://c"},                // buckets have no siblings
           {"/ckpt/step_2", "/ckpt/.."}}) {
    Status s = CheckIncrementalBase(dir, base);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << dir << " <- " << base;
    EXPECT_NE(s.message().find("incremental base " + base), std::string::npos) << s.message();
  }
}

TEST(Incremental, PathsSplitIntoParentAndName) {
  EXPECT_EQ(storage::ParentPath("/a/b/"), "/a");
  EXPECT_EQ(storage::LastComponent("/a/b/"), "b");
  EXPECT_EQ(storage::ParentPath("/b"), "/");
  EXPECT_EQ(storage::ParentPath("b"), "");
  EXPECT_EQ(storage::LastComponent("b"), "b");
  EXPECT_EQ(storage::ParentPath("s3://bucket/run/step"), "s3://bucket/run");
  EXPECT_EQ(storage::ParentPath("s3://bucket/step"), "s3://bucket");
  EXPECT_EQ(storage::ParentPath("s3://bucket"), "");
  EXPECT_EQ(storage::LastComponent("s3://bucket"), "");
}

// Bytes are the same when every block checksum is; a chunk of one block has one checksum.
TEST(Incremental, SameBytesComparesEveryBlockAndStopsAtTheFirstThatDiffers) {
  const uint64_t block = 4096;
  std::vector<std::byte> data(3 * block + 100);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 7);
  metadata::StoredChunk c;
  c.byte_length = data.size();
  StreamHasher h(block);
  h.Update(data);
  c.xxh3 = h.Finish(&c.block_xxh3);
  ASSERT_EQ(c.block_xxh3.size(), 4u);
  EXPECT_TRUE(SameBytes(c, block, data));
  for (size_t at : {size_t{0}, block + 5, data.size() - 1}) {
    auto changed = data;
    changed[at] ^= std::byte{1};
    EXPECT_FALSE(SameBytes(c, block, changed)) << at;
  }
  EXPECT_FALSE(SameBytes(c, block, std::span(data).first(data.size() - 1)));
  metadata::StoredChunk small;
  small.byte_length = 100;
  small.xxh3 = Xxh3(std::span(data).first(100));
  EXPECT_TRUE(SameBytes(small, block, std::span(data).first(100)));
  EXPECT_FALSE(SameBytes(small, block, std::span(data).subspan(1, 100)));
}

// Two ranks; rank 0 writes one chunk and leaves one in the base; rank 1 leaves its only chunk
// in a file the base itself referenced. The metadata lists each base file once, after the
// checkpoint's own, and keeps every reference's range and checksums.
TEST(Incremental, ReferencesBecomeFilesOfTheirBases) {
  planner::GlobalSavePlan plan;
  plan.tensors.push_back({"a", DType::kU8, Shape{30}, {}, ""});
  plan.tensors[0].chunks = {{Box{Shape{0}, Shape{10}}, 10, 0},
                            {Box{Shape{10}, Shape{10}}, 10, 0},
                            {Box{Shape{20}, Shape{10}}, 10, 1}};
  std::vector<Written> written(2);
  written[0].tensors.size = 120;
  written[0].tensors.ranges = {{100, 10, 0x11, {}}};
  written[0].reused = {{1, {"data-b-r00000.safetensors", 500, "step_1"}, 300, 10, 0x22, {}}};
  written[1].reused = {{0, {"data-c-r00003.safetensors", 700, "step_0"}, 600, 10, 0x33, {}}};
  auto md = BuildMetadata(plan, 0xabc, written, 2);
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  ASSERT_EQ(md->files.size(), 3u);
  EXPECT_EQ(md->files[0].base, "");
  EXPECT_EQ(md->files[1].base, "step_1");
  EXPECT_EQ(md->files[2].base, "step_0");
  const auto& chunks = md->tensors[0].chunks;
  EXPECT_EQ(chunks[0].file, 0u);
  EXPECT_EQ(chunks[0].byte_offset, 100u);
  EXPECT_EQ(chunks[1].file, 1u);
  EXPECT_EQ(chunks[1].byte_offset, 300u);
  EXPECT_EQ(chunks[1].xxh3, 0x22u);
  EXPECT_EQ(chunks[2].file, 2u);
  EXPECT_EQ(chunks[2].xxh3, 0x33u);
  // The report survives the trip to rank 0.
  auto back = DecodeWritten(EncodeWritten(written[0]));
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->reused.size(), 1u);
  EXPECT_EQ(back->reused[0].file.base, "step_1");
  EXPECT_EQ(back->reused[0].byte_offset, 300u);
  // A reference to a chunk the rank did not plan is refused.
  written[1].reused[0].index = 1;
  EXPECT_FALSE(BuildMetadata(plan, 0xabc, written, 2).ok());
}

// Checking on several threads finds what checking one chunk at a time finds.
TEST(Incremental, FindAllOnThreadsAgreesWithFind) {
  const uint64_t chunk = uint64_t{6} << 20;  // 6 blocks each
  const int n = 12;
  std::vector<std::byte> data(chunk * n);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>((i * 131) >> 3);
  metadata::Metadata md;
  md.block_size = metadata::kChecksumBlockSize;
  md.files = {{"data-0000000000000001-r00000.safetensors", chunk * n + 64, {}}};
  metadata::TensorMeta t{"w", DType::kU8, Shape{static_cast<int64_t>(chunk) * n}, {}, ""};
  for (int c = 0; c < n; ++c) {
    metadata::StoredChunk sc;
    sc.box = Box{Shape{static_cast<int64_t>(chunk) * c}, Shape{static_cast<int64_t>(chunk)}};
    sc.byte_offset = 64 + chunk * c;
    sc.byte_length = chunk;
    StreamHasher h(md.block_size);
    h.Update(std::span(data).subspan(chunk * c, chunk));
    sc.xxh3 = h.Finish(&sc.block_xxh3);
    t.chunks.push_back(std::move(sc));
  }
  md.tensors.push_back(t);
  auto base = BaseChunks::Decode(metadata::Encode(md), "/r/step_2", "/r/step_1");
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  for (int c : {1, 5, 6, 11}) data[chunk * c + chunk / 2] ^= std::byte{1};  // changed chunks
  const std::string fqn = "w";
  std::vector<BaseChunks::Chunk> check;
  for (int c = 0; c < n; ++c) {
    check.push_back(
        {&fqn, DType::kU8, &t.chunks[c].box, std::span(data).subspan(chunk * c, chunk)});
  }
  const auto one = base->FindAll(check, 1), four = base->FindAll(check, 4);
  ASSERT_EQ(one.size(), static_cast<size_t>(n));
  for (int c = 0; c < n; ++c) {
    const bool changed = c == 1 || c == 5 || c == 6 || c == 11;
    EXPECT_EQ(one[c].has_value(), !changed) << c;
    EXPECT_EQ(four[c].has_value(), !changed) << c;
    if (one[c] && four[c]) {
      EXPECT_EQ(four[c]->byte_offset, one[c]->byte_offset);
      EXPECT_EQ(four[c]->file.base, "step_1");
    }
  }
}

}  // namespace
}  // namespace dcp::checkpoint

namespace dcp::checkpoint {
namespace {

metadata::StoredChunk Chunk(int64_t row, uint32_t file, uint64_t offset, uint64_t xxh3) {
  metadata::StoredChunk c;
  c.box = Box{{row, 0}, {1, 4}};
  c.file = file;
  c.byte_offset = offset;
  c.byte_length = 16;
  c.xxh3 = xxh3;
  return c;
}

// A copy of a committed checkpoint against a base: chunks with the base's checksums become
// references, each file keeps the rest at offsets behind a new header (keys as the metadata
// implies them), a file left empty is dropped, and a file of bytes entries is copied whole.
TEST(Incremental, ACopyReferencesWhatTheBaseRecordedAndCutsTheFiles) {
  metadata::Metadata src;
  src.block_size = metadata::kChecksumBlockSize;
  src.files = {
      {"data-r0.safetensors", 200, ""}, {"data-r1.safetensors", 100, ""}, {"bytes-r0", 8, ""}};
  src.tensors = {{"a", DType::kF32, Shape{2, 4}, {Chunk(0, 0, 80, 11), Chunk(1, 0, 96, 12)}, ""},
                 {"b", DType::kF32, Shape{1, 4}, {Chunk(0, 0, 112, 13)}, ""},
                 {"c", DType::kF32, Shape{1, 4}, {Chunk(0, 1, 80, 14)}, ""}};
  src.bytes = {{"step", 2, 0, 8, 99, ""}};
  metadata::Metadata base = src;
  base.files = {{"old-r0.safetensors", 800, ""}, {"old-r1.safetensors", 800, "step_0"}};
  base.tensors[0].chunks[0].file = 1;  // itself a reference into step_0
  base.tensors[0].chunks[0].byte_offset = 500;
  base.tensors[0].chunks[1].xxh3 = 99;  // changed since
  base.tensors[1].chunks[0].xxh3 = 98;  // changed
  base.tensors[2].chunks[0].file = 0;
  base.tensors[2].chunks[0].byte_offset = 700;
  base.bytes.clear();
  auto chunks = BaseChunks::Decode(metadata::Encode(base), "/r/step_2", "/r/step_1");
  ASSERT_TRUE(chunks.ok()) << chunks.status().message();

  const IncrementalCopy copy = PlanIncrementalCopy(src, *chunks);
  EXPECT_EQ(copy.chunks_referenced, 2u);
  EXPECT_EQ(copy.bytes_referenced, 32u);
  ASSERT_EQ(copy.files.size(), 3u);
  EXPECT_EQ(copy.files[0].kind, FileCopy::Kind::kSubset);
  EXPECT_EQ(copy.files[1].kind, FileCopy::Kind::kNone);
  EXPECT_EQ(copy.files[2].kind, FileCopy::Kind::kWhole);
  // a's second chunk and b, in the source's order, under the keys verify expects.
  storage::SafetensorsHeader h;
  h.Add("a", DType::kF32, Shape{1, 4}, 16);
  h.Add("b", DType::kF32, Shape{1, 4}, 16);
  const std::string header = std::move(h).Finish();
  EXPECT_EQ(copy.files[0].header, header);
  ASSERT_EQ(copy.files[0].kept.size(), 2u);
  EXPECT_EQ(copy.files[0].kept[0], &src.tensors[0].chunks[1]);

  const metadata::Metadata& md = copy.md;
  ASSERT_EQ(md.files.size(), 4u);
  EXPECT_EQ(md.files[0].name, "data-r0.safetensors");
  EXPECT_EQ(md.files[0].size, header.size() + 32);
  EXPECT_EQ(md.files[1].name, "bytes-r0");
  // References resolved to where the bytes are: a's first chunk into step_0, c into step_1.
  const auto& a0 = md.tensors[0].chunks[0];
  EXPECT_EQ(md.files[a0.file].base, "step_0");
  EXPECT_EQ(md.files[a0.file].name, "old-r1.safetensors");
  EXPECT_EQ(a0.byte_offset, 500u);
  const auto& c0 = md.tensors[2].chunks[0];
  EXPECT_EQ(md.files[c0.file].base, "step_1");
  EXPECT_EQ(c0.byte_offset, 700u);
  EXPECT_EQ(md.tensors[0].chunks[1].file, 0u);
  EXPECT_EQ(md.tensors[0].chunks[1].byte_offset, header.size());
  EXPECT_EQ(md.tensors[1].chunks[0].byte_offset, header.size() + 16);
  EXPECT_EQ(md.bytes[0].file, 1u);
  // It encodes (version 4) and decodes as it is.
  auto back = metadata::Decode(metadata::Encode(md, metadata::VersionFor(md)));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(metadata::Encode(*back), metadata::Encode(md));

  // Without checksums in the source nothing is referenced.
  metadata::Metadata unchecked = src;
  unchecked.has_checksums = false;
  EXPECT_EQ(PlanIncrementalCopy(unchecked, *chunks).chunks_referenced, 0u);
}

}  // namespace
}  // namespace dcp::checkpoint
