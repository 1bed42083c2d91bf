// Incremental saves through the real file system: bad bases refused on every rank, a crash at
// any operation leaves every earlier checkpoint loadable, and a base saved over in place keeps
// the files its referrers need.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/metadata_io.h"
#include "checkpoint/save.h"
#include "core/checksum.h"
#include "dcp/checkpoint.h"
#include "metadata/codec.h"
#include "storage/file_system.h"
#include "test_util.h"
#include "testfs/fault_file_system.h"

namespace dcp {
namespace {

using testing::TempDir;

// A frozen tensor and a trained one, their values set by `frozen` and `trained`.
struct Small {
  std::vector<float> frozen = std::vector<float>(64 * 1024), trained = std::vector<float>(256);
  StateDict sd;
  explicit Small(float f = 1, float t = 2) {
    Set(f, t);
    sd.add("frozen", TensorView(frozen.data(), DType::kF32, Shape{64, 1024}));
    sd.add("trained", TensorView(trained.data(), DType::kF32, Shape{256}));
  }
  void Set(float f, float t) {
    for (size_t i = 0; i < frozen.size(); ++i) frozen[i] = f + static_cast<float>(i);
    for (size_t i = 0; i < trained.size(); ++i) trained[i] = t * static_cast<float>(i);
  }
  ::testing::AssertionResult Loads(const std::string& dir, float f, float t) {
    Small got(-1, -1), want(f, t);
    try {
      load(got.sd, dir);
    } catch (const Error& e) {
      return ::testing::AssertionFailure() << dir << ": " << e.what();
    }
    if (got.frozen != want.frozen || got.trained != want.trained) {
      return ::testing::AssertionFailure() << dir << " holds other values";
    }
    return ::testing::AssertionSuccess();
  }
};

TEST(IncrementalSave, BadBasesAreRefusedBeforeAnyWrite) {
  TempDir d;
  Small s;
  save(s.sd, d.Sub("a"));
  auto refused = [&](const std::string& dir, SaveOptions o, const std::string& says,
                     bool fresh = true) {
    try {
      save(s.sd, dir, o);
      ADD_FAILURE() << "accepted: " << o.incremental_base;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
    if (fresh) EXPECT_FALSE(std::filesystem::exists(dir)) << dir;  // not even created
  };
  refused(d.Sub("b"), {.incremental_base = d.Sub("missing")}, "incremental base");
  refused(d.Sub("x/b"), {.incremental_base = d.Sub("a")}, "sibling");
  refused(d.Sub("a"), {.incremental_base = d.Sub("a")}, "its own base", /*fresh=*/false);
  EXPECT_TRUE(Small().Loads(d.Sub("a"), 1, 2));
  refused(d.Sub("b"), {.use_collectives = false, .step = 1, .incremental_base = d.Sub("a")},
          "collectives");
  refused(d.Sub("b"), {.per_host_directory = true, .incremental_base = d.Sub("a")}, "per-host");
  // Every rank gets the error when the base is missing (rank 0 reads it, before it creates
  // the directory), and when ranks name different bases.
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& comm) {
    Small mine;
    EXPECT_THROW(save(mine.sd, d.Sub("c"), {.comm = comm, .incremental_base = d.Sub("nope")}),
                 Error);
  });
  EXPECT_FALSE(std::filesystem::exists(d.Sub("c")));
  // Different bases are found in the first exchange, after rank 0 made and locked the
  // directory: nothing is written into it.
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& comm) {
    Small mine;
    const std::string other = comm->rank() == 0 ? d.Sub("a") : std::string();
    try {
      save(mine.sd, d.Sub("c"), {.comm = comm, .incremental_base = other});
      ADD_FAILURE() << "ranks with different bases saved";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("different incremental bases"), std::string::npos)
          << e.what();
    }
  });
  EXPECT_TRUE(testing::ListFiles(d.Sub("c")).empty());
}

// A crash at every storage operation of an incremental save: the base stays loadable, and the
// directory holds exactly the checkpoint it held before or the new one (the new one when the
// save returned), never a mix.
TEST(IncrementalSave, CrashAtEveryOperationLosesNothing) {
  auto run = [](int64_t fail_at, int64_t* ops) {
    TempDir d;
    Small s(1, 2);
    save(s.sd, d.Sub("base"));
    s.Set(1, 3);
    save(s.sd, d.Sub("next"));  // what "next" held before
    s.Set(1, 4);
    testfs::FaultFileSystem fs(storage::PosixFileSystem());
    fs.FailAt(fail_at);
    SaveOptions o;
    o.incremental_base = d.Sub("base");
    const bool saved = checkpoint::Save(s.sd, d.Sub("next"), o, fs).ok();
    fs.SimulateCrash();
    if (ops) *ops = fs.ops();
    const std::string where = "failing at operation " + std::to_string(fail_at);
    EXPECT_TRUE(Small().Loads(d.Sub("base"), 1, 2)) << where;
    // A failure after the commit point leaves the new checkpoint; before it, the old one.
    EXPECT_TRUE(Small().Loads(d.Sub("next"), 1, 4) ||
                (!saved && Small().Loads(d.Sub("next"), 1, 3)))
        << where;
  };
  int64_t total = 0;
  run(-1, &total);
  ASSERT_GT(total, 5);
  for (int64_t k = 0; k < total; ++k) run(k, nullptr);
}

