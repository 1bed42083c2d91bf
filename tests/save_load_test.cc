// Single-process save and load through the real file system: round trips, resharding,
// load-time checks, corruption and crash safety.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "checkpoint/load.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/names.h"
#include "checkpoint/save.h"
#include "checkpoint/torch_probe.h"
#include "checkpoint/verify.h"
#include "dcp/checkpoint.h"
#include "hf/safetensors_header.h"
#include "metadata/codec.h"
#include "test_util.h"
#include "testfs/fault_file_system.h"
#include "testfs/forwarding_file_system.h"

namespace dcp {
namespace {

using testing::TempDir;

// Memory for chunks, filled with a pattern that depends only on the global element
// index, so any chunking can be checked against any other.
struct Chunks {
  std::vector<std::vector<std::byte>> bufs;
};

uint64_t ElementBytes(DType t) { return static_cast<uint64_t>(std::max(DTypeBits(t) / 8, 1)); }

// Global row-major index of element `i` (row-major within `box`).
uint64_t GlobalIndex(const Shape& global, const Box& box, uint64_t i) {
  uint64_t g = 0, stride = 1;
  for (int d = global.rank() - 1; d >= 0; --d) {
    uint64_t len = static_cast<uint64_t>(box.lengths[d]);
    uint64_t c = i % len;
    i /= len;
    g += (c + static_cast<uint64_t>(box.offsets[d])) * stride;
    stride *= static_cast<uint64_t>(global[d]);
  }
  return g;
}

std::byte Pattern(uint64_t seed, uint64_t global_byte) {
  uint64_t x = (global_byte + 1) * 0x9e3779b97f4a7c15ULL ^ seed;
  x ^= x >> 29;
  return static_cast<std::byte>(x * 0xbf58476d1ce4e5b9ULL >> 56);
}

// Fills (fill=true) or checks a chunk of a byte-sized dtype.
::testing::AssertionResult FillOrCheck(bool fill, uint64_t seed, DType t, const Shape& global,
                                       const Box& box, std::byte* data) {
  const uint64_t eb = ElementBytes(t);
  for (uint64_t i = 0; i < box.NumElements(); ++i) {
    uint64_t g = GlobalIndex(global, box, i);
    for (uint64_t b = 0; b < eb; ++b) {
      std::byte want = Pattern(seed, g * eb + b);
      if (fill) {
        data[i * eb + b] = want;
      } else if (data[i * eb + b] != want) {
        return ::testing::AssertionFailure()
               << "element " << i << " of box " << box.ToString() << " (global " << g << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

void AddChunks(StateDict& sd, Chunks& mem, const std::string& fqn, DType t, const Shape& global,
               const std::vector<Box>& boxes, bool fill, uint64_t seed) {
  for (const Box& b : boxes) {
    auto bytes = DTypeBytes(t, b.NumElements());
    ASSERT_TRUE(bytes.has_value());
    mem.bufs.emplace_back(*bytes);
    std::byte* p = mem.bufs.back().data();
    if (fill && DTypeBits(t) >= 8) FillOrCheck(true, seed, t, global, b, p);
    if (fill && DTypeBits(t) < 8) {
      for (uint64_t i = 0; i < *bytes; ++i) p[i] = static_cast<std::byte>(i * 7 + seed);
    }
    sd.add(fqn, TensorView(p, t, b.lengths), Chunk{global, b.offsets});
  }
}

// Splits [0, n) into `parts` torch.chunk pieces (possibly empty at the end).
std::vector<std::pair<int64_t, int64_t>> Split(int64_t n, int parts) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t size = (n + parts - 1) / parts;
  for (int i = 0; i < parts; ++i) {
    int64_t lo = std::min(n, i * size), hi = std::min(n, lo + size);
    out.push_back({lo, hi - lo});
  }
  return out;
}

// A grid partition of `shape` with `parts[d]` pieces along dimension d.
std::vector<Box> Grid(const Shape& shape, const std::vector<int>& parts) {
  std::vector<Box> boxes{Box{Shape(), Shape()}};
  for (int d = 0; d < shape.rank(); ++d) {
    std::vector<Box> next;
    for (const Box& b : boxes) {
      for (auto [o, l] : Split(shape[d], parts[d])) {
        Box nb = b;
        nb.offsets.push_back(o);
        nb.lengths.push_back(l);
        next.push_back(nb);
      }
    }
    boxes = std::move(next);
  }
  return boxes;
}

TEST(SaveLoad, RoundTripEveryDtypeWholeAndResharded) {
  TempDir tmp;
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType t = static_cast<DType>(i);
    SCOPED_TRACE(std::string(DTypeName(t)));
    const Shape global{4, 8};
    StateDict src;
    Chunks src_mem;
    AddChunks(src, src_mem, "w", t, global, Grid(global, {2, 1}), true, 11 + i);
    const std::string dir = tmp.Sub(std::string(DTypeName(t)));
    ASSERT_NO_THROW(save(src, dir));

    // Whole tensor, then chunked along the other dimension (on whole bytes for sub-byte).
    for (const std::vector<int>& parts : {std::vector<int>{1, 1}, std::vector<int>{1, 2}}) {
      StateDict dst;
      Chunks dst_mem;
      AddChunks(dst, dst_mem, "w", t, global, Grid(global, parts), false, 0);
      ASSERT_NO_THROW(load(dst, dir));
      if (DTypeBits(t) >= 8) {
        for (size_t c = 0; c < dst.entries()[0].chunks.size(); ++c) {
          const auto& ch = dst.entries()[0].chunks[c];
          EXPECT_TRUE(FillOrCheck(false, 11 + i, t, global, ch.box, ch.view.bytes()));
        }
      } else if (parts[1] == 1) {
        // Sub-byte: saved rows 0-1 and 2-3 concatenate to the whole tensor's bytes.
        std::vector<std::byte> want(src_mem.bufs[0]);
        want.insert(want.end(), src_mem.bufs[1].begin(), src_mem.bufs[1].end());
        EXPECT_EQ(dst_mem.bufs[0], want);
      }
    }
  }
}

TEST(SaveLoad, SubByteChunksMustEndOnWholeBytes) {
  TempDir tmp;
  std::vector<std::byte> mem(8);
  StateDict sd;
  sd.add("f4", TensorView(mem.data(), DType::kF4, {3, 3}));  // 9 elements = 36 bits
  try {
    save(sd, tmp.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("whole byte"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f4"), std::string::npos) << e.what();
  }

  // A load box that splits a byte of an F4 row fails with a clear error.
  StateDict ok;
  std::vector<std::byte> whole(4);
  ok.add("f4", TensorView(whole.data(), DType::kF4, {2, 4}));
  ASSERT_NO_THROW(save(ok, tmp.Sub("ok")));
  StateDict dst;
  std::vector<std::byte> part(1);
  dst.add("f4", TensorView(part.data(), DType::kF4, {1, 2}), Chunk{{2, 4}, {0, 1}});
  try {
    load(dst, tmp.Sub("ok"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("whole bytes"), std::string::npos) << e.what();
  }
}

TEST(SaveLoad, ZeroDimEmptyChunksAndBytesEntries) {
  TempDir tmp;
  StateDict src;
  Chunks mem;
  AddChunks(src, mem, "scalar", DType::kF64, Shape(), {Box{Shape(), Shape()}}, true, 5);
  // torch.chunk of 6 rows into 4: 2, 2, 2, 0 — the last chunk is empty at offset (6, 0).
  AddChunks(src, mem, "uneven", DType::kF32, {6, 3}, Grid({6, 3}, {4, 1}), true, 6);
  src.add_bytes("optim.param_groups", std::string_view("{\"lr\": 0.001}"));
  src.add_bytes("empty", std::string_view(""));
  ASSERT_NO_THROW(save(src, tmp.path()));

  StateDict dst;
  Chunks dmem;
  AddChunks(dst, dmem, "scalar", DType::kF64, Shape(), {Box{Shape(), Shape()}}, false, 0);
  AddChunks(dst, dmem, "uneven", DType::kF32, {6, 3}, Grid({6, 3}, {1, 3}), false, 0);
  dst.add_bytes("optim.param_groups");
  dst.add_bytes("empty", std::string_view("stale"));
  LoadResult r = load(dst, tmp.path());
  EXPECT_EQ(r.entries_loaded, 4u);
  const auto& s = dst.find("scalar")->chunks[0];
  EXPECT_TRUE(FillOrCheck(false, 5, DType::kF64, Shape(), s.box, s.view.bytes()));
  for (const auto& c : dst.find("uneven")->chunks) {
    EXPECT_TRUE(FillOrCheck(false, 6, DType::kF32, {6, 3}, c.box, c.view.bytes()));
  }
  const auto& b = dst.find("optim.param_groups")->bytes;
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data()), b.size()), "{\"lr\": 0.001}");
  EXPECT_TRUE(dst.find("empty")->bytes.empty());
}

// Random global shapes, random save and load chunkings, every element checked.
TEST(SaveLoad, RandomizedReshardingProperty) {
  uint64_t seed = 20261129;
  if (const char* s = std::getenv("DCP_TEST_SEED")) seed = std::strtoull(s, nullptr, 10);
  std::mt19937_64 rng(seed);
  TempDir tmp;
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kU8, DType::kI64, DType::kC64};
  for (int iter = 0; iter < 40; ++iter) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " (set DCP_TEST_SEED), iteration " +
                 std::to_string(iter));
    StateDict src, dst;
    Chunks smem, dmem;
    int tensors = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < tensors; ++k) {
      int rank = 1 + static_cast<int>(rng() % 4);
      Shape global;
      std::vector<int> save_parts, load_parts;
      for (int d = 0; d < rank; ++d) {
        global.push_back(1 + static_cast<int64_t>(rng() % 9));
        save_parts.push_back(1 + static_cast<int>(rng() % 4));
        load_parts.push_back(1 + static_cast<int>(rng() % 4));
      }
      DType t = dtypes[rng() % std::size(dtypes)];
      std::string fqn = "t" + std::to_string(k);
      AddChunks(src, smem, fqn, t, global, Grid(global, save_parts), true, iter * 31 + k);
      AddChunks(dst, dmem, fqn, t, global, Grid(global, load_parts), false, 0);
    }
    const std::string dir = tmp.Sub("it" + std::to_string(iter));
    ASSERT_NO_THROW(save(src, dir));
    ASSERT_NO_THROW(load(dst, dir));
    for (int k = 0; k < tensors; ++k) {
      const StateEntry& e = dst.entries()[k];
      for (const auto& c : e.chunks) {
        ASSERT_TRUE(
            FillOrCheck(false, iter * 31 + k, e.dtype, e.global_shape, c.box, c.view.bytes()));
      }
    }
  }
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class Checks : public ::testing::Test {
 protected:
  void SetUp() override {
    AddChunks(src_, mem_, "layer.weight", DType::kBF16, {8, 4}, Grid({8, 4}, {2, 1}), true, 1);
    AddChunks(src_, mem_, "layer.bias", DType::kF32, {8}, Grid({8}, {1}), true, 2);
    src_.add_bytes("extra", std::string_view("abc"));
    save(src_, tmp_.path());
  }
  // A destination like the source, with the given overrides.
  StateDict Dest(DType wt = DType::kBF16, Shape ws = {8, 4}) {
    StateDict d;
    AddChunks(d, dmem_, "layer.weight", wt, ws, {Box::Whole(ws)}, false, 0);
    AddChunks(d, dmem_, "layer.bias", DType::kF32, {8}, {Box::Whole({8})}, false, 0);
    d.add_bytes("extra");
    return d;
  }
  std::string DataFile() {
    for (const auto& n : testing::ListFiles(tmp_.path(), "data-")) {
      if (n.ends_with(".safetensors")) return tmp_.Sub(n);
    }
    return "";
  }
  std::string Verify() {
    std::string out;
    testing::RunCommand(std::string(DCP_CLI_PATH) + " verify " + tmp_.path(), &out);
    return out;
  }
  int VerifyExit() {
    std::string out;
    return testing::RunCommand(std::string(DCP_CLI_PATH) + " verify " + tmp_.path(), &out);
  }

  TempDir tmp_;
  StateDict src_;
  Chunks mem_, dmem_;
};

TEST_F(Checks, MissingKeyUnlessPartial) {
  StateDict d = Dest();
  AddChunks(d, dmem_, "not.saved", DType::kF32, {2}, {Box::Whole({2})}, false, 0);
  std::string err = ErrorOf([&] { load(d, tmp_.path()); });
  EXPECT_NE(err.find("'not.saved' is not in the checkpoint"), std::string::npos) << err;
  EXPECT_NE(err.find(tmp_.path()), std::string::npos) << err;
  LoadResult r = load(d, tmp_.path(), {.allow_partial = true});
  EXPECT_EQ(r.entries_skipped, 1u);
  EXPECT_EQ(r.entries_loaded, 3u);
}

TEST_F(Checks, DtypeAndShapeMismatch) {
  StateDict d1 = Dest(DType::kF16);
  std::string err = ErrorOf([&] { load(d1, tmp_.path()); });
  EXPECT_NE(err.find("'layer.weight': dtype mismatch"), std::string::npos) << err;
  StateDict d2 = Dest(DType::kBF16, {8, 5});
  err = ErrorOf([&] { load(d2, tmp_.path()); });
  EXPECT_NE(err.find("'layer.weight': global shape mismatch"), std::string::npos) << err;
}

TEST_F(Checks, DestinationNotCovered) {
  // Rewrite the metadata without one stored chunk of layer.weight.
  auto& fs = storage::PosixFileSystem();
  auto md = checkpoint::ReadMetadata(fs, tmp_.path());
  ASSERT_TRUE(md.ok());
  const_cast<metadata::TensorMeta*>(md->FindTensor("layer.weight"))->chunks.pop_back();
  ASSERT_TRUE(checkpoint::CommitMetadata(fs, tmp_.path(), *md).ok());
  StateDict d = Dest();
  std::string err = ErrorOf([&] { load(d, tmp_.path()); });
  EXPECT_NE(err.find("'layer.weight': destination chunk"), std::string::npos) << err;
  EXPECT_NE(err.find("not covered"), std::string::npos) << err;
}

// Issue 19: a sealed metadata naming a 2^62-byte bytes entry (its file's size in the metadata
// raised to match) in a small file: one clear error naming the file, before any allocation
// (it used to throw std::bad_alloc, outside the error agreement).
TEST_F(Checks, BytesEntryLargerThanItsFileIsRefusedBeforeAllocating) {
  auto& fs = storage::PosixFileSystem();
  auto md = checkpoint::ReadMetadata(fs, tmp_.path());
  ASSERT_TRUE(md.ok());
  auto* b = const_cast<metadata::BytesMeta*>(md->FindBytes("extra"));
  ASSERT_NE(b, nullptr);
  b->byte_length = uint64_t{1} << 62;
  md->files[b->file].size = b->byte_offset + b->byte_length;
  ASSERT_TRUE(checkpoint::CommitMetadata(fs, tmp_.path(), *md).ok());
  StateDict d = Dest();
  std::string err = ErrorOf([&] { load(d, tmp_.path()); });
  EXPECT_NE(err.find("bytes entry 'extra'"), std::string::npos) << err;
  EXPECT_NE(err.find(" 3 bytes"), std::string::npos) << err;  // the file's real size
}

// The real file system, but opening a data file (reads) or creating one (writes) throws
// std::bad_alloc, as a large but legitimate buffer can on one rank.
class ThrowingFileSystem final : public testfs::ForwardingFileSystem {
 public:
  Result<std::unique_ptr<storage::WritableFile>> NewWritableFile(const std::string& p) override {
    if (IsDcpDataFileName(p)) throw std::bad_alloc();
    return base().NewWritableFile(p);
  }
  Result<std::unique_ptr<storage::ReadableFile>> OpenReadable(const std::string& p) override {
    if (IsDcpDataFileName(p)) throw std::bad_alloc();
    return base().OpenReadable(p);
  }

