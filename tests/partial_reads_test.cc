// What a load reads from storage (issue 13 items 2 and 3): each stored byte once per rank
// however many destination chunks it feeds, and with block checksums (format version 3) only
// the blocks a resharding load needs, each verified; versions 1 and 2 still load.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/load.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/verify.h"
#include "core/checksum.h"
#include "dcp/checkpoint.h"
#include "metadata/codec.h"
#include "recording_fs.h"
#include "storage/chunk_reader.h"
#include "storage/file_system.h"
#include "test_util.h"
#include "testfs/forwarding_file_system.h"

namespace dcp {
namespace {

using testing::TempDir;
constexpr uint64_t kBlock = metadata::kChecksumBlockSize;

// bf16 element value from its global row-major index: any chunking can be checked.
uint16_t Value(uint64_t g) { return static_cast<uint16_t>(g * 2654435761u >> 7); }

struct Tensor {
  std::string fqn;
  Shape shape;  // 2-d, bf16
};

// 6 MiB row-split and column-split matrices (rows of 3 and 4 KiB), one of 2,000,000 bytes
// (two blocks, the last short) and one smaller than a block.
const std::vector<Tensor>& Tensors() {
  static const std::vector<Tensor> t = {{"a.rows", Shape{2048, 1536}},
                                        {"b.cols", Shape{1536, 2048}},
                                        {"c.odd", Shape{1000, 1000}},
                                        {"d.small", Shape{12, 100}}};
  return t;
}

// Destination (or source) memory for boxes of the tensors.
struct Mem {
  std::vector<std::vector<uint16_t>> bufs;
  StateDict sd;
  void Add(const Tensor& t, const Box& box, bool fill) {
    std::vector<uint16_t>& buf = bufs.emplace_back(box.NumElements(), 0);
    if (fill) {
      for (int64_t r = 0; r < box.lengths[0]; ++r) {
        for (int64_t c = 0; c < box.lengths[1]; ++c) {
          buf[r * box.lengths[1] + c] =
              Value((box.offsets[0] + r) * t.shape[1] + box.offsets[1] + c);
        }
      }
    }
    sd.add(t.fqn, TensorView(buf.data(), DType::kBF16, box.lengths), Chunk{t.shape, box.offsets});
  }
  // Every loaded element equals its saved value.
  ::testing::AssertionResult Check() const {
    for (size_t e = 0, k = 0; e < sd.entries().size(); ++e) {
      const StateEntry& entry = sd.entries()[e];
      for (const TensorChunk& c : entry.chunks) {
        const uint16_t* p = reinterpret_cast<const uint16_t*>(c.view.data);
        const int64_t cols = entry.global_shape[1];
        for (int64_t r = 0; r < c.box.lengths[0]; ++r) {
          for (int64_t j = 0; j < c.box.lengths[1]; ++j) {
            if (p[r * c.box.lengths[1] + j] !=
                Value((c.box.offsets[0] + r) * cols + c.box.offsets[1] + j)) {
              return ::testing::AssertionFailure()
                     << entry.fqn << " chunk " << c.box.ToString() << " row " << r << " col " << j;
            }
          }
        }
        ++k;
      }
    }
    return ::testing::AssertionSuccess();
  }
};

Box Rows(const Shape& s, int64_t begin, int64_t n) { return Box{Shape{begin, 0}, Shape{n, s[1]}}; }
Box Cols(const Shape& s, int64_t begin, int64_t n) { return Box{Shape{0, begin}, Shape{s[0], n}}; }

class PartialReads : public ::testing::Test {
 protected:
  void SetUp() override {
    Mem src;
    for (const Tensor& t : Tensors()) src.Add(t, Box::Whole(t.shape), true);
    save(src.sd, tmp_.path());
    md_ = read_metadata(tmp_.path());
  }
  uint64_t TotalBytes() const { return md_.TotalDataBytes(); }
  std::string DataFile() const { return tmp_.Sub(md_.files[0].name); }
  const StoredChunk& Stored(const std::string& fqn) const { return md_.FindTensor(fqn)->chunks[0]; }
  // Rewrites the metadata in an older version: whole-chunk checksums, no blocks.
  void RewriteAs(uint32_t version) {
    Metadata old = md_;
    old.block_size = 0;
    std::ifstream in(DataFile(), std::ios::binary);
    for (TensorMeta& t : old.tensors) {
      for (StoredChunk& c : t.chunks) {
        std::vector<std::byte> bytes(c.byte_length);
        in.seekg(static_cast<std::streamoff>(c.byte_offset));
        in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
        c.xxh3 = Xxh3(bytes);
        c.block_xxh3.clear();
      }
    }
    std::ofstream out(tmp_.Sub("dcp.metadata"), std::ios::binary | std::ios::trunc);
    const std::string enc = metadata::Encode(old, version);
    out.write(enc.data(), static_cast<std::streamsize>(enc.size()));
  }
  // One process holding a tp4 chunking of every tensor (rows of a.rows, columns of the
  // others), as `dcp demo` loads: each stored chunk feeds four destination chunks.
  Mem Tp4() const {
    Mem d;
    for (const Tensor& t : Tensors()) {
      for (int k = 0; k < 4; ++k) {
        if (t.fqn == "a.rows" || t.fqn == "d.small") {
          d.Add(t, Rows(t.shape, k * t.shape[0] / 4, t.shape[0] / 4), false);
        } else {
          d.Add(t, Cols(t.shape, k * t.shape[1] / 4, t.shape[1] / 4), false);
        }
      }
    }
    return d;
  }

