#include "metadata/codec.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "core/checksum.h"

namespace dcp::metadata {
namespace {

// ---- Helpers ---------------------------------------------------------------------------------

// Writes a body by hand, following docs/format.md rather than codec.cc, so that a test can
// state an encoding the encoder would never produce.
class BodyBuilder {
 public:
  BodyBuilder& Varint(uint64_t v) {
    while (v >= 0x80) {
      body_.push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    body_.push_back(static_cast<char>(v));
    return *this;
  }
  BodyBuilder& Fixed64(uint64_t v) {
    for (int i = 0; i < 8; ++i) body_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  BodyBuilder& Byte(uint8_t b) {
    body_.push_back(static_cast<char>(b));
    return *this;
  }
  BodyBuilder& String(std::string_view s) {
    Varint(s.size());
    body_.append(s);
    return *this;
  }
  BodyBuilder& Raw(std::string_view s) {
    body_.append(s);
    return *this;
  }
  const std::string& body() const { return body_; }

 private:
  std::string body_;
};

void PutLE(std::string& out, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out[at + i] = static_cast<char>(v >> (8 * i));
}

// A complete encoding around `body`: header with the right length and XXH3-64, computed here
// from the text of docs/format.md (not with the codec's own SealHash): version 1 hashes the body,
// every later version header bytes 0..23 followed by the body.
// Version 3 unless told: what a save without references writes (metadata::VersionFor).
std::string Seal(std::string_view body, uint32_t version = 3, uint32_t flags = 0) {
  std::string out(kHeaderSize, '\0');
  for (int i = 0; i < 8; ++i) out[i] = kMagic[i];
  PutLE(out, 8, version, 4);
  PutLE(out, 12, flags, 4);
  PutLE(out, 16, body.size(), 8);
  std::string hashed = version == 1 ? std::string(body) : out.substr(0, 24) + std::string(body);
  PutLE(out, 24, XXH3_64bits(hashed.data(), hashed.size()), 8);
  out.append(body);
  return out;
}

// Recomputes the body length and hash of an encoding whose body a test has edited.
std::string Reseal(std::string_view encoded) { return Seal(encoded.substr(kHeaderSize)); }

std::string Body(std::string_view encoded) { return std::string(encoded.substr(kHeaderSize)); }

void ExpectSameMetadata(const Metadata& a, const Metadata& b) {
  EXPECT_EQ(a.save_id, b.save_id);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.block_size, b.block_size);
  ASSERT_EQ(a.files.size(), b.files.size());
  for (size_t i = 0; i < a.files.size(); ++i) {
    EXPECT_EQ(a.files[i].name, b.files[i].name);
    EXPECT_EQ(a.files[i].size, b.files[i].size);
    EXPECT_EQ(a.files[i].base, b.files[i].base);
  }
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const TensorMeta& x = a.tensors[i];
    const TensorMeta& y = b.tensors[i];
    SCOPED_TRACE(x.fqn);
    EXPECT_EQ(x.fqn, y.fqn);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.global_shape, y.global_shape);
    ASSERT_EQ(x.chunks.size(), y.chunks.size());
    for (size_t j = 0; j < x.chunks.size(); ++j) {
      EXPECT_EQ(x.chunks[j].box, y.chunks[j].box);
      EXPECT_EQ(x.chunks[j].file, y.chunks[j].file);
      EXPECT_EQ(x.chunks[j].byte_offset, y.chunks[j].byte_offset);
      EXPECT_EQ(x.chunks[j].byte_length, y.chunks[j].byte_length);
      EXPECT_EQ(x.chunks[j].xxh3, y.chunks[j].xxh3);
      EXPECT_EQ(x.chunks[j].block_xxh3, y.chunks[j].block_xxh3);
    }
  }
  ASSERT_EQ(a.bytes.size(), b.bytes.size());
  for (size_t i = 0; i < a.bytes.size(); ++i) {
    EXPECT_EQ(a.bytes[i].fqn, b.bytes[i].fqn);
    EXPECT_EQ(a.bytes[i].file, b.bytes[i].file);
    EXPECT_EQ(a.bytes[i].byte_offset, b.bytes[i].byte_offset);
    EXPECT_EQ(a.bytes[i].byte_length, b.bytes[i].byte_length);
    EXPECT_EQ(a.bytes[i].xxh3, b.bytes[i].xxh3);
  }
}

Metadata RoundTrip(const Metadata& md) {
  Result<Metadata> out = Decode(Encode(md));
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? std::move(out).value() : Metadata{};
}

// Decodes and expects an error with `code` whose message contains `substr`.
void ExpectError(std::string_view encoded, StatusCode code, std::string_view substr) {
  Result<Metadata> out = Decode(encoded);
  ASSERT_FALSE(out.ok()) << "decoded an encoding that should be rejected";
  EXPECT_EQ(out.status().code(), code) << out.status().ToString();
  EXPECT_NE(out.status().message().find(substr), std::string::npos)
      << "message '" << out.status().message() << "' lacks '" << substr << "'";
}

StoredChunk Chunk(DType dtype, Box box, uint32_t file, uint64_t offset, uint64_t xxh3 = 7) {
  StoredChunk c;
  c.byte_length = *DTypeBytes(dtype, box.NumElements());
  c.box = std::move(box);
  c.file = file;
  c.byte_offset = offset;
  c.xxh3 = xxh3;
  return c;
}

// One tensor, one 64-byte file, one bytes entry: small enough to loop over every byte.
Metadata SmallMetadata() {
  Metadata md;
  md.save_id = 0x1122334455667788ULL;
  md.world_size = 2;
  md.files = {{"data-1122334455667788-r00000.safetensors", 64},
              {"data-1122334455667788-r00000.bytes", 5}};
  TensorMeta t;
  t.fqn = "w";
  t.dtype = DType::kF32;
  t.global_shape = Shape{4, 2};
  t.chunks = {Chunk(DType::kF32, Box{Shape{0, 0}, Shape{2, 2}}, 0, 16, 0xAB),
              Chunk(DType::kF32, Box{Shape{2, 0}, Shape{2, 2}}, 0, 32, 0xCD)};
  md.tensors.push_back(t);
  md.bytes.push_back({"step", 1, 0, 5, 0xEF});
  return md;
}

// SmallMetadata plus a tensor whose chunks have block checksums (4 KiB blocks): one of three
// blocks, the last one short, and one of exactly one block (no block checksums).
Metadata BlockMetadata() {
  Metadata md = SmallMetadata();
  md.block_size = 4096;
  md.files[0].size = 64 + 10000 + 4096;
  TensorMeta t;
  t.fqn = "x";
  t.dtype = DType::kU8;
  t.global_shape = Shape{14096};
  StoredChunk big = Chunk(DType::kU8, Box{Shape{0}, Shape{10000}}, 0, 64);
  big.block_xxh3 = {0x111, 0x222, 0x333};
  big.xxh3 = BlockDigest(big.block_xxh3);
  t.chunks = {big, Chunk(DType::kU8, Box{Shape{10000}, Shape{4096}}, 0, 10064, 0x444)};
  md.tensors.push_back(t);
  return md;
}

// A metadata with a single tensor, built for the structural rejection tests.
Metadata OneTensor(DType dtype, Shape shape, Box box, uint64_t file_size = 1 << 20) {
  Metadata md;
  md.files = {{"f", file_size}};
  TensorMeta t;
  t.fqn = "t";
  t.dtype = dtype;
  t.global_shape = shape;
  StoredChunk c;
  c.box = box;
  t.chunks.push_back(c);
  md.tensors.push_back(t);
  return md;
}

// ---- Round trips ------------------------------------------------------------------------------

TEST(CodecTest, EmptyMetadataRoundTrips) {
  Metadata md;
  std::string enc = Encode(md);
  EXPECT_EQ(enc.size(), kHeaderSize + 8 + 5);  // save_id + five one-byte varints
  ExpectSameMetadata(md, RoundTrip(md));
}

TEST(CodecTest, SmallMetadataRoundTrips) {
  ExpectSameMetadata(SmallMetadata(), RoundTrip(SmallMetadata()));
}

TEST(CodecTest, EveryDTypeRoundTrips) {
  Metadata md;
  md.save_id = 42;
  md.files = {{"f0", 1 << 20}};
  uint64_t offset = 0;
  for (int code = 0; code < kNumDTypes; ++code) {
    DType dtype = static_cast<DType>(code);
    TensorMeta t;
    char name[16];
    std::snprintf(name, sizeof(name), "t%02d", code);
    t.fqn = name;
    t.dtype = dtype;
    // 4 x 6 split in two row blocks of 12 elements: whole bytes for 4- and 6-bit dtypes too.
    t.global_shape = Shape{4, 6};
    for (int64_t row : {0, 2}) {
      StoredChunk c = Chunk(dtype, Box{Shape{row, 0}, Shape{2, 6}}, 0, offset, code * 100 + row);
      offset += c.byte_length;
      t.chunks.push_back(c);
    }
    md.tensors.push_back(t);
  }
  Metadata out = RoundTrip(md);
  ExpectSameMetadata(md, out);
  ASSERT_EQ(out.tensors.size(), static_cast<size_t>(kNumDTypes));
  EXPECT_EQ(out.tensors[static_cast<int>(DType::kF4)].chunks[0].byte_length, 6u);
  EXPECT_EQ(out.tensors[static_cast<int>(DType::kF6_E2M3)].chunks[0].byte_length, 9u);
  EXPECT_EQ(out.tensors[static_cast<int>(DType::kF64)].chunks[1].byte_length, 96u);
}

TEST(CodecTest, ZeroDimAndEmptyChunksRoundTrip) {
  Metadata md;
  md.files = {{"f", 10}};
  TensorMeta scalar;
  scalar.fqn = "a.scalar";
  scalar.dtype = DType::kF32;
  scalar.global_shape = Shape{};
  scalar.chunks = {Chunk(DType::kF32, Box{Shape{}, Shape{}}, 0, 0)};
  TensorMeta empty;
  empty.fqn = "b.empty";
  empty.dtype = DType::kBF16;
  empty.global_shape = Shape{0, 5};
  // A zero-length chunk may sit at the very end of its file.
  empty.chunks = {Chunk(DType::kBF16, Box{Shape{0, 0}, Shape{0, 5}}, 0, 10)};
  TensorMeta no_chunks;
  no_chunks.fqn = "c.no_chunks";
  no_chunks.dtype = DType::kI64;
  no_chunks.global_shape = Shape{3};
  md.tensors = {scalar, empty, no_chunks};
  Metadata out = RoundTrip(md);
  ExpectSameMetadata(md, out);
  EXPECT_EQ(out.tensors[0].chunks[0].byte_length, 4u);
  EXPECT_EQ(out.tensors[1].chunks[0].byte_length, 0u);
}

TEST(CodecTest, EightDimsRoundTrip) {
  Metadata md = OneTensor(DType::kU8, Shape{2, 1, 3, 1, 2, 1, 1, 2},
                          Box::Whole(Shape{2, 1, 3, 1, 2, 1, 1, 2}));
  md.tensors[0].chunks[0].byte_length = 24;
  ExpectSameMetadata(md, RoundTrip(md));
}

TEST(CodecTest, BytesEntriesAndManyFilesRoundTrip) {
  Metadata md;
  md.save_id = ~0ULL;
  md.world_size = 1000;
  for (int r = 0; r < 1000; ++r) {
    char name[64];
    std::snprintf(name, sizeof(name), "data-ffffffffffffffff-r%05d.bytes", r);
    md.files.push_back({name, static_cast<uint64_t>(r) * 1000});
  }
  for (int i = 0; i < 500; ++i) {
    char fqn[32];
    std::snprintf(fqn, sizeof(fqn), "extra.%04d", i);
    uint32_t file = static_cast<uint32_t>(2 * i + 1);
    md.bytes.push_back({fqn, file, static_cast<uint64_t>(i), 7, ~static_cast<uint64_t>(i)});
  }
  md.bytes.push_back({"zz.empty", 0, 0, 0, 0});  // empty entry in an empty file
  ExpectSameMetadata(md, RoundTrip(md));
}

TEST(CodecTest, ExtremeValuesRoundTrip) {
  // Ten-byte varints, the largest world size and checksum.
  Metadata md;
  md.save_id = 0x8000000000000001ULL;
  md.world_size = UINT32_MAX;
  const uint64_t big = uint64_t{1} << 62;
  md.files = {{"f", ~0ULL}};
  TensorMeta t;
  t.fqn = "t";
  t.dtype = DType::kU8;
  t.global_shape = Shape{INT64_MAX};
  t.chunks = {Chunk(DType::kU8, Box{Shape{INT64_MAX - 3}, Shape{3}}, 0, big, ~0ULL)};
  md.tensors.push_back(t);
  md.bytes.push_back({"b", 0, ~0ULL - 1, 1, 1});
  ExpectSameMetadata(md, RoundTrip(md));
}

// Found by fuzz/checkpoint_fuzz.cc: a tensor and a bytes entry of one name could decode, and
// the caller's state dict (one entry per name) then threw while building the load's template.
TEST(CodecTest, ATensorAndABytesEntryOfOneNameAreRefused) {
  Metadata md;
  md.files = {{"f", 16}};
  TensorMeta t;
  t.fqn = "x";
  t.dtype = DType::kU8;
  t.global_shape = Shape{4};
  t.chunks = {Chunk(DType::kU8, Box{Shape{0}, Shape{4}}, 0, 0, 1)};
  md.tensors.push_back(t);
  md.bytes.push_back({"x", 0, 4, 4, 1});
  auto back = Decode(Encode(md));
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("'x' is both a tensor and a bytes entry"),
            std::string::npos)
      << back.status().message();
}