 private:
  static bool IsDcpDataFileName(const std::string& p) {
    return checkpoint::IsDcpDataFileName(std::filesystem::path(p).filename().string());
  }
};

// Issue 19 item 4: an exception on one rank (std::bad_alloc while writing or reading) becomes
// that rank's error inside the collectives: every rank fails at once with the same error
// naming it, instead of waiting for the timeout.
TEST(ExceptionsAtTheCollectiveBoundary, BadAllocOnOneRankIsOneErrorOnEveryRank) {
  TempDir tmp;
  ThrowingFileSystem throwing;
  for (const bool saving : {true, false}) {
    std::vector<Status> errors(2);
    testing::RunRanks(2, [&](const std::shared_ptr<Comm>& comm) {
      const int r = comm->rank();
      std::vector<float> data(32, 1.0f + r);
      StateDict sd;
      sd.add("w", TensorView(data.data(), DType::kF32, Shape{32}), Chunk{Shape{64}, {32 * r}});
      storage::FileSystem& fs =
          r == 1 ? static_cast<storage::FileSystem&>(throwing) : storage::PosixFileSystem();
      if (saving) {
        errors[r] = checkpoint::Save(sd, tmp.path(), {.comm = comm}, fs).status();
      } else {
        ASSERT_TRUE(
            checkpoint::Save(sd, tmp.path(), {.comm = comm}, storage::PosixFileSystem()).ok());
        errors[r] = checkpoint::Load(sd, tmp.path(), {.comm = comm}, fs).status();
      }
    });
    for (int r = 0; r < 2; ++r) {
      ASSERT_FALSE(errors[r].ok()) << (saving ? "save" : "load") << ": rank " << r;
      EXPECT_EQ(errors[r].message(), errors[0].message());
    }
    EXPECT_NE(errors[0].message().find("rank 1"), std::string::npos) << errors[0].message();
    EXPECT_NE(errors[0].message().find("out of memory (std::bad_alloc)"), std::string::npos)
        << errors[0].message();
  }
}

TEST_F(Checks, FlippedByteIsAChecksumErrorUnlessVerificationIsOff) {
  auto md = checkpoint::ReadMetadata(storage::PosixFileSystem(), tmp_.path());
  const auto& c = md->FindTensor("layer.bias")->chunks[0];
  testing::FlipByte(DataFile(), c.byte_offset + 3);
  StateDict d = Dest();
  std::string err = ErrorOf([&] { load(d, tmp_.path()); });
  EXPECT_NE(err.find("checksum mismatch"), std::string::npos) << err;
  EXPECT_NE(err.find("layer.bias"), std::string::npos) << err;
  EXPECT_NE(err.find(DataFile()), std::string::npos) << err;
  EXPECT_EQ(VerifyExit(), 1);
  std::string v = Verify();
  EXPECT_NE(v.find("layer.bias"), std::string::npos) << v;
  EXPECT_NE(v.find(DataFile()), std::string::npos) << v;
  StateDict d2 = Dest();
  EXPECT_NO_THROW(load(d2, tmp_.path(), {.verify_checksums = false}));
}

// A data file is also a safetensors file for other tools; its header is outside the chunk
// checksums, so verify reads it: every byte of every tensor entry in the header JSON (key,
// dtype, shape, offsets), flipped in turn, fails verify naming the file. Loads never read it.
TEST_F(Checks, EveryFlippedByteOfAHeaderTensorEntryFailsVerify) {
  const std::string path = DataFile();
  auto header = hf::ReadSafetensorsHeader(storage::PosixFileSystem(), path);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  std::string text(header->header_length, '\0');
  std::ifstream(path, std::ios::binary).seekg(8).read(text.data(), text.size());
  // The entries: from each key's opening quote to the closing brace of its object.
  std::vector<std::pair<uint64_t, uint64_t>> entries;
  for (const auto& t : header->tensors) {
    const size_t at = text.find("\"" + t.name + "\"");
    ASSERT_NE(at, std::string::npos) << t.name;
    entries.emplace_back(8 + at, 8 + text.find('}', at) + 1);
  }
  int flips = 0;
  for (const auto& [begin, end] : entries) {
    for (uint64_t b = begin; b < end; ++b, ++flips) {
      testing::FlipByte(path, b);
      auto r = checkpoint::Verify(storage::PosixFileSystem(), tmp_.path());
      EXPECT_FALSE(r.ok()) << "a flipped byte at " << b << " of the header passed verify";
      if (!r.ok()) {
        EXPECT_NE(r.status().message().find(path), std::string::npos);
      }
      testing::FlipByte(path, b);  // back
    }
  }
  EXPECT_GT(flips, 40);
  EXPECT_TRUE(checkpoint::Verify(storage::PosixFileSystem(), tmp_.path()).ok());
}

// Several chunks of one tensor in one data file are keyed "<fqn>.__dcp_chunk_<k>" in its
// header, k in metadata order: verify finds each under its key, and a key naming another
// chunk's place (two keys swapped) fails it.
TEST(VerifyHeaders, SeveralChunksOfATensorInOneFileAreKeyedInMetadataOrder) {
  TempDir tmp;
  std::vector<float> a(9, 1.0f), b(9, 2.0f), c(4, 3.0f);
  StateDict sd;
  sd.add("w", TensorView(a.data(), DType::kF32, {3, 3}), Chunk{{6, 3}, {0, 0}});
  sd.add("w", TensorView(b.data(), DType::kF32, {3, 3}), Chunk{{6, 3}, {3, 0}});
  sd.add("v", TensorView(c.data(), DType::kF32, {4}));
  auto saved = checkpoint::Save(sd, tmp.path(), {}, storage::PosixFileSystem());
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  auto md = checkpoint::ReadMetadata(storage::PosixFileSystem(), tmp.path());
  ASSERT_TRUE(md.ok());
  const std::string path = tmp.Sub(md->files[md->FindTensor("w")->chunks[0].file].name);
  auto header = hf::ReadSafetensorsHeader(storage::PosixFileSystem(), path);
  ASSERT_TRUE(header.ok());
  std::vector<std::string> names;
  for (const auto& t : header->tensors) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"v", "w.__dcp_chunk_0", "w.__dcp_chunk_1"}));
  ASSERT_TRUE(checkpoint::Verify(storage::PosixFileSystem(), tmp.path()).ok());
  // Swap the two keys in place (same length): each chunk now named as the other.
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  std::string text(header->header_length, '\0');
  f.seekg(8).read(text.data(), text.size());
  const size_t k0 = text.find("w.__dcp_chunk_0"), k1 = text.find("w.__dcp_chunk_1");
  ASSERT_NE(k0, std::string::npos);
  ASSERT_NE(k1, std::string::npos);
  text[k0 + 14] = '1';
  text[k1 + 14] = '0';
  f.seekp(8).write(text.data(), text.size());
  f.close();
  auto r = checkpoint::Verify(storage::PosixFileSystem(), tmp.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not describe tensor 'w'"), std::string::npos)
      << r.status().message();
}