  TempDir tmp_;
  Metadata md_;
};

TEST_F(PartialReads, SavesBlockChecksums) {
  EXPECT_EQ(md_.block_size, kBlock);
  EXPECT_EQ(Stored("a.rows").block_xxh3.size(), 6u);
  EXPECT_EQ(Stored("c.odd").block_xxh3.size(), 2u);  // 2,000,000 bytes: one full, one short
  EXPECT_TRUE(Stored("d.small").block_xxh3.empty());
  EXPECT_EQ(Stored("a.rows").xxh3, BlockDigest(Stored("a.rows").block_xxh3));
}

TEST_F(PartialReads, Tp4InOneProcessReadsEachStoredByteOnce) {
  // Issue 13 item 2: `dcp demo` read 4x the checkpoint (each destination chunk read its
  // stored chunk again to check its one checksum).
  for (bool verify : {true, false}) {
    SCOPED_TRACE(verify ? "verified" : "unverified");
    Mem d = Tp4();
    LoadResult r = load(d.sd, tmp_.path(), {.verify_checksums = verify});
    EXPECT_EQ(r.bytes_read, TotalBytes());
    EXPECT_EQ(r.chunks_read, md_.TotalChunks());
    EXPECT_TRUE(d.Check());
  }
}

TEST_F(PartialReads, Tp4OnFourRanksEachReceivesOnlyItsPartOfASharedChunk) {
  // Each rank loads quarter `rank` of every tensor (rows of a.rows and d.small, columns of the
  // others) from a checkpoint one rank saved: every stored chunk is read once, by one of the
  // four, which sends each other rank its quarter, straight into its destination (a quarter
  // of the bytes a broadcast of the chunk would bring it).
  std::vector<LoadResult> results(4);
  std::vector<int> checked(4, 0);  // not vector<bool>: ranks write at once
  testing::RunRanks(4, [&](const std::shared_ptr<Comm>& c) {
    const int k = c->rank();
    Mem d;
    for (const Tensor& t : Tensors()) {
      if (t.fqn == "a.rows" || t.fqn == "d.small") {
        d.Add(t, Rows(t.shape, k * t.shape[0] / 4, t.shape[0] / 4), false);
      } else {
        d.Add(t, Cols(t.shape, k * t.shape[1] / 4, t.shape[1] / 4), false);
      }
    }
    auto r = checkpoint::Load(d.sd, tmp_.path(),
                              {.comm = c, .broadcast_within_host = true, .broadcast_cached = true},
                              storage::PosixFileSystem());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    results[k] = *r;
    checked[k] = d.Check();
  });
  uint64_t read = 0, sent = 0, received = 0, shared = 0;
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(checked[k]) << "rank " << k;
    read += results[k].bytes_read;
    sent += results[k].bytes_sent;
    received += results[k].bytes_received;
    shared += results[k].shared_chunks;
  }
  EXPECT_EQ(shared, 4 * md_.TotalChunks());  // every rank takes part in every chunk
  EXPECT_EQ(read, TotalBytes());
  EXPECT_EQ(sent, TotalBytes() / 4 * 3);
  EXPECT_EQ(received, TotalBytes() / 4 * 3);
}

using testing::RecordingFs;

TEST_F(PartialReads, ASharedShardsSlabsAreAnnouncedAsTheBlocksTheirReaderReads) {
  // Two ranks each load every tensor whole (dp2), exchanging slabs of about 1 MiB: each reads
  // some rows of each tensor, the next rows the other's. What a rank announces of the data file
  // ahead of its reads (advised a window ahead on a file system) is exactly what it reads:
  // the blocks of its slabs, not the whole stored chunks.
  RecordingFs fs;
  std::vector<LoadResult> results(2);
  std::vector<int> checked(2, 0);  // not vector<bool>: ranks write at once
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    Mem d;
    for (const Tensor& t : Tensors()) d.Add(t, Box::Whole(t.shape), false);
    auto r = checkpoint::Load(d.sd, tmp_.path(),
                              {.comm = c,
                               .broadcast_slab_bytes = kBlock,
                               .broadcast_within_host = true,
                               .broadcast_cached = true},
                              fs);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    results[c->rank()] = *r;
    checked[c->rank()] = d.Check();
  });
  const std::vector<const RecordingFs::Log*> logs = fs.LogsOf(DataFile());
  ASSERT_EQ(logs.size(), 2u);  // one per rank
  uint64_t read = 0;
  for (const RecordingFs::Log* log : logs) {
    EXPECT_FALSE(log->read.empty());
    EXPECT_EQ(storage::MergeRanges(log->announced), storage::MergeRanges(log->read));
    for (const storage::ByteRange& r : storage::MergeRanges(log->read)) read += r.length;
  }
  EXPECT_EQ(read, TotalBytes());  // each byte read once, by one of the two
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(checked[k]) << "rank " << k;
    EXPECT_GT(results[k].shards_read_for_others, 0u) << "rank " << k;
  }
}