// ---- The format as docs/format.md states it -----------------------------------------------------

TEST(CodecTest, HeaderLayoutMatchesSpec) {
  std::string enc = Encode(SmallMetadata());
  ASSERT_GE(enc.size(), kHeaderSize);
  EXPECT_EQ(enc.substr(0, 8), std::string("\x89"
                                          "DCPMETA",
                                          8));
  EXPECT_EQ(enc.substr(8, 4), std::string("\x03\x00\x00\x00", 4));   // version 3, LE
  EXPECT_EQ(enc.substr(12, 4), std::string("\x00\x00\x00\x00", 4));  // flags 0
  EXPECT_EQ(enc, Seal(Body(enc)));  // body length and XXH3-64 of header bytes 0..23 + body
}

TEST(CodecTest, BodyMatchesSpec) {
  BodyBuilder b;
  b.Fixed64(0x1122334455667788ULL).Varint(2).Varint(0);  // save_id, world_size, block_size
  b.Varint(2)                                            // files
      .String("data-1122334455667788-r00000.safetensors")
      .Varint(64)
      .String("data-1122334455667788-r00000.bytes")
      .Varint(5);
  b.Varint(1).String("w").Byte(static_cast<uint8_t>(DType::kF32)).Byte(2).Varint(4).Varint(2);
  b.Varint(2);  // chunks: file, byte_offset, xxh3, offsets..., lengths...
  b.Varint(0).Varint(16).Fixed64(0xAB).Varint(0).Varint(0).Varint(2).Varint(2);
  b.Varint(0).Varint(32).Fixed64(0xCD).Varint(2).Varint(0).Varint(2).Varint(2);
  b.Varint(1).String("step").Varint(1).Varint(0).Varint(5).Fixed64(0xEF);
  EXPECT_EQ(Encode(SmallMetadata()), Seal(b.body()));
}