TEST_F(Checks, EveryFlippedDataByteFailsVerify) {
  // Flip each byte of the tensor data region in turn (through the library's Verify).
  EXPECT_EQ(VerifyExit(), 0) << Verify();
  auto md = checkpoint::ReadMetadata(storage::PosixFileSystem(), tmp_.path());
  for (const auto& t : md->tensors) {
    for (const auto& c : t.chunks) {
      for (uint64_t b = 0; b < c.byte_length; ++b) {
        const std::string path = tmp_.Sub(md->files[c.file].name);
        testing::FlipByte(path, c.byte_offset + b);
        auto r = checkpoint::Verify(storage::PosixFileSystem(), tmp_.path());
        EXPECT_FALSE(r.ok()) << t.fqn << " byte " << b;
        testing::FlipByte(path, c.byte_offset + b);
      }
    }
  }
}

TEST_F(Checks, TruncatedAndMissingDataFiles) {
  const std::string f = DataFile();
  testing::TruncateFile(f, 100);
  StateDict d = Dest();
  std::string err = ErrorOf([&] { load(d, tmp_.path()); });
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  EXPECT_NE(err.find(f), std::string::npos) << err;
  EXPECT_EQ(VerifyExit(), 1);
  EXPECT_NE(Verify().find(f), std::string::npos);
  std::filesystem::remove(f);
  err = ErrorOf([&] { load(d, tmp_.path()); });
  EXPECT_NE(err.find("is missing"), std::string::npos) << err;
  EXPECT_NE(err.find(f), std::string::npos) << err;
  EXPECT_NE(Verify().find("is missing"), std::string::npos);
}