TEST(PartialReadsTied, TiedWeightsLoadIntoOneBufferOnFourRanks) {
  // Tied weights (an embedding and its output layer): two checkpoint entries with the same
  // values that the job loads into one buffer, as `model.state_dict()` hands both names the
  // same storage. Each of four ranks loads its column quarter of every tensor from a
  // checkpoint one rank saved: every stored chunk is read by one rank and sent as parts. Three
  // larger tensors keep ranks 0-2 busy, so rank 3 reads both tied chunks and sends them in one
  // batch, whose parts would land twice in the same memory of every receiver: that batch is
  // received into staging and copied from there.
  const Shape big{256, 256}, tied{64, 256};  // 128 KiB and 32 KiB: whole chunks, batched
  TempDir tmp;
  {
    Mem src;
    for (const char* name : {"a0", "a1", "a2"}) src.Add({name, big}, Box::Whole(big), true);
    for (const char* name : {"tied.in", "tied.out"}) src.Add({name, tied}, Box::Whole(tied), true);
    save(src.sd, tmp.path());
  }
  std::vector<int> checked(4, 0);  // not vector<bool>: ranks write at once
  testing::RunRanks(4, [&](const std::shared_ptr<Comm>& c) {
    const int k = c->rank();
    Mem d;
    for (const char* name : {"a0", "a1", "a2"}) d.Add({name, big}, Cols(big, k * 64, 64), false);
    const Box quarter = Cols(tied, k * 64, 64);
    d.Add({"tied.in", tied}, quarter, false);
    d.sd.add("tied.out", TensorView(d.bufs.back().data(), DType::kBF16, quarter.lengths),
             Chunk{tied, quarter.offsets});
    auto r = checkpoint::Load(d.sd, tmp.path(),
                              {.comm = c, .broadcast_within_host = true, .broadcast_cached = true},
                              storage::PosixFileSystem());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->shared_chunks, 5u);
    EXPECT_EQ(r->batches, 1u);  // the tied pair, together: the case this test is for
    checked[k] = d.Check();
  });
  for (int k = 0; k < 4; ++k) EXPECT_TRUE(checked[k]) << "rank " << k;
}

TEST_F(PartialReads, ReshardReadsOnlyTheBlocksItNeeds) {
  // Rows [512, 1024) of a.rows are bytes [1.5 MiB, 3 MiB): blocks 1 and 2.
  const Tensor& t = Tensors()[0];
  Mem d;
  d.Add(t, Rows(t.shape, 512, 512), false);
  LoadResult r = load(d.sd, tmp_.path(), {.allow_partial = true});
  EXPECT_EQ(r.bytes_read, 2 * kBlock);
  EXPECT_TRUE(d.Check());
  // A column slice touches every block; c.odd's second block is short.
  Mem cols;
  cols.Add(Tensors()[2], Cols(Tensors()[2].shape, 100, 10), false);
  r = load(cols.sd, tmp_.path(), {.allow_partial = true});
  EXPECT_EQ(r.bytes_read, Stored("c.odd").byte_length);
  EXPECT_TRUE(cols.Check());
  // Row 0 of c.odd: only the first block.
  Mem row;
  row.Add(Tensors()[2], Rows(Tensors()[2].shape, 0, 1), false);
  r = load(row.sd, tmp_.path(), {.allow_partial = true});
  EXPECT_EQ(r.bytes_read, kBlock);
  EXPECT_TRUE(row.Check());
}

