// Saves without collectives (SaveOptions::use_collectives = false): each rank commits its
// own metadata file named by the save's step; a load uses the newest step that every rank
// committed, so a save that failed or crashed on some rank never damages the previous
// checkpoint, and rank files of two saves are never mixed.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <vector>

#include "checkpoint/names.h"
#include "checkpoint/save.h"
#include "dcp/checkpoint.h"
#include "metadata/merge.h"
#include "storage/file_system.h"
#include "test_util.h"
#include "testfs/fault_file_system.h"

namespace dcp::testing {
namespace {

constexpr int kN = 64;

// The whole tensor saved at `step`: element i is step * 1000 + i.
std::vector<float> Values(uint64_t step) {
  std::vector<float> v(kN);
  for (int i = 0; i < kN; ++i) v[i] = static_cast<float>(step * 1000 + i);
  return v;
}

// Every rank of `c` saves its half of Values(step) at `step` through `fs`.
Status SaveStep(const std::shared_ptr<Comm>& c, uint64_t step, const std::string& dir,
                storage::FileSystem& fs) {
  std::vector<float> v = Values(step);
  const int half = kN / c->size();
  StateDict sd;
  sd.add("w", TensorView(v.data() + half * c->rank(), DType::kF32, {half}),
         Chunk{{kN}, {half * c->rank()}});
  return checkpoint::Save(sd, dir, {.comm = c, .use_collectives = false, .step = step}, fs)
      .status();
}

std::vector<float> LoadWhole(const std::string& dir) {
  std::vector<float> b(kN, -1);
  StateDict whole;
  whole.add("w", TensorView(b.data(), DType::kF32, {kN}));
  load(whole, dir);
  return b;
}

TEST(SaveIndependent, RankThatFailsLeavesThePreviousStepLoadable) {
  TempDir tmp;
  RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    ASSERT_TRUE(SaveStep(c, 1, tmp.path(), storage::PosixFileSystem()).ok());
    ASSERT_TRUE(c->Barrier().ok());
    testfs::FaultFileSystem fs(storage::PosixFileSystem());
    if (c->rank() == 1) fs.FailAt(0);
    EXPECT_EQ(SaveStep(c, 2, tmp.path(), fs).ok(), c->rank() == 0);
  });
  EXPECT_TRUE(std::filesystem::exists(tmp.path() + "/" + checkpoint::RankMetadataName(2, 0)));
  EXPECT_EQ(LoadWhole(tmp.path()), Values(1));
}

TEST(SaveIndependent, CompleteNewerStepWins) {
  TempDir tmp;
  RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    ASSERT_TRUE(SaveStep(c, 1, tmp.path(), storage::PosixFileSystem()).ok());
    ASSERT_TRUE(c->Barrier().ok());
    ASSERT_TRUE(SaveStep(c, 2, tmp.path(), storage::PosixFileSystem()).ok());
  });
  EXPECT_EQ(LoadWhole(tmp.path()), Values(2));
  // Step 1's rank files are gone once step 2 is complete... or kept as the fallback only
  // while step 2 was incomplete; either way a third step still works.
  RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    ASSERT_TRUE(SaveStep(c, 3, tmp.path(), storage::PosixFileSystem()).ok());
  });
  EXPECT_EQ(LoadWhole(tmp.path()), Values(3));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/" + checkpoint::RankMetadataName(1, 0)));
}

// A step over a checkpoint saved with collectives: the global file stays the fallback.
TEST(SaveIndependent, IncompleteStepFallsBackToTheGlobalMetadata) {
  TempDir tmp;
  RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    std::vector<float> v = Values(7);
    StateDict sd;
    sd.add("w", TensorView(v.data() + 32 * c->rank(), DType::kF32, {32}),
           Chunk{{kN}, {32 * c->rank()}});
    ASSERT_NO_THROW(save(sd, tmp.path(), {.comm = c}));
    ASSERT_TRUE(c->Barrier().ok());
    testfs::FaultFileSystem fs(storage::PosixFileSystem());
    if (c->rank() == 0) fs.FailAt(0);
    EXPECT_EQ(SaveStep(c, 8, tmp.path(), fs).ok(), c->rank() == 1);
  });
  EXPECT_EQ(LoadWhole(tmp.path()), Values(7));
  RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    ASSERT_TRUE(SaveStep(c, 9, tmp.path(), storage::PosixFileSystem()).ok());
  });
  EXPECT_EQ(LoadWhole(tmp.path()), Values(9));
}