TEST_F(Checks, DeletedGarbageAndForeignMetadata) {
  const std::string meta = tmp_.Sub(std::string(checkpoint::kMetadataName));
  std::string good;
  {
    std::ifstream in(meta, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& data) {
    std::ofstream out(meta, std::ios::binary | std::ios::trunc);
    out << data;
  };
  struct Case {
    std::string name, data, want;
  };
  // An intact file of a newer version: resealed (a bare edit of the version byte is corruption,
  // which the header hash catches).
  std::string other_version = good;
  other_version[8] = 7;
  {
    const uint64_t h =
        metadata::SealHash(other_version, std::string_view(other_version).substr(32), 7);
    for (int i = 0; i < 8; ++i) other_version[24 + i] = static_cast<char>(h >> (8 * i));
  }
  std::string corrupt_body = good;
  corrupt_body[good.size() - 3] ^= 1;
  for (const Case& c :
       {Case{"garbage", "this is not metadata at all, not at all!!", "not a dcp metadata file"},
        Case{"other version", other_version, "version 7"},
        Case{"corrupt body", corrupt_body, "checksum"},
        Case{"truncated", good.substr(0, good.size() - 5), "truncated"}}) {
    SCOPED_TRACE(c.name);
    write(c.data);
    StateDict d = Dest();
    std::string err = ErrorOf([&] { load(d, tmp_.path()); });
    EXPECT_NE(err.find(c.want), std::string::npos) << err;
    EXPECT_NE(err.find(tmp_.path()), std::string::npos) << err;
    EXPECT_EQ(VerifyExit(), 1);
    EXPECT_NE(Verify().find(c.want), std::string::npos) << Verify();
  }
  std::filesystem::remove(meta);
  StateDict d = Dest();
  std::string err = ErrorOf([&] { load(d, tmp_.path()); });
  EXPECT_NE(err.find("no committed metadata"), std::string::npos) << err;
  EXPECT_EQ(VerifyExit(), 1);
}

TEST(SaveLoad, OverwriteReplacesAndCollectsOldFiles) {
  TempDir tmp;
  StateDict a, b;
  Chunks ma, mb;
  AddChunks(a, ma, "w", DType::kF32, {16}, {Box::Whole({16})}, true, 1);
  AddChunks(b, mb, "w", DType::kF32, {16}, {Box::Whole({16})}, true, 2);
  save(a, tmp.path());
  auto first = testing::ListFiles(tmp.path(), "data-");
  save(b, tmp.path());
  auto second = testing::ListFiles(tmp.path(), "data-");
  ASSERT_EQ(second.size(), 1u);
  EXPECT_NE(first, second);
  StateDict d;
  Chunks md;
  AddChunks(d, md, "w", DType::kF32, {16}, {Box::Whole({16})}, false, 0);
  load(d, tmp.path());
  EXPECT_TRUE(FillOrCheck(false, 2, DType::kF32, {16}, Box::Whole({16}), md.bufs[0].data()));
}

// Frameworks find torch DCP checkpoints by their `.metadata`: a commit publishes the probe,
// replacing a torch checkpoint's own (the directory holds a dcp checkpoint now), and the probe
// never appears before the commit.
TEST(SaveLoad, CommitPublishesTheTorchProbe) {
  TempDir tmp;
  StateDict a;
  Chunks m;
  AddChunks(a, m, "w", DType::kF32, {16}, {Box::Whole({16})}, true, 1);
  auto& posix = storage::PosixFileSystem();
  const std::string name(checkpoint::kTorchProbeName);
  for (int64_t n = 0;; ++n) {  // a save failing at every operation in turn
    const std::string dir = tmp.Sub("torch" + std::to_string(n));
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/" + name) << "torch's own pickle";
    testfs::FaultFileSystem fs(posix);
    fs.FailAt(n);
    const bool ok = checkpoint::Save(a, dir, {}, fs).ok();
    auto probe = storage::ReadWholeFile(posix, storage::JoinPath(dir, name));
    ASSERT_TRUE(probe.ok());
    if (*probe != "torch's own pickle") {  // replaced: only ever by the probe, after the commit
      EXPECT_EQ(*probe, checkpoint::TorchProbeBytes()) << "op " << n;
      EXPECT_TRUE(std::filesystem::exists(dir + "/dcp.metadata")) << "op " << n;
    }
    // A failure in the probe's own write leaves the committed save a success (best effort).
    if (ok) EXPECT_TRUE(std::filesystem::exists(dir + "/dcp.metadata")) << "op " << n;
    if (ok && *probe == checkpoint::TorchProbeBytes()) break;
    ASSERT_LT(n, 1000);
  }
  const std::string_view bytes = checkpoint::TorchProbeBytes();
  EXPECT_EQ(bytes.substr(0, 3), std::string_view("\x80\x02"
                                                 "c"));
  EXPECT_EQ(bytes.find('.'), bytes.size() - 1) << "a dot in the module name would split it";
  const std::string dir = tmp.Sub("again");
  save(a, dir);
  save(a, dir);  // the probe stays; no tmp file is left
  EXPECT_EQ(*storage::ReadWholeFile(posix, storage::JoinPath(dir, name)), bytes);
  EXPECT_TRUE(testing::ListFiles(dir, name + ".tmp").empty());
}

TEST(SaveLoad, PlanCacheHitOnSecondSaveOfSameStructure) {
  checkpoint::ClearSavePlanCache();
  TempDir tmp;
  StateDict a;
  Chunks m;
  AddChunks(a, m, "w", DType::kF32, {16}, Grid({16}, {2}), true, 1);
  EXPECT_FALSE(save(a, tmp.Sub("1")).plan_cache_hit);
  EXPECT_TRUE(save(a, tmp.Sub("2")).plan_cache_hit);
  EXPECT_FALSE(save(a, tmp.Sub("3"), {.plan_cache = false}).plan_cache_hit);
  AddChunks(a, m, "v", DType::kF32, {4}, {Box::Whole({4})}, true, 1);
  EXPECT_FALSE(save(a, tmp.Sub("4")).plan_cache_hit);
}

// A save interrupted at every step leaves the earlier checkpoint loadable (or the new one,
// once its metadata is committed) and never a loadable mix.
TEST(SaveLoad, CrashAtEveryStepKeepsACompleteCheckpoint) {
  TempDir tmp;
  const Shape global{64, 16};
  StateDict a, b;
  Chunks ma, mb;
  AddChunks(a, ma, "w", DType::kF32, global, Grid(global, {4, 1}), true, 1);
  a.add_bytes("step", std::string_view("100"));
  AddChunks(b, mb, "w", DType::kF32, global, Grid(global, {4, 1}), true, 2);
  b.add_bytes("step", std::string_view("200"));
  auto& posix = storage::PosixFileSystem();

  // Crashes of a first save never leave a loadable checkpoint.
  for (int64_t n = 0;; ++n) {
    const std::string dir = tmp.Sub("fresh" + std::to_string(n));
    testfs::FaultFileSystem fs(posix);
    fs.FailAt(n);
    bool ok = checkpoint::Save(a, dir, {}, fs).ok();
    fs.SimulateCrash();
    StateDict d;
    Chunks md;
    AddChunks(d, md, "w", DType::kF32, global, {Box::Whole(global)}, false, 0);
    d.add_bytes("step");
    auto r = checkpoint::Load(d, dir, {}, posix);
    if (ok) {
      EXPECT_TRUE(r.ok());
      break;
    }
    if (r.ok()) {
      // Only possible when the failure hit after the metadata rename (directory sync).
      EXPECT_TRUE(
          FillOrCheck(false, 1, DType::kF32, global, Box::Whole(global), md.bufs[0].data()));
    } else {
      // Nothing committed: the directory holds no metadata, or (a failure before it was
      // created) does not exist.
      const std::string& m = r.status().message();
      EXPECT_TRUE(m.find("no committed metadata") != std::string::npos ||
                  m.find("does not exist") != std::string::npos)
          << "op " << n << ": " << m;
    }
  }

  // Crashes while overwriting leave exactly the old or exactly the new checkpoint.
  int old_seen = 0, new_seen = 0;
  for (int64_t n = 0;; ++n) {
    const std::string dir = tmp.Sub("over" + std::to_string(n));
    ASSERT_TRUE(checkpoint::Save(a, dir, {}, posix).ok());
    testfs::FaultFileSystem fs(posix);
    fs.FailAt(n);
    bool ok = checkpoint::Save(b, dir, {}, fs).ok();
    fs.SimulateCrash();
    StateDict d;
    Chunks md;
    AddChunks(d, md, "w", DType::kF32, global, {Box::Whole(global)}, false, 0);
    d.add_bytes("step");
    auto r = checkpoint::Load(d, dir, {}, posix);
    ASSERT_TRUE(r.ok()) << "crash at op " << n << ": " << r.status().message();
    const auto& step = d.find("step")->bytes;
    std::string s(reinterpret_cast<const char*>(step.data()), step.size());
    const uint64_t seed = s == "100" ? 1 : 2;
    (s == "100" ? old_seen : new_seen)++;
    EXPECT_TRUE(
        FillOrCheck(false, seed, DType::kF32, global, Box::Whole(global), md.bufs[0].data()))
        << "mix of old and new after a crash at op " << n;
    if (ok) break;
  }
  EXPECT_GT(old_seen, 3);
  EXPECT_GE(new_seen, 1);
}

}  // namespace
}  // namespace dcp