TEST_F(PartialReads, FlippedByteInAReadBlockIsCaught) {
  const StoredChunk& c = Stored("a.rows");
  testing::FlipByte(DataFile(), c.byte_offset + 2 * kBlock + 17);  // block 2
  const Tensor& t = Tensors()[0];
  Mem d;
  d.Add(t, Rows(t.shape, 512, 512), false);
  try {
    load(d.sd, tmp_.path(), {.allow_partial = true});
    FAIL() << "a flipped byte in a block the load reads went unnoticed";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), StatusCode::kDataLoss) << msg;
    EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << msg;
    EXPECT_NE(msg.find("a.rows"), std::string::npos) << msg;
    // The block's byte range in the file.
    EXPECT_NE(msg.find(std::to_string(c.byte_offset + 2 * kBlock) + ", " +
                       std::to_string(c.byte_offset + 3 * kBlock)),
              std::string::npos)
        << msg;
  }
}

TEST_F(PartialReads, FlippedByteInAnUnreadBlockIsLeftToVerify) {
  const StoredChunk& c = Stored("a.rows");
  testing::FlipByte(DataFile(), c.byte_offset + 5 * kBlock + 3);  // block 5: rows >= 1706
  const Tensor& t = Tensors()[0];
  Mem d;
  d.Add(t, Rows(t.shape, 512, 512), false);
  EXPECT_NO_THROW(load(d.sd, tmp_.path(), {.allow_partial = true}));
  EXPECT_TRUE(d.Check());
  // A whole load reads it, and so does verify.
  Mem whole = Tp4();
  EXPECT_THROW(load(whole.sd, tmp_.path()), Error);
  EXPECT_THROW(verify(tmp_.path()), Error);
  std::string out;
  EXPECT_EQ(testing::RunCommand(std::string(DCP_CLI_PATH) + " verify " + tmp_.path(), &out), 1)
      << out;
  EXPECT_NE(out.find("a.rows"), std::string::npos) << out;
}

TEST_F(PartialReads, Version1And2CheckpointsStillLoad) {
  for (uint32_t version : {2u, 1u}) {
    SCOPED_TRACE("version " + std::to_string(version));
    RewriteAs(version);
    Metadata old = read_metadata(tmp_.path());
    EXPECT_EQ(old.block_size, 0u);
    EXPECT_NO_THROW(verify(tmp_.path()));
    Mem d = Tp4();
    LoadResult r = load(d.sd, tmp_.path());
    EXPECT_EQ(r.bytes_read, TotalBytes());  // still once per rank
    EXPECT_TRUE(d.Check());
    // A partial load must read the whole chunk its one checksum covers.
    const Tensor& t = Tensors()[0];
    Mem part;
    part.Add(t, Rows(t.shape, 512, 512), false);
    r = load(part.sd, tmp_.path(), {.allow_partial = true});
    EXPECT_EQ(r.bytes_read, Stored("a.rows").byte_length);
    EXPECT_TRUE(part.Check());
    // So a flipped byte anywhere in the chunk is caught.
    testing::FlipByte(DataFile(), Stored("a.rows").byte_offset + 5 * kBlock + 3);
    Mem again;
    again.Add(t, Rows(t.shape, 512, 512), false);
    EXPECT_THROW(load(again.sd, tmp_.path(), {.allow_partial = true}), Error);
    EXPECT_THROW(verify(tmp_.path()), Error);
    testing::FlipByte(DataFile(), Stored("a.rows").byte_offset + 5 * kBlock + 3);
  }
}

// The file's bytes, as a copy receiving them would see them.
std::vector<std::byte> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

// Feeds `bytes` [begin, end) to `v` in pieces of `piece` bytes.
Status Feed(storage::StreamVerifier& v, const std::vector<std::byte>& bytes, uint64_t begin,
            uint64_t end, uint64_t piece) {
  for (uint64_t at = begin; at < end; at += piece) {
    DCP_RETURN_IF_ERROR(
        v.Add(at, std::span(bytes.data() + at, std::min<uint64_t>(piece, end - at))));
  }
  return OkStatus();
}