TEST(CodecTest, BlockChecksumsMatchSpec) {
  // Version 3: block_size after world_size; a chunk longer than one block is followed by one
  // fixed64 per block, and its xxh3 is XXH3-64 of those as little-endian u64s.
  BodyBuilder b;
  b.Fixed64(0x1122334455667788ULL).Varint(2).Varint(4096);
  b.Varint(2)
      .String("data-1122334455667788-r00000.safetensors")
      .Varint(64 + 10000 + 4096)
      .String("data-1122334455667788-r00000.bytes")
      .Varint(5);
  b.Varint(2).String("w").Byte(static_cast<uint8_t>(DType::kF32)).Byte(2).Varint(4).Varint(2);
  b.Varint(2);
  b.Varint(0).Varint(16).Fixed64(0xAB).Varint(0).Varint(0).Varint(2).Varint(2);
  b.Varint(0).Varint(32).Fixed64(0xCD).Varint(2).Varint(0).Varint(2).Varint(2);
  b.String("x").Byte(static_cast<uint8_t>(DType::kU8)).Byte(1).Varint(14096);
  b.Varint(2);
  BodyBuilder hashes;
  hashes.Fixed64(0x111).Fixed64(0x222).Fixed64(0x333);
  const uint64_t digest = XXH3_64bits(hashes.body().data(), hashes.body().size());
  b.Varint(0).Varint(64).Fixed64(digest).Varint(0).Varint(10000).Raw(hashes.body());
  b.Varint(0).Varint(10064).Fixed64(0x444).Varint(10000).Varint(4096);  // one block: none
  b.Varint(1).String("step").Varint(1).Varint(0).Varint(5).Fixed64(0xEF);
  EXPECT_EQ(Encode(BlockMetadata()), Seal(b.body()));
  ExpectSameMetadata(BlockMetadata(), RoundTrip(BlockMetadata()));
}

