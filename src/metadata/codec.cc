#include "metadata/codec.h"

#include <xxhash.h>

#include <cstring>

#include "core/check.h"
#include "core/checksum.h"
#include "core/wire.h"

namespace dcp::metadata {
namespace {

// Layout of the fixed header.
constexpr size_t kVersionOffset = 8;
constexpr size_t kFlagsOffset = 12;
constexpr size_t kBodyLengthOffset = 16;

void PutFixed32(std::string& out, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[at + i] = static_cast<char>(v >> (8 * i));
}
void PutFixed64(std::string& out, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[at + i] = static_cast<char>(v >> (8 * i));
}
uint64_t GetFixed(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

using wire::Reader;
using wire::Writer;

void PutShape(Writer& w, const Shape& s) { w.Extents(s); }
Shape GetShape(Reader& r, int rank) { return r.Extents(rank); }

Status Corrupt(const std::string& what) { return DataLoss("corrupt metadata: " + what); }

}  // namespace

uint64_t SealHash(std::string_view header, std::string_view body, uint32_t version) {
  if (version == kLegacyVersion) return XXH3_64bits(body.data(), body.size());
  // Version 2 on: bytes 0..23 of the header, then the body (the hash field itself left out), so
  // that no bit of magic, version, flags or body length can change without the hash noticing.
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, header.data(), kBodyHashOffset);
  XXH3_64bits_update(state, body.data(), body.size());
  uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

namespace {

bool ValidBlockSize(uint64_t block_size) {
  return block_size == 0 || (block_size >= kMinBlockSize && block_size <= kMaxBlockSize &&
                             (block_size & (block_size - 1)) == 0);
}

}  // namespace

std::string Encode(const Metadata& md, uint32_t version) {
  if (version == 0) version = VersionFor(md);
  DCP_CHECK(version >= kLegacyVersion && version <= kFormatVersion);
  // Only version 4 on says where a file lives.
  DCP_CHECK(version >= kFirstReferenceVersion || VersionFor(md) < kFirstReferenceVersion);
  // Versions 1 and 2 have no block checksums, and their chunk checksums cover the bytes.
  DCP_CHECK(version >= kFirstBlockVersion || md.block_size == 0);
  std::string out(kHeaderSize, '\0');
  out.reserve(kHeaderSize + 64 + md.TotalChunks() * 40);
  Writer w(out);
  w.Fixed64(md.save_id);
  w.Varint(md.world_size);
  if (version >= kFirstBlockVersion) w.Varint(md.block_size);
  w.Varint(md.files.size());
  for (const auto& f : md.files) {
    w.String(f.name);
    w.Varint(f.size);
    if (version >= kFirstReferenceVersion) w.String(f.base);
  }
  w.Varint(md.tensors.size());
  for (const auto& t : md.tensors) {
    w.String(t.fqn);
    w.Byte(static_cast<uint8_t>(t.dtype));
    w.Byte(static_cast<uint8_t>(t.global_shape.rank()));
    PutShape(w, t.global_shape);
    w.Varint(t.chunks.size());
    for (const auto& c : t.chunks) {
      w.Varint(c.file);
      w.Varint(c.byte_offset);
      w.Fixed64(c.xxh3);
      PutShape(w, c.box.offsets);
      PutShape(w, c.box.lengths);
      DCP_CHECK(c.block_xxh3.size() == md.NumBlocks(c.byte_length));
      for (uint64_t h : c.block_xxh3) w.Fixed64(h);
    }
  }
  w.Varint(md.bytes.size());
  for (const auto& b : md.bytes) {
    w.String(b.fqn);
    w.Varint(b.file);
    w.Varint(b.byte_offset);
    w.Varint(b.byte_length);
    w.Fixed64(b.xxh3);
  }
  bool paths = false;
  for (const auto& t : md.tensors) paths = paths || !t.path.empty();
  for (const auto& b : md.bytes) paths = paths || !b.path.empty();
  // Version 1 leaves the flags outside the hash: paths need a covered flag.
  DCP_CHECK(!paths || version > kLegacyVersion);
  if (paths) {
    for (const auto& t : md.tensors) w.String(t.path);
    for (const auto& b : md.bytes) w.String(b.path);
  }
  std::memcpy(out.data(), kMagic, sizeof(kMagic));
  PutFixed32(out, kVersionOffset, version);
  PutFixed32(out, kFlagsOffset,
             (md.has_checksums ? 0 : kFlagNoChecksums) | (paths ? kFlagPaths : 0));
  PutFixed64(out, kBodyLengthOffset, out.size() - kHeaderSize);
  std::string_view enc(out);
  PutFixed64(out, kBodyHashOffset,
             SealHash(enc.substr(0, kHeaderSize), enc.substr(kHeaderSize), version));
  return out;
}

uint32_t HeaderVersion(std::string_view header) {
  return static_cast<uint32_t>(GetFixed(header.data() + kVersionOffset, 4));
}

Result<Metadata> Decode(std::string_view data) {
  if (data.size() < kHeaderSize || std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
    return DataLoss("not a dcp metadata file (bad magic or shorter than its header)");
  }
  uint32_t version = static_cast<uint32_t>(GetFixed(data.data() + kVersionOffset, 4));
  uint32_t flags = static_cast<uint32_t>(GetFixed(data.data() + kFlagsOffset, 4));
  uint64_t body_len = GetFixed(data.data() + kBodyLengthOffset, 8);
  if (body_len != data.size() - kHeaderSize) {
    return Corrupt("body is " + std::to_string(data.size() - kHeaderSize) + " bytes, header says " +
                   std::to_string(body_len) + " (truncated?)");
  }
  std::string_view body = data.substr(kHeaderSize);
  // Every version from 2 on keeps this header layout and hashes header and body together, so a
  // version other than 1 is checked by that rule first: a flipped version bit reads as
  // corruption, and only an intact file of a newer version as "not supported".
  const uint64_t stored_hash = GetFixed(data.data() + kBodyHashOffset, 8);
  if (SealHash(data.substr(0, kHeaderSize), body, version) != stored_hash) {
    return Corrupt(version == kLegacyVersion ? "body checksum mismatch"
                                             : "header or body checksum mismatch");
  }
  if (version < kLegacyVersion || version > kFormatVersion) {
    return FailedPrecondition("metadata format version " + std::to_string(version) +
                              " is not supported (this build reads versions 1 to " +
                              std::to_string(kFormatVersion) + ")");
  }
  // A flag this build does not know would change how the body reads: refuse it rather than
  // guess. (In version 1 the flags lie outside the hash; from version 2 on they are covered.)
  const uint32_t known = kFlagNoChecksums | (version > kLegacyVersion ? kFlagPaths : 0);
  if ((flags & ~known) != 0) {
    return FailedPrecondition("metadata header flags " + std::to_string(flags) +
                              " are not supported (this build reads flags 0 to 3)");
  }

  Reader r(body);
  Metadata md;
  md.has_checksums = (flags & kFlagNoChecksums) == 0;
  md.save_id = r.Fixed64();
  uint64_t world_size = r.Varint();
  if (r.ok() && (world_size == 0 || world_size > UINT32_MAX)) {
    return Corrupt("world size " + std::to_string(world_size) + " out of range");
  }
  md.world_size = static_cast<uint32_t>(world_size);
  if (version >= kFirstBlockVersion) {
    md.block_size = r.Varint();
    if (r.ok() && !ValidBlockSize(md.block_size)) {
      return Corrupt("checksum block size " + std::to_string(md.block_size) +
                     " is neither 0 nor a power of two from 4096 to 2^40");
    }
  }
  md.files.resize(r.Count(2));
  for (auto& f : md.files) {
    f.name = std::string(r.String());
    f.size = r.Varint();
    if (version >= kFirstReferenceVersion) f.base = std::string(r.String());
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name[0] == '.') {
      if (r.ok()) return Corrupt("bad file name '" + f.name + "'");
    }
    // A reference names a sibling directory, never a path that climbs or descends further.
    if (!f.base.empty() && !ValidBaseName(f.base)) {
      if (r.ok()) return Corrupt("file '" + f.name + "' has a bad base directory '" + f.base + "'");
    }
  }
  md.tensors.resize(r.Count(4));
  for (size_t i = 0; i < md.tensors.size() && r.ok(); ++i) {
    TensorMeta& t = md.tensors[i];
    t.fqn = std::string(r.String());
    uint8_t dtype = r.Byte();
    uint8_t rank = r.Byte();
    if (!r.ok()) break;
    if (dtype >= kNumDTypes) return Corrupt("tensor '" + t.fqn + "' has unknown dtype code");
    if (rank > kMaxDims) return Corrupt("tensor '" + t.fqn + "' has too many dimensions");
    if (i > 0 && !(md.tensors[i - 1].fqn < t.fqn)) {
      return Corrupt("tensor names not sorted or duplicated at '" + t.fqn + "'");
    }
    t.dtype = static_cast<DType>(dtype);
    t.global_shape = GetShape(r, rank);
    if (r.ok() && !t.global_shape.NumElements()) {
      return Corrupt("tensor '" + t.fqn + "' has a bad global shape " + t.global_shape.ToString());
    }
    t.chunks.resize(r.Count(10 + 2 * rank));
    for (auto& c : t.chunks) {
      uint64_t file = r.Varint();
      c.byte_offset = r.Varint();
      c.xxh3 = r.Fixed64();
      c.box.offsets = GetShape(r, rank);
      c.box.lengths = GetShape(r, rank);
      if (!r.ok()) break;
      if (!c.box.WithinShape(t.global_shape)) {
        return Corrupt("tensor '" + t.fqn + "' chunk " + c.box.ToString() + " outside shape " +
                       t.global_shape.ToString());
      }
      if (file >= md.files.size()) {
        return Corrupt("tensor '" + t.fqn + "' chunk " + c.box.ToString() + " refers to file " +
                       std::to_string(file) + " of " + std::to_string(md.files.size()));
      }
      auto len = DTypeBytes(t.dtype, c.box.NumElements());
      if (!len) {
        return Corrupt("tensor '" + t.fqn + "' chunk " + c.box.ToString() +
                       " does not fill whole bytes of " + std::string(DTypeName(t.dtype)));
      }
      c.file = static_cast<uint32_t>(file);
      c.byte_length = *len;
      const FileInfo& f = md.files[c.file];
      if (c.byte_offset > f.size || c.byte_length > f.size - c.byte_offset) {
        return Corrupt("tensor '" + t.fqn + "' chunk " + c.box.ToString() +
                       " lies beyond the end of " + f.name);
      }
      // Checked against the remaining bytes before allocating.
      const uint64_t blocks = md.NumBlocks(c.byte_length);
      if (blocks > r.remaining() / 8) return Corrupt("body ends early");
      c.block_xxh3.resize(blocks);
      for (uint64_t& h : c.block_xxh3) h = r.Fixed64();
      if (blocks > 0 && BlockDigest(c.block_xxh3) != c.xxh3) {
        return Corrupt("tensor '" + t.fqn + "' chunk " + c.box.ToString() +
                       ": checksum does not match its block checksums");
      }
    }
    // Overlapping chunks would make a load's coverage count lie (and fill some elements
    // twice, others never).
    if (r.ok()) {
      auto overlap =
          FindOverlap(t.chunks.size(), [&](size_t k) -> const Box& { return t.chunks[k].box; });
      if (overlap) {
        return Corrupt("tensor '" + t.fqn + "' chunks " + t.chunks[overlap->first].box.ToString() +
                       " and " + t.chunks[overlap->second].box.ToString() + " overlap");
      }
    }
  }
  md.bytes.resize(r.Count(12));
  for (size_t i = 0; i < md.bytes.size() && r.ok(); ++i) {
    BytesMeta& b = md.bytes[i];
    b.fqn = std::string(r.String());
    uint64_t file = r.Varint();
    b.byte_offset = r.Varint();
    b.byte_length = r.Varint();
    b.xxh3 = r.Fixed64();
    if (!r.ok()) break;
    if (i > 0 && !(md.bytes[i - 1].fqn < b.fqn)) {
      return Corrupt("bytes entry names not sorted or duplicated at '" + b.fqn + "'");
    }
    if (file >= md.files.size() || b.byte_offset > md.files[file].size ||
        b.byte_length > md.files[file].size - b.byte_offset) {
      return Corrupt("bytes entry '" + b.fqn + "' has a bad file or byte range");
    }
    b.file = static_cast<uint32_t>(file);
    // One name, one entry: a state dict cannot hold a tensor and a bytes entry of one name.
    if (md.FindTensor(b.fqn)) return Corrupt("'" + b.fqn + "' is both a tensor and a bytes entry");
  }
  if ((flags & kFlagPaths) != 0) {
    for (auto& t : md.tensors) t.path = std::string(r.String());
    for (auto& b : md.bytes) b.path = std::string(r.String());
  }
  if (!r.ok()) return Corrupt("body ends early");
  if (!r.AtEnd()) return Corrupt("trailing bytes after the body");
  return md;
}

}  // namespace dcp::metadata