TEST_F(PartialReads, AStreamVerifierChecksACopyAsItArrives) {
  // The memory tier checks each file it receives piece by piece, never reading it back.
  std::vector<std::byte> bytes = ReadAll(DataFile());
  const auto all = checkpoint::StoredRangesByFile(md_)[0];
  EXPECT_EQ(all.size(), Tensors().size());
  {  // Whole, in pieces that end anywhere in blocks and chunks.
    storage::StreamVerifier v(all, "f");
    ASSERT_TRUE(Feed(v, bytes, 0, bytes.size(), kBlock + 4097).ok());
    EXPECT_TRUE(v.Finish().ok());
  }
  const StoredChunk& a = Stored("a.rows");
  const StoredChunk& small = Stored("d.small");  // one checksum (smaller than a block)
  {                                              // Ended early: the ranges not seen are named.
    storage::StreamVerifier v(all, "f");
    ASSERT_TRUE(Feed(v, bytes, 0, a.byte_offset + kBlock, 65536).ok());
    const Status s = v.Finish();
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.message();
  }
  {  // A range with bytes skipped.
    storage::StreamVerifier v(all, "f");
    ASSERT_TRUE(Feed(v, bytes, 0, a.byte_offset + 100, 4096).ok());
    const Status s = Feed(v, bytes, a.byte_offset + 200, bytes.size(), 4096);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.message();
    EXPECT_NE(s.message().find("never came"), std::string::npos) << s.message();
  }
  {  // Out of order.
    storage::StreamVerifier v(all, "f");
    ASSERT_TRUE(Feed(v, bytes, 0, 8192, 4096).ok());
    EXPECT_FALSE(v.Add(0, std::span(bytes.data(), 10)).ok());
  }
  {  // A sparse copy: only the ranges inside its spans are checked, bytes between skipped.
    const auto some = checkpoint::RangesWithin(
        all, {{small.byte_offset, small.byte_length}, {a.byte_offset, a.byte_length}});
    ASSERT_EQ(some.size(), 2u);
    storage::StreamVerifier v(some, "f");
    const auto& [first, second] =
        a.byte_offset < small.byte_offset ? std::pair(a, small) : std::pair(small, a);
    ASSERT_TRUE(
        Feed(v, bytes, first.byte_offset, first.byte_offset + first.byte_length, 1000).ok());
    ASSERT_TRUE(
        Feed(v, bytes, second.byte_offset, second.byte_offset + second.byte_length, 1000).ok());
    EXPECT_TRUE(v.Finish().ok());
  }
  // A flipped byte: in a block of a.rows (that block named), and in the one-checksum chunk.
  for (const auto& [chunk, at, block] :
       {std::tuple(&a, 2 * kBlock + 17, true), std::tuple(&small, uint64_t{5}, false)}) {
    std::vector<std::byte> bad = bytes;
    bad[chunk->byte_offset + at] ^= std::byte{1};
    storage::StreamVerifier v(all, "f");
    Status s = Feed(v, bad, 0, bad.size(), 333333);
    if (s.ok()) s = v.Finish();
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("checksum mismatch in f"), std::string::npos) << s.message();
    if (block) {
      EXPECT_NE(s.message().find(std::to_string(chunk->byte_offset + 2 * kBlock) + ", " +
                                 std::to_string(chunk->byte_offset + 3 * kBlock)),
                std::string::npos)
          << s.message();
    }
  }
}