TEST(CodecTest, RejectsBadBlockChecksums) {
  // The chunk checksum must be the digest of its block checksums.
  Metadata md = BlockMetadata();
  md.tensors[1].chunks[0].block_xxh3[1] ^= 1;
  std::string enc = Encode(md);
  ExpectError(enc, StatusCode::kDataLoss, "checksum does not match its block checksums");
  // Block sizes: 0 or a power of two from 4 KiB to 2^40.
  for (uint64_t bad : {uint64_t{1}, uint64_t{2048}, uint64_t{5000}, uint64_t{1} << 41}) {
    SCOPED_TRACE(bad);
    BodyBuilder b;
    b.Fixed64(1).Varint(1).Varint(bad).Varint(0).Varint(0).Varint(0);
    ExpectError(Seal(b.body()), StatusCode::kDataLoss, "checksum block size");
  }
  // Fewer block checksums than the chunk has blocks: the body ends early, before any
  // allocation for them.
  std::string body = Body(Encode(BlockMetadata()));
  const size_t cut = body.find(std::string("\x33\x03\0\0\0\0\0\0", 8));
  ASSERT_NE(cut, std::string::npos);
  ExpectError(Seal(body.substr(0, cut)), StatusCode::kDataLoss, "body ends early");
}

// ---- Header and integrity rejections ---------------------------------------------------------

TEST(CodecTest, RejectsBadMagic) {
  std::string enc = Encode(SmallMetadata());
  for (int i = 0; i < 8; ++i) {
    std::string bad = enc;
    bad[i] ^= 0x20;
    ExpectError(bad, StatusCode::kDataLoss, "not a dcp metadata file");
  }
  ExpectError("PK\x03\x04 definitely a zip file, not metadata", StatusCode::kDataLoss,
              "not a dcp metadata file");
}

TEST(CodecTest, RejectsOtherVersions) {
  // Intact files of another version (sealed by the version-2 rule every later version keeps).
  std::string body = Body(Encode(SmallMetadata()));
  ExpectError(Seal(body, 5), StatusCode::kFailedPrecondition, "metadata format version 5");
  ExpectError(Seal(body, 0), StatusCode::kFailedPrecondition, "metadata format version 0");
  ExpectError(Seal(body, 0x01000000), StatusCode::kFailedPrecondition, "16777216");
}

