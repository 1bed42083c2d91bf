// A broadcast load reads the stored chunks only its rank needs on a second thread while the
// shared shards are exchanged (issue 20 item 1): the disk does not wait for the collectives.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/load.h"
#include "dcp/checkpoint.h"
#include "dcp/metadata.h"
#include "storage/file_system.h"
#include "test_util.h"
#include "testfs/forwarding_file_system.h"

namespace dcp {
namespace {

using testing::TempDir;

// Reads of data files made on the thread that called Load wait until a read has begun on
// another thread, for at most 10 s (then noted): a load that reads its private chunks after
// the shared phase, on its own thread, never starts one.
class GatedFs : public testfs::ForwardingFileSystem {
 public:
  GatedFs() : caller_(std::this_thread::get_id()) {}
  bool ConcurrentReads() const override { return true; }
  Result<std::unique_ptr<storage::ReadableFile>> OpenReadable(const std::string& p) override {
    auto f = base().OpenReadable(p);
    if (!f.ok()) return f.status();
    return std::unique_ptr<storage::ReadableFile>(new File(std::move(f).value(), *this));
  }
  bool waited_in_vain() const { return waited_in_vain_; }
  bool other_thread_read() const { return other_thread_read_; }

 private:
  class File : public testfs::ForwardingReadableFile {
   public:
    File(std::unique_ptr<storage::ReadableFile> base, GatedFs& fs)
        : ForwardingReadableFile(std::move(base)), fs_(fs) {}
    Status ReadAt(uint64_t offset, std::span<std::byte> dst) override {
      const std::string name = path().substr(path().rfind('/') + 1);
      if (name.rfind("data-", 0) == 0) fs_.Gate();  // not the metadata
      return ForwardingReadableFile::ReadAt(offset, dst);
    }

   private:
    GatedFs& fs_;
  };

  void Gate() {
    std::unique_lock lock(mu_);
    if (std::this_thread::get_id() != caller_) {
      other_thread_read_ = true;
      cv_.notify_all();
      return;
    }
    if (waited_in_vain_) return;  // once is enough to fail
    if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return other_thread_read_; })) {
      waited_in_vain_ = true;
    }
  }

  const std::thread::id caller_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool other_thread_read_ = false;
  bool waited_in_vain_ = false;
};

uint16_t Value(uint64_t g) { return static_cast<uint16_t>(g * 2654435761u >> 7); }

// Rows [begin, begin + n) of a [rows, cols] bf16 tensor, filled with Value or zero.
struct Rows {
  std::vector<uint16_t> buf;
  int64_t begin, n, cols;
  Rows(int64_t begin_, int64_t n_, int64_t cols_, bool fill)
      : buf(static_cast<size_t>(n_ * cols_), 0), begin(begin_), n(n_), cols(cols_) {
    if (!fill) return;
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = Value(static_cast<uint64_t>(begin * cols) + i);
  }
  void AddTo(StateDict& sd, const std::string& fqn, int64_t rows) {
    sd.add(fqn, TensorView(buf.data(), DType::kBF16, Shape{n, cols}),
           Chunk{Shape{rows, cols}, Shape{begin, 0}});
  }
  bool Loaded() const {
    for (size_t i = 0; i < buf.size(); ++i) {
      if (buf[i] != Value(static_cast<uint64_t>(begin * cols) + i)) return false;
    }
    return true;
  }
};

constexpr int64_t kRows = 512, kCols = 1024;  // 1 MiB tensors

// Rank k's state: its half of "own" (a stored chunk of its own) and the whole of "shared".
struct RankState {
  Rows own, shared;
  StateDict sd;
  RankState(int k, bool fill)
      : own(k * kRows / 2, kRows / 2, kCols, fill), shared(0, kRows, kCols, fill) {
    own.AddTo(sd, "own", kRows);
    shared.AddTo(sd, "shared", kRows);
  }
};

TEST(ReadOverlap, PrivateChunksAreReadWhileSharedShardsAreExchanged) {
  // Two ranks saved their halves of "own" (a stored chunk each) and "shared", which both hold
  // whole. Loading the same layout, each rank reads its half of "own", which nobody else
  // needs, and a slab of "shared", which it exchanges with the other rank.
  TempDir tmp;
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    RankState saved(c->rank(), true);
    save(saved.sd, tmp.path(), {.comm = c});
  });
  std::vector<LoadResult> results(2);
  std::vector<int> right(2, 0), overlapped(2, 0);
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    RankState d(c->rank(), false);
    GatedFs fs;  // this rank's: its caller is this thread
    auto r = checkpoint::Load(d.sd, tmp.path(),
                              {.comm = c,
                               .broadcast_slab_bytes = 256 << 10,
                               .broadcast_within_host = true,
                               .broadcast_cached = true},
                              fs);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    results[c->rank()] = *r;
    right[c->rank()] = d.own.Loaded() && d.shared.Loaded();
    overlapped[c->rank()] = fs.other_thread_read() && !fs.waited_in_vain();
  });
  uint64_t read = 0;
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(right[k]) << "rank " << k;
    EXPECT_TRUE(overlapped[k]) << "rank " << k << " read its own chunk after the shared phase";
    EXPECT_GT(results[k].shards_read_for_others, 0u) << "rank " << k;
    read += results[k].bytes_read;  // the second reader's bytes counted with the rank's
  }
  EXPECT_EQ(read, uint64_t{2} * kRows * kCols * 2);  // every stored byte once
}

TEST(ReadOverlap, ADamagedPrivateChunkFailsEveryRank) {
  // Rank 1's half of "own", read by its second reader, has a flipped byte: both ranks return
  // the checksum error naming the file and tensor, and neither waits forever.
  TempDir tmp;
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    RankState saved(c->rank(), true);
    save(saved.sd, tmp.path(), {.comm = c});
  });
  const Metadata md = read_metadata(tmp.path());
  const TensorMeta* own = md.FindTensor("own");
  ASSERT_NE(own, nullptr);
  const StoredChunk* half = nullptr;
  for (const StoredChunk& c : own->chunks) {
    if (c.box.offsets[0] == kRows / 2) half = &c;
  }
  ASSERT_NE(half, nullptr);
  const std::string file = tmp.Sub(md.files[half->file].name);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(half->byte_offset + 4097));
    f.put('\x5a');
  }
  std::vector<std::string> errors(2);
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    RankState d(c->rank(), false);
    auto r = checkpoint::Load(d.sd, tmp.path(),
                              {.comm = c, .broadcast_within_host = true, .broadcast_cached = true},
                              storage::PosixFileSystem());
    errors[c->rank()] = r.ok() ? "" : r.status().ToString();
  });
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(errors[k].find("checksum mismatch"), std::string::npos) << k << ": " << errors[k];
    EXPECT_NE(errors[k].find(file), std::string::npos) << k << ": " << errors[k];
    EXPECT_NE(errors[k].find("'own'"), std::string::npos) << k << ": " << errors[k];
  }
}

}  // namespace
}  // namespace dcp