TEST(LoadHooks, ALoadSaysWhichFileItFoundDamaged) {
  // The memory tier's restore passes over the copy a load found damaged, and only that one:
  // two ranks each write one tensor, so the checkpoint has two data files.
  TempDir tmp;
  std::vector<std::vector<float>> values = {std::vector<float>(1024, 1.0f),
                                            std::vector<float>(1024, 2.0f)};
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    StateDict sd;
    const std::string name = "t" + std::to_string(c->rank());
    sd.add(name, TensorView(values[c->rank()].data(), DType::kF32, {1024}));
    ASSERT_NO_THROW(save(sd, tmp.path(), {.comm = c}));
  });
  const Metadata md = read_metadata(tmp.path());
  ASSERT_EQ(md.files.size(), 2u);
  for (const char* fqn : {"t0", "t1"}) {
    SCOPED_TRACE(fqn);
    const StoredChunk& c = md.FindTensor(fqn)->chunks[0];
    const std::string path = tmp.Sub(md.files[c.file].name);
    testing::FlipByte(path, c.byte_offset + 5);
    std::vector<float> got0(1024), got1(1024);
    StateDict d;
    d.add("t0", TensorView(got0.data(), DType::kF32, {1024}));
    d.add("t1", TensorView(got1.data(), DType::kF32, {1024}));
    std::vector<uint32_t> damaged;
    checkpoint::LoadHooks hooks;
    hooks.damaged = [&](uint32_t f, const Status& why) {
      damaged.push_back(f);
      EXPECT_EQ(why.code(), StatusCode::kDataLoss);
      EXPECT_NE(why.message().find(fqn), std::string::npos) << why.message();
    };
    auto r = checkpoint::Load(d, tmp.path(), {}, storage::PosixFileSystem(), &hooks);
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(damaged, std::vector<uint32_t>{c.file});
    // Mended: an intact load calls nothing.
    testing::FlipByte(path, c.byte_offset + 5);
    damaged.clear();
    ASSERT_TRUE(checkpoint::Load(d, tmp.path(), {}, storage::PosixFileSystem(), &hooks).ok());
    EXPECT_TRUE(damaged.empty());
    EXPECT_EQ(got0, values[0]);
    EXPECT_EQ(got1, values[1]);
  }
}

TEST(LoadHooks, EachStoredChunkIsReadWhereItsFileIsAndSentToTheRanksNeedingIt) {
  // The memory tier's restore: two ranks saved the row halves of `w`, one data file each. Three
  // ranks load; ranks 0 and 1 want all of `w`, but rank 0 can read only the first half's file
  // where it is, rank 1 only the second's; rank 2 wants none of it and can read both. No rank
  // reads a file it cannot read: the first half comes from rank 2 (the least loaded that can,
  // though it needs none of it), the second from rank 1, straight into its destination.
  constexpr int64_t kRows = 64, kCols = 1024;
  TempDir tmp;
  std::vector<float> full(kRows * kCols);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    StateDict sd;
    const int64_t r = c->rank();
    sd.add("w", TensorView(full.data() + r * kRows / 2 * kCols, DType::kF32, {kRows / 2, kCols}),
           Chunk{Shape{kRows, kCols}, Shape{r * kRows / 2, 0}});
    ASSERT_NO_THROW(save(sd, tmp.path(), {.comm = c}));
  });
  const Metadata md = read_metadata(tmp.path());
  ASSERT_EQ(md.files.size(), 2u);
  const auto& chunks = md.FindTensor("w")->chunks;
  ASSERT_EQ(chunks.size(), 2u);
  const StoredChunk& first = chunks[0].box.offsets[0] == 0 ? chunks[0] : chunks[1];
  const StoredChunk& second = &first == &chunks[0] ? chunks[1] : chunks[0];
  std::vector<std::vector<bool>> readable(3, std::vector<bool>(2, false));
  readable[0][first.file] = readable[1][second.file] = true;
  readable[2] = {true, true};
  std::vector<LoadResult> results(3);
  testing::RunRanks(3, [&](const std::shared_ptr<Comm>& c) {
    const int me = c->rank();
    std::vector<float> got(me < 2 ? kRows * kCols : 0, -1.0f);
    StateDict d;
    if (me < 2) d.add("w", TensorView(got.data(), DType::kF32, {kRows, kCols}));
    checkpoint::LoadHooks hooks;
    hooks.readable = &readable;
    hooks.before_reads = [&](const std::vector<checkpoint::ReadSpan>& reads) {
      for (const checkpoint::ReadSpan& r : reads) {
        if (!readable[me][r.file]) {
          return FailedPrecondition("rank " + std::to_string(me) + " would read file " +
                                    std::to_string(r.file) + ", which it cannot read");
        }
      }
      return OkStatus();
    };
    auto r = checkpoint::Load(d, tmp.path(),
                              {.comm = c, .broadcast_within_host = true, .broadcast_cached = true},
                              storage::PosixFileSystem(), &hooks);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    results[me] = *r;
    if (me < 2) {
      EXPECT_EQ(got, full) << "rank " << me;
    }
  });
  EXPECT_EQ(results[2].bytes_read, first.byte_length);
  EXPECT_EQ(results[2].bytes_sent, first.byte_length);
  EXPECT_EQ(results[1].bytes_read, second.byte_length);
  EXPECT_EQ(results[1].bytes_sent, second.byte_length);
  EXPECT_EQ(results[0].bytes_read, 0u);
  EXPECT_EQ(results[0].bytes_received, first.byte_length + second.byte_length);
}

}  // namespace
}  // namespace dcp