// Version 4: each file's name and size are followed by its directory (empty: the checkpoint's
// own; else a sibling's name). Written only when some file lies in a base's directory, so every
// checkpoint without references stays readable by builds that read version 3.
TEST(CodecTest, ReferencesToBaseFilesMatchSpecAndRoundTrip) {
  Metadata md = SmallMetadata();
  EXPECT_EQ(VersionFor(md), 3u);
  md.files[0].base = "step_000000100";
  EXPECT_EQ(VersionFor(md), 4u);
  BodyBuilder b;
  b.Fixed64(0x1122334455667788ULL).Varint(2).Varint(0);
  b.Varint(2)
      .String("data-1122334455667788-r00000.safetensors")
      .Varint(64)
      .String("step_000000100")
      .String("data-1122334455667788-r00000.bytes")
      .Varint(5)
      .String("");
  b.Varint(1).String("w").Byte(static_cast<uint8_t>(DType::kF32)).Byte(2).Varint(4).Varint(2);
  b.Varint(2);
  b.Varint(0).Varint(16).Fixed64(0xAB).Varint(0).Varint(0).Varint(2).Varint(2);
  b.Varint(0).Varint(32).Fixed64(0xCD).Varint(2).Varint(0).Varint(2).Varint(2);
  b.Varint(1).String("step").Varint(1).Varint(0).Varint(5).Fixed64(0xEF);
  const std::string enc = Encode(md);
  EXPECT_EQ(enc, Seal(b.body(), 4));
  auto back = Decode(enc);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameMetadata(md, *back);
  // A base is one sibling's name: nothing that climbs, descends or is empty-but-dotted.
  const std::vector<std::string> bads = {".", "..", "a/b", "/abs", std::string("a\0b", 3)};
  for (const std::string& bad : bads) {
    Metadata m = SmallMetadata();
    m.files[1].base = bad;
    BodyBuilder x;
    x.Fixed64(1).Varint(1).Varint(0).Varint(1).String("f").Varint(0).String(bad);
    x.Varint(0).Varint(0);
    ExpectError(Seal(x.body(), 4), StatusCode::kDataLoss, "bad base directory");
  }
}

TEST(CodecTest, ReadsVersion1And2Files) {
  // Versions 1 (body-only hash) and 2 (no block checksums) were written by earlier builds;
  // they must stay readable. Their body is the version-3 body without block_size and block
  // checksums: SmallMetadata's, written by hand as in BodyMatchesSpec.
  BodyBuilder b;
  b.Fixed64(0x1122334455667788ULL).Varint(2);
  b.Varint(2)
      .String("data-1122334455667788-r00000.safetensors")
      .Varint(64)
      .String("data-1122334455667788-r00000.bytes")
      .Varint(5);
  b.Varint(1).String("w").Byte(static_cast<uint8_t>(DType::kF32)).Byte(2).Varint(4).Varint(2);
  b.Varint(2);
  b.Varint(0).Varint(16).Fixed64(0xAB).Varint(0).Varint(0).Varint(2).Varint(2);
  b.Varint(0).Varint(32).Fixed64(0xCD).Varint(2).Varint(0).Varint(2).Varint(2);
  b.Varint(1).String("step").Varint(1).Varint(0).Varint(5).Fixed64(0xEF);
  Metadata md = SmallMetadata();
  EXPECT_EQ(Encode(md, 2), Seal(b.body(), 2));  // the old-version encoder tests rely on
  EXPECT_EQ(Encode(md, 1), Seal(b.body(), 1));
  auto v2 = Decode(Seal(b.body(), 2));
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  ExpectSameMetadata(md, *v2);
  EXPECT_EQ(v2->block_size, 0u);
  std::string v1 = Seal(b.body(), 1);
  auto out = Decode(v1);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectSameMetadata(md, *out);
  md.has_checksums = false;
  auto no_sums = Decode(Seal(b.body(), 1, kFlagNoChecksums));
  ASSERT_TRUE(no_sums.ok()) << no_sums.status().ToString();
  EXPECT_FALSE(no_sums->has_checksums);
  ExpectError(Seal(Body(v1), 1, 2), StatusCode::kFailedPrecondition, "flags 2");
}

TEST(CodecTest, RejectsEveryFlippedBit) {
  // Issue 11 item 4: bit 0 of byte 12 (the flags) used to turn verification off unnoticed. Every
  // bit of the file -- magic, version, flags, body length, hash and body -- now changes the
  // outcome to DATA_LOSS, with and without the no-checksums flag set.
  // Also for a file with block checksums (version 3) and for version-2 files.
  for (int kind : {0, 1, 2, 3}) {
    const bool sums = kind != 1;
    Metadata md = kind == 2 ? BlockMetadata() : SmallMetadata();
    md.has_checksums = sums;
    const std::string enc = Encode(md, kind == 3 ? 2 : kFormatVersion);
    ASSERT_TRUE(Decode(enc).ok());
    for (size_t i = 0; i < enc.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        SCOPED_TRACE("byte " + std::to_string(i) + " bit " + std::to_string(bit) +
                     (sums ? "" : " (no-checksums file)"));
        std::string bad = enc;
        bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
        Result<Metadata> out = Decode(bad);
        ASSERT_FALSE(out.ok());
        EXPECT_EQ(out.status().code(), StatusCode::kDataLoss) << out.status().ToString();
      }
    }
  }
}

