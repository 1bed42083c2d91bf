// Files moved between ranks (the memory tier's replication and restore fetches), two ranks as
// threads: what a failure says about whose copy is bad.
#include "tier/file_transfer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/names.h"
#include "dcp/checkpoint.h"
#include "test_util.h"
#include "tier/host_dir.h"

namespace dcp::tier {
namespace {

using testing::TempDir;

struct Outcome {
  Status local;
  std::vector<std::string> failed, damaged;
};

// Rank 0 sends its data file of the checkpoint in `src` to rank 1's directory `dst`.
std::vector<Outcome> Send(const std::string& src, const std::string& dst) {
  auto md = ReadStepMetadata(src);
  EXPECT_TRUE(md.ok()) << md.status().ToString();
  std::vector<Transfer> transfers;
  for (const auto& f : md->first.files) {
    if (checkpoint::TensorDataFileRank(f.name) == 0)
      transfers.push_back({0, 1, f.name, f.size, {}});
  }
  EXPECT_EQ(transfers.size(), 1u);
  const CheckReceived check = ReceiveChecks(md->first);
  std::vector<Outcome> out(2);
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    PairGroups groups(c);
    TransferDirs dirs{&storage::PosixFileSystem(), c->rank() == 0 ? src : dst, nullptr, ""};
    TransferStats stats;
    ASSERT_TRUE(TransferFiles(groups, transfers, dirs, {.piece_bytes = 4096}, check, &stats).ok());
    Outcome& o = out[c->rank()];
    o.local = stats.local_failure;
    for (const auto& f : stats.failed) {
      o.failed.push_back(f.transfer.file);
      if (f.damaged) o.damaged.push_back(f.transfer.file);
    }
  });
  return out;
}

// Only bytes that fail their checksums condemn the sender's copy; a receiver that cannot
// store the file (its own disk) fails alone, its sender's copy untouched.
TEST(FileTransfer, OnlyChecksumFailuresCondemnTheSendersCopy) {
  TempDir tmp;
  std::vector<float> w(64 * 1024, 1.5f);
  StateDict sd;
  sd.add("w", TensorView(w.data(), DType::kF32, {256, 256}));
  save(sd, tmp.Sub("src"));
  std::filesystem::create_directories(tmp.Sub("dst"));

  auto ok = Send(tmp.Sub("src"), tmp.Sub("dst"));
  EXPECT_TRUE(ok[1].local.ok()) << ok[1].local.ToString();
  EXPECT_TRUE(ok[1].failed.empty());

  // The receiver's directory is gone (as its tmpfs would be): a local failure, no damage.
  auto local = Send(tmp.Sub("src"), tmp.Sub("missing"));
  EXPECT_FALSE(local[1].local.ok());
  EXPECT_EQ(local[1].failed.size(), 1u);
  EXPECT_TRUE(local[1].damaged.empty());

  // A flipped byte in the sender's file: damage, on the receiver.
  for (const auto& f : testing::ListFiles(tmp.Sub("src"), "data-")) {
    testing::FlipByte(tmp.Sub("src") + "/" + f, 100000);
  }
  std::filesystem::create_directories(tmp.Sub("dst2"));
  auto bad = Send(tmp.Sub("src"), tmp.Sub("dst2"));
  EXPECT_EQ(bad[1].failed.size(), 1u);
  EXPECT_EQ(bad[1].damaged, bad[1].failed);
}

}  // namespace
}  // namespace dcp::tier
