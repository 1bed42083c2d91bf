// Issue 20 item 6: one metadata builder. The metadata `dcp simulate` builds for a job (the
// files laid out as the writers would, without data) is, checksum values aside, byte for byte
// the metadata a real save of that job commits: same files and sizes, offsets, chunks and
// number of block checksums.
#include "checkpoint/write_results.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "checkpoint/metadata_io.h"
#include "checkpoint/save.h"
#include "metadata/codec.h"
#include "planner/plan_classes.h"
#include "planner/save_plan.h"
#include "storage/file_system.h"
#include "test_util.h"

namespace dcp {
namespace {

// Checksum values are data; everything else must agree.
std::string WithoutChecksums(metadata::Metadata md) {
  for (auto& t : md.tensors) {
    for (auto& c : t.chunks) {
      c.xxh3 = 0;
      for (uint64_t& h : c.block_xxh3) h = 0;
    }
  }
  for (auto& b : md.bytes) b.xxh3 = 0;
  return metadata::Encode(md);
}

TEST(WriteResults, SimulatedMetadataIsTheSavedMetadata) {
  testing::TempDir tmp;
  constexpr int kWorld = 3;
  // Per rank: a row shard of "w" (rank 2's 1.5 MiB: block checksums), a replicated "norm"
  // (deduplicated: one writer), two chunks of "pair" on rank 0 (two keys in one file), a small
  // "x_tail" after rank 2's large chunk in plan order (tensors go by name; stored before it),
  // and a bytes entry on every rank.
  std::vector<std::vector<float>> w(kWorld), norm(kWorld), pair(kWorld), tail(kWorld);
  std::vector<StateDict> sds(kWorld);
  std::mutex mu;
  std::vector<std::string> encoded_plans(kWorld);
  testing::RunRanks(kWorld, [&](const std::shared_ptr<Comm>& comm) {
    const int r = comm->rank();
    const int64_t rows = r == 2 ? 1536 : 16;  // rows of 1 KiB
    w[r].assign(static_cast<size_t>(rows) * 256, 1.0f + r);
    norm[r].assign(64, 0.5f);
    StateDict sd;
    const int64_t offset = r == 0 ? 0 : r == 1 ? 16 : 32;
    sd.add("w", TensorView(w[r].data(), DType::kF32, Shape{rows, 256}),
           Chunk{Shape{1568, 256}, {offset, 0}});
    sd.add("norm", TensorView(norm[r].data(), DType::kF32, Shape{64}));
    if (r == 0) {
      pair[r].assign(8, 2.0f);
      sd.add("pair", TensorView(pair[r].data(), DType::kF32, Shape{4}), Chunk{Shape{8}, {0}});
      sd.add("pair", TensorView(pair[r].data() + 4, DType::kF32, Shape{4}), Chunk{Shape{8}, {4}});
    }
    if (r == 2) {
      tail[r].assign(16, 3.0f);
      sd.add("x_tail", TensorView(tail[r].data(), DType::kF32, Shape{16}));
    }
    sd.add_bytes("extra/" + std::to_string(r), "rank " + std::to_string(r));
    auto local = planner::BuildLocalSavePlan(sd);
    ASSERT_TRUE(local.ok()) << local.status().ToString();
    {
      std::lock_guard lock(mu);
      encoded_plans[r] = planner::EncodeLocalPlan(*local);
    }
    auto saved = checkpoint::Save(sd, tmp.path(), {.comm = comm}, storage::PosixFileSystem());
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  });
  auto real = checkpoint::ReadMetadata(storage::PosixFileSystem(), tmp.path());
  ASSERT_TRUE(real.ok()) << real.status().ToString();

  // The global plan as save builds it, from the local plans grouped by hash.
  std::vector<uint64_t> hashes;
  for (const auto& e : encoded_plans) hashes.push_back(planner::PlanHash(e));
  const planner::PlanClasses classes = planner::GroupByPlanHash(hashes);
  std::vector<planner::LocalSavePlan> distinct;
  for (const auto& holders : classes.holders) {
    distinct.push_back(*planner::DecodeLocalPlan(encoded_plans[holders.front()]));
  }
  auto plan = planner::PlanSave(distinct, classes.holders, kWorld);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto simulated = checkpoint::BuildMetadata(
      *plan, real->save_id, checkpoint::LayOutWrites(*plan, kWorld, metadata::kChecksumBlockSize),
      kWorld);
  ASSERT_TRUE(simulated.ok()) << simulated.status().ToString();
  bool blocks = false;
  for (const auto& t : real->tensors) {
    for (const auto& c : t.chunks) blocks = blocks || !c.block_xxh3.empty();
  }
  EXPECT_TRUE(blocks) << "the job should have a chunk with block checksums";
  EXPECT_EQ(WithoutChecksums(*simulated), WithoutChecksums(*real));
  EXPECT_EQ(metadata::Encode(*simulated).size(), metadata::Encode(*real).size());
  // Rank 2's file stores its small chunk first, right after the header, the large one after it.
  const metadata::StoredChunk& small = real->FindTensor("x_tail")->chunks.at(0);
  const metadata::StoredChunk* large = nullptr;
  for (const auto& c : real->FindTensor("w")->chunks) {
    if (c.file == small.file) large = &c;
  }
  ASSERT_NE(large, nullptr);
  EXPECT_EQ(large->byte_offset, small.byte_offset + small.byte_length);
}

// The stored order: chunks under kSmallChunkBytes first, then the rest, each in the order given.
TEST(WriteResults, SmallChunksAreStoredFirstInTheirOrder) {
  const uint64_t small = storage::kSmallChunkBytes - 1, large = storage::kSmallChunkBytes;
  const std::vector<uint64_t> sizes{large, 8, large + 5, 0, small, large};
  EXPECT_EQ(storage::StoredOrder(sizes), (std::vector<size_t>{1, 3, 4, 0, 2, 5}));
  EXPECT_TRUE(storage::StoredOrder(std::vector<uint64_t>{}).empty());
}

}  // namespace
}  // namespace dcp