TEST(CodecTest, RejectsUnknownFlags) {
  std::string body = Body(Encode(SmallMetadata()));
  // Intact (correctly sealed) files with flags this build does not know.
  ExpectError(Seal(body, 3, 4), StatusCode::kFailedPrecondition, "flags 4");
  ExpectError(Seal(body, 3, 5), StatusCode::kFailedPrecondition, "flags 5");
  // The paths flag over a body without the paths section: the body ends early.
  ExpectError(Seal(body, 3, kFlagPaths), StatusCode::kDataLoss, "ends early");
}

TEST(CodecTest, PathsRoundTripAndOnlyThenSetTheFlag) {
  Metadata md = SmallMetadata();
  ASSERT_FALSE(md.tensors.empty());
  EXPECT_EQ(Encode(md).substr(12, 4), std::string(4, '\0'));  // no paths: format 3 as before
  md.tensors[0].path = "[\"model\",{\"$\":\"i\",\"v\":0},\"w\"]";
  if (!md.bytes.empty()) md.bytes[0].path = std::string("\x00binary\xff", 8);
  const std::string enc = Encode(md);
  EXPECT_EQ(enc.substr(12, 4), std::string("\x02\x00\x00\x00", 4));
  auto out = Decode(enc);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  for (size_t i = 0; i < md.tensors.size(); ++i)
    EXPECT_EQ(out->tensors[i].path, md.tensors[i].path);
  for (size_t i = 0; i < md.bytes.size(); ++i) EXPECT_EQ(out->bytes[i].path, md.bytes[i].path);
  for (size_t n = kHeaderSize; n < enc.size(); ++n) {  // every truncation still refused
    EXPECT_FALSE(Decode(std::string_view(enc).substr(0, n)).ok()) << n;
  }
  EXPECT_NE(MetadataToJson(md).find("\"path\""), std::string::npos);
}

TEST(CodecTest, NoChecksumsFlagRoundTrips) {
  Metadata md = SmallMetadata();
  EXPECT_TRUE(Decode(Encode(md))->has_checksums);
  md.has_checksums = false;
  std::string enc = Encode(md);
  EXPECT_EQ(enc.substr(12, 4), std::string("\x01\x00\x00\x00", 4));
  auto out = Decode(enc);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_FALSE(out->has_checksums);
  EXPECT_EQ(out->tensors.size(), md.tensors.size());
}

TEST(CodecTest, RejectsEveryTruncation) {
  std::string enc = Encode(SmallMetadata());
  for (size_t n = 0; n < enc.size(); ++n) {
    SCOPED_TRACE("prefix of " + std::to_string(n) + " bytes");
    Result<Metadata> out = Decode(std::string_view(enc).substr(0, n));
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), StatusCode::kDataLoss);
  }
  ExpectError(enc.substr(0, kHeaderSize - 1), StatusCode::kDataLoss, "shorter than its header");
  ExpectError(enc.substr(0, enc.size() - 1), StatusCode::kDataLoss, "truncated");
}

TEST(CodecTest, RejectsEveryTruncatedBodyEvenWhenResealed) {
  // A writer that stopped early but wrote a consistent header: the body parser itself must
  // notice, whatever field the cut falls in.
  std::string body = Body(Encode(BlockMetadata()));
  for (size_t n = 0; n < body.size(); ++n) {
    SCOPED_TRACE("body prefix of " + std::to_string(n) + " bytes");
    ExpectError(Seal(body.substr(0, n)), StatusCode::kDataLoss, "corrupt metadata");
  }
}

TEST(CodecTest, RejectsEveryFlippedBodyByte) {
  std::string enc = Encode(BlockMetadata());
  for (size_t i = kHeaderSize; i < enc.size(); ++i) {
    SCOPED_TRACE("byte " + std::to_string(i));
    std::string bad = enc;
    bad[i] ^= 0x01;
    ExpectError(bad, StatusCode::kDataLoss, "body checksum mismatch");
    bad[i] ^= 0x81;  // a different change to the same byte
    ExpectError(bad, StatusCode::kDataLoss, "body checksum mismatch");
  }
}

TEST(CodecTest, ResealedCorruptionNeverCrashes) {
  // Past the checksum, every edit must give either a valid metadata or a clean error (run under
  // ASan/UBSan to make "never crashes" strict).
  std::string body = Body(Encode(BlockMetadata()));
  for (size_t i = 0; i < body.size(); ++i) {
    for (int v : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
      std::string bad = body;
      bad[i] = static_cast<char>(v);
      Result<Metadata> out = Decode(Seal(bad));
      if (!out.ok()) {
        EXPECT_EQ(out.status().code(), StatusCode::kDataLoss);
      }
    }
  }
}