// Saving a base over in place removes only what no sibling references: the referrer still
// loads; once the referrer is gone, the next save over the base collects the rest.
TEST(IncrementalSave, ABaseSavedOverKeepsWhatItsReferrersNeed) {
  TempDir d;
  Small s(1, 2);
  save(s.sd, d.Sub("a"));
  s.Set(1, 3);
  const SaveResult r = save(s.sd, d.Sub("b"), {.incremental_base = d.Sub("a")});
  EXPECT_EQ(r.bytes_referenced, 64u * 1024 * 4);
  s.Set(5, 6);
  save(s.sd, d.Sub("a"));  // a full save over the base
  EXPECT_TRUE(Small().Loads(d.Sub("a"), 5, 6));
  EXPECT_TRUE(Small().Loads(d.Sub("b"), 1, 3));
  EXPECT_NO_THROW(verify(d.Sub("b")));
  EXPECT_EQ(testing::ListFiles(d.Sub("a"), "data-").size(), 2u);  // old tensor file kept
  std::filesystem::remove_all(d.Sub("b"));
  save(s.sd, d.Sub("a"));
  EXPECT_EQ(testing::ListFiles(d.Sub("a"), "data-").size(), 1u);
  EXPECT_TRUE(Small().Loads(d.Sub("a"), 5, 6));
}

// One rank writing two chunks of a tensor, one of them unchanged: the new file holds the other
// under the key a file of one chunk of that tensor has, and verify accepts it.
TEST(IncrementalSave, AChunkLeftInTheBaseLeavesTheFileKeysTrue) {
  TempDir d;
  std::vector<float> top(1024, 1.0f), bottom(1024, 2.0f);
  StateDict sd;
  sd.add("w", TensorView(top.data(), DType::kF32, Shape{1, 1024}), Chunk{{2, 1024}, {0, 0}});
  sd.add("w", TensorView(bottom.data(), DType::kF32, Shape{1, 1024}), Chunk{{2, 1024}, {1, 0}});
  save(sd, d.Sub("a"));
  bottom.assign(1024, 3.0f);
  EXPECT_EQ(save(sd, d.Sub("b"), {.incremental_base = d.Sub("a")}).chunks_referenced, 1u);
  EXPECT_NO_THROW(verify(d.Sub("b")));
  EXPECT_NO_THROW(verify(d.Sub("a")));
}

// A base written by an older build (format 2: one checksum per chunk): chunks of one block are
// referenced, larger ones written again (their checksums would not be this format's).
TEST(IncrementalSave, ABaseOfAnOlderFormatIsUsedWhereItsChecksumsServe) {
  TempDir d;
  std::vector<float> big(512 * 1024, 1.0f), small(256, 2.0f);  // 2 MiB and 1 KiB
  StateDict sd;
  sd.add("big", TensorView(big.data(), DType::kF32, Shape{512 * 1024}));
  sd.add("small", TensorView(small.data(), DType::kF32, Shape{256}));
  save(sd, d.Sub("a"));
  auto md = checkpoint::ReadMetadata(storage::PosixFileSystem(), d.Sub("a"));
  ASSERT_TRUE(md.ok());
  md->block_size = 0;
  for (auto& t : md->tensors) {
    for (auto& c : t.chunks) {
      c.block_xxh3.clear();
      c.xxh3 = Xxh3(std::as_bytes(std::span(t.fqn == "big" ? big : small)));
    }
  }
  ASSERT_TRUE(storage::PosixFileSystem()
                  .WriteAtomic(d.Sub("a/dcp.metadata"), metadata::Encode(*md, 2), ".tmp")
                  .ok());
  SaveResult r;
  ASSERT_NO_THROW(r = save(sd, d.Sub("b"), {.incremental_base = d.Sub("a")}));
  EXPECT_EQ(r.chunks_referenced, 1u);
  EXPECT_EQ(r.bytes_referenced, 1024u);
  EXPECT_NO_THROW(verify(d.Sub("b")));
  std::vector<float> got_big(big.size()), got_small(small.size());
  StateDict got;
  got.add("big", TensorView(got_big.data(), DType::kF32, Shape{512 * 1024}));
  got.add("small", TensorView(got_small.data(), DType::kF32, Shape{256}));
  load(got, d.Sub("b"));
  EXPECT_EQ(got_big, big);
  EXPECT_EQ(got_small, small);
}

}  // namespace
}  // namespace dcp