// A crash at every storage operation of a 2-rank step-2 save (ranks one after the other,
// in both orders, so that every operation of each rank is a crash point): the directory
// always loads exactly step 1 or exactly step 2, never a mix; a later step still works.
TEST(SaveIndependent, CrashAtEveryStepLoadsOneWholeStep) {
  for (int first : {0, 1}) {
    int loaded_new = 0;
    for (int64_t n = 0;; ++n) {
      TempDir tmp;
      RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
        ASSERT_TRUE(SaveStep(c, 1, tmp.path(), storage::PosixFileSystem()).ok());
      });
      testfs::FaultFileSystem fs(storage::PosixFileSystem());
      fs.FailAt(n);
      std::atomic<int> ok{0};
      RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
        for (int turn : {first, 1 - first}) {
          if (c->rank() == turn && SaveStep(c, 2, tmp.path(), fs).ok()) ++ok;
          ASSERT_TRUE(c->Barrier().ok());
        }
      });
      fs.SimulateCrash();
      const std::string at =
          "crash at operation " + std::to_string(n) + ", rank " + std::to_string(first) + " first";
      std::vector<float> got;
      ASSERT_NO_THROW(got = LoadWhole(tmp.path())) << at;
      EXPECT_TRUE(got == Values(1) || got == Values(2)) << at;
      if (got == Values(2)) ++loaded_new;
      RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
        ASSERT_TRUE(SaveStep(c, 3, tmp.path(), storage::PosixFileSystem()).ok());
      });
      EXPECT_EQ(LoadWhole(tmp.path()), Values(3)) << at;
      if (ok == 2 && fs.ops() <= n) break;  // the save finished before the crash point
      ASSERT_LT(n, 1000) << "save never finished";
    }
    EXPECT_GE(loaded_new, 1);
  }
}

// Rank files are told apart by their step: a rank saving a step it already committed (the
// default step 0 twice, or a restart re-saving a step) could leave a set mixing two saves,
// so it is refused and the committed set stays as it was.
TEST(SaveIndependent, ResavingAStepIsRefused) {
  TempDir tmp;
  RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    ASSERT_TRUE(SaveStep(c, 2, tmp.path(), storage::PosixFileSystem()).ok());
  });
  RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    for (uint64_t step : {2, 1}) {
      const Status s = SaveStep(c, step, tmp.path(), storage::PosixFileSystem());
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
      EXPECT_NE(s.message().find("already committed step 2"), std::string::npos) << s.ToString();
    }
  });
  EXPECT_EQ(LoadWhole(tmp.path()), Values(2));
}

// Chunks longer than one checksum block: the merged rank files keep their block checksums
// (the set's block size comes with them), so a load, a partial load and verify all work.
TEST(SaveIndependent, ChunksOfManyChecksumBlocksLoadAndVerify) {
  TempDir tmp;
  constexpr int64_t kRows = 1024, kCols = 1024;  // 4 MiB of f32 per rank: 4 blocks
  RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    std::vector<float> v(kRows * kCols);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(c->rank() * 7 + i % 1000);
    StateDict sd;
    sd.add("w", TensorView(v.data(), DType::kF32, {kRows, kCols}),
           Chunk{{2 * kRows, kCols}, {kRows * c->rank(), 0}});
    ASSERT_TRUE(checkpoint::Save(sd, tmp.path(), {.comm = c, .use_collectives = false, .step = 1},
                                 storage::PosixFileSystem())
                    .ok());
  });
  const Metadata md = read_metadata(tmp.path());
  EXPECT_GT(md.block_size, 0u);
  ASSERT_EQ(md.tensors.size(), 1u);
  for (const auto& ch : md.tensors[0].chunks) EXPECT_EQ(ch.block_xxh3.size(), 4u);
  EXPECT_EQ(verify(tmp.path()).chunks, 2u);
  // A part of rank 1's rows only (a partial read of its stored chunk).
  std::vector<float> part(16 * kCols, -1);
  StateDict sd;
  sd.add("w", TensorView(part.data(), DType::kF32, {16, kCols}),
         Chunk{{2 * kRows, kCols}, {kRows + 100, 0}});
  load(sd, tmp.path());
  for (int64_t r = 0; r < 16; ++r) {
    for (int64_t k = 0; k < kCols; k += 97) {
      const size_t src = static_cast<size_t>((100 + r) * kCols + k);
      ASSERT_EQ(part[static_cast<size_t>(r * kCols + k)], static_cast<float>(7 + src % 1000));
    }
  }
}

TEST(SaveIndependent, RankMetadataNames) {
  uint64_t step = 0;
  bool legacy = true;
  EXPECT_EQ(checkpoint::RankMetadataName(12, 3), "dcp.metadata.step12.rank3");
  EXPECT_EQ(checkpoint::ParseRankMetadataName("dcp.metadata.step12.rank3", &step, &legacy), 3);
  EXPECT_EQ(step, 12u);
  EXPECT_FALSE(legacy);
  EXPECT_EQ(checkpoint::ParseRankMetadataName("dcp.metadata.rank5", &step, &legacy), 5);
  EXPECT_TRUE(legacy);
  EXPECT_EQ(checkpoint::ParseRankMetadataName("dcp.metadata.step12.rank3.tmp-00"), -1);
  EXPECT_EQ(checkpoint::ParseRankMetadataName("dcp.metadata.stepx.rank3"), -1);
  EXPECT_EQ(checkpoint::ParseRankMetadataName("dcp.metadata.tmp-0123"), -1);
}

}  // namespace
}  // namespace dcp::testing