TEST(CodecTest, RejectsTrailingBytes) {
  std::string enc = Encode(SmallMetadata());
  ExpectError(enc + "x", StatusCode::kDataLoss, "header says");  // past the recorded length
  ExpectError(Reseal(enc + "x"), StatusCode::kDataLoss, "trailing bytes after the body");
  ExpectError(Reseal(enc + std::string(1, '\0')), StatusCode::kDataLoss, "trailing bytes");
}

// ---- Structural rejections (well-sealed, wrong content) ---------------------------------------

TEST(CodecTest, RejectsUnsortedTensorNames) {
  Metadata md = SmallMetadata();
  TensorMeta a = md.tensors[0];
  a.fqn = "a";
  md.tensors.push_back(a);  // "w" then "a"
  ExpectError(Encode(md), StatusCode::kDataLoss, "not sorted or duplicated at 'a'");
}

TEST(CodecTest, RejectsDuplicateTensorNames) {
  Metadata md = SmallMetadata();
  md.tensors.push_back(md.tensors[0]);
  ExpectError(Encode(md), StatusCode::kDataLoss, "not sorted or duplicated at 'w'");
}

TEST(CodecTest, RejectsUnsortedOrDuplicateBytesNames) {
  Metadata md = SmallMetadata();
  md.bytes.push_back({"rng", 1, 0, 1, 0});  // "step" then "rng"
  ExpectError(Encode(md), StatusCode::kDataLoss, "bytes entry names not sorted");
  md.bytes[1].fqn = "step";
  ExpectError(Encode(md), StatusCode::kDataLoss, "duplicated at 'step'");
}

TEST(CodecTest, RejectsChunkOutsideShape) {
  ExpectError(Encode(OneTensor(DType::kF32, Shape{4, 4}, Box{Shape{2, 0}, Shape{3, 4}})),
              StatusCode::kDataLoss, "outside shape [4, 4]");
  ExpectError(Encode(OneTensor(DType::kF32, Shape{4, 4}, Box{Shape{5, 0}, Shape{0, 4}})),
              StatusCode::kDataLoss, "outside shape");
  // A coordinate past INT64_MAX reads as negative, never as a huge in-range value.
  ExpectError(Encode(OneTensor(DType::kF32, Shape{4}, Box{Shape{-1}, Shape{1}})),
              StatusCode::kDataLoss, "outside shape");
}

TEST(CodecTest, RejectsOverlappingChunks) {
  Metadata md = OneTensor(DType::kF32, Shape{4, 4}, Box{Shape{0, 0}, Shape{3, 4}}, 1024);
  md.tensors[0].chunks.push_back(md.tensors[0].chunks[0]);
  md.tensors[0].chunks[1].box = Box{Shape{2, 0}, Shape{2, 4}};  // rows 2..3: row 2 twice
  ExpectError(Encode(md), StatusCode::kDataLoss, "overlap");
  md.tensors[0].chunks[1].box = Box{Shape{3, 0}, Shape{1, 4}};  // disjoint
  EXPECT_TRUE(Decode(Encode(md)).ok());
}

TEST(CodecTest, RejectsBadGlobalShape) {
  Metadata md = OneTensor(DType::kF32, Shape{-1, 4}, Box{Shape{0, 0}, Shape{0, 0}});
  md.tensors[0].chunks.clear();
  ExpectError(Encode(md), StatusCode::kDataLoss, "bad global shape");
  md.tensors[0].global_shape = Shape{int64_t{1} << 40, int64_t{1} << 40};  // 2^80 elements
  ExpectError(Encode(md), StatusCode::kDataLoss, "bad global shape");
}

TEST(CodecTest, RejectsChunkFileIndexOutOfRange) {
  Metadata md = OneTensor(DType::kF32, Shape{4}, Box::Whole(Shape{4}));
  md.tensors[0].chunks[0].file = 3;
  ExpectError(Encode(md), StatusCode::kDataLoss, "refers to file 3 of 1");
}

TEST(CodecTest, RejectsChunkBeyondFileSize) {
  // 16 bytes of F32 at offset 0 in a 15-byte file.
  ExpectError(Encode(OneTensor(DType::kF32, Shape{4}, Box::Whole(Shape{4}), 15)),
              StatusCode::kDataLoss, "lies beyond the end of f");
  Metadata md = OneTensor(DType::kF32, Shape{4}, Box::Whole(Shape{4}), 16);
  ASSERT_TRUE(Decode(Encode(md)).ok());  // exactly fits
  md.tensors[0].chunks[0].byte_offset = 1;
  ExpectError(Encode(md), StatusCode::kDataLoss, "lies beyond the end of f");
  md.tensors[0].chunks[0].byte_offset = ~0ULL;  // offset + length would wrap
  ExpectError(Encode(md), StatusCode::kDataLoss, "lies beyond the end of f");
}

TEST(CodecTest, RejectsSubByteChunkOfPartialBytes) {
  // Three F4 elements are 12 bits: not a whole number of bytes.
  ExpectError(Encode(OneTensor(DType::kF4, Shape{4}, Box{Shape{0}, Shape{3}})),
              StatusCode::kDataLoss, "does not fill whole bytes of F4");
  ExpectError(Encode(OneTensor(DType::kF6_E3M2, Shape{4}, Box{Shape{0}, Shape{2}})),
              StatusCode::kDataLoss, "does not fill whole bytes of F6_E3M2");
}

TEST(CodecTest, RejectsBytesEntryOutsideItsFile) {
  Metadata md = SmallMetadata();
  md.bytes[0].byte_length = 6;  // file holds 5
  ExpectError(Encode(md), StatusCode::kDataLoss, "bytes entry 'step' has a bad file or byte range");
  md.bytes[0].byte_length = 1;
  md.bytes[0].byte_offset = ~0ULL;
  ExpectError(Encode(md), StatusCode::kDataLoss, "bad file or byte range");
  md.bytes[0].byte_offset = 0;
  md.bytes[0].file = 2;
  ExpectError(Encode(md), StatusCode::kDataLoss, "bad file or byte range");
}

TEST(CodecTest, RejectsUnknownDType) {
  Metadata md = OneTensor(static_cast<DType>(kNumDTypes), Shape{4}, Box::Whole(Shape{4}));
  ExpectError(Encode(md), StatusCode::kDataLoss, "tensor 't' has unknown dtype code");
  md.tensors[0].dtype = static_cast<DType>(255);
  ExpectError(Encode(md), StatusCode::kDataLoss, "unknown dtype code");
}

TEST(CodecTest, RejectsMoreThanEightDims) {
  // Shape cannot hold nine dims, so write the body by hand: one tensor, rank byte 9.
  BodyBuilder b;
  b.Fixed64(1).Varint(1).Varint(0).Varint(0);  // save_id, world_size, block_size, no files
  b.Varint(1).String("t").Byte(static_cast<uint8_t>(DType::kU8)).Byte(kMaxDims + 1);
  for (int d = 0; d <= kMaxDims; ++d) b.Varint(1);
  b.Varint(0).Varint(0);  // no chunks, no bytes entries
  ExpectError(Seal(b.body()), StatusCode::kDataLoss, "tensor 't' has too many dimensions");
}

TEST(CodecTest, RejectsBadFileNames) {
  for (const char* name : {"", "../escape", ".hidden", "sub/dir", "/abs"}) {
    SCOPED_TRACE(name);
    Metadata md;
    md.files = {{name, 0}};
    ExpectError(Encode(md), StatusCode::kDataLoss, "bad file name");
  }
}

TEST(CodecTest, RejectsBadWorldSize) {
  BodyBuilder zero;
  zero.Fixed64(1).Varint(0).Varint(0).Varint(0).Varint(0).Varint(0);
  ExpectError(Seal(zero.body()), StatusCode::kDataLoss, "world size 0 out of range");
  BodyBuilder huge;
  huge.Fixed64(1).Varint(uint64_t{1} << 32).Varint(0).Varint(0).Varint(0).Varint(0);
  ExpectError(Seal(huge.body()), StatusCode::kDataLoss, "world size 4294967296 out of range");
}

TEST(CodecTest, RejectsHugeCountsWithoutAllocating) {
  // A count larger than the remaining body could hold is corruption, found before any resize.
  for (uint64_t count : {uint64_t{1} << 40, ~uint64_t{0}}) {
    BodyBuilder files;
    files.Fixed64(1).Varint(1).Varint(0).Varint(count);
    ExpectError(Seal(files.body()), StatusCode::kDataLoss, "body ends early");
    BodyBuilder tensors;
    tensors.Fixed64(1).Varint(1).Varint(0).Varint(0).Varint(count);
    ExpectError(Seal(tensors.body()), StatusCode::kDataLoss, "body ends early");
  }
}

TEST(CodecTest, RejectsOverlongVarints) {
  // Eleven continuation bytes, and a tenth byte carrying bits past 2^64.
  BodyBuilder overlong;
  overlong.Fixed64(1).Raw(std::string(11, '\x80')).Raw(std::string(1, '\x01'));
  overlong.Varint(0).Varint(0).Varint(0);
  ExpectError(Seal(overlong.body()), StatusCode::kDataLoss, "corrupt metadata");
  BodyBuilder overflow;
  overflow.Fixed64(1).Raw(std::string(9, '\xff')).Raw(std::string(1, '\x02'));
  overflow.Varint(0).Varint(0).Varint(0);
  ExpectError(Seal(overflow.body()), StatusCode::kDataLoss, "corrupt metadata");
}

}  // namespace
}  // namespace dcp::metadata
