// Binary encoding of the global metadata (specified in docs/format.md).
//
// A 32-byte header (magic, version, flags, body length, XXH3-64 of header and body) and a body of
// LEB128 varints and length-prefixed strings. The decoder trusts nothing: every length,
// index, box and byte range is checked before use.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "dcp/status.h"
#include "metadata/metadata.h"

namespace dcp::metadata {

inline constexpr char kMagic[8] = {'\x89', 'D', 'C', 'P', 'M', 'E', 'T', 'A'};
inline constexpr size_t kHeaderSize = 32;
// Header flags (docs/format.md). Any other bit is refused.
inline constexpr uint32_t kFlagNoChecksums = 1;  // Metadata::has_checksums == false
// Entries carry nesting paths (TensorMeta::path): after the bytes entries, one string per
// tensor, then one per bytes entry. Set only when some path is non-empty, so checkpoints
// without paths stay readable by builds that predate it, which refuse ones with paths.
inline constexpr uint32_t kFlagPaths = 2;
// Version 1 hashed the body only (its header was unprotected); Decode still reads it. Version 2
// hashes header bytes 0..23 and the body; version 3 adds block checksums; version 4
// (kFormatVersion) the directory of each file (FileInfo::base).
inline constexpr uint32_t kLegacyVersion = 1;
inline constexpr uint32_t kFirstBlockVersion = 3;
// Bounds of Metadata::block_size (a power of two; 0: no block checksums).
inline constexpr uint64_t kMinBlockSize = uint64_t{1} << 12;
inline constexpr uint64_t kMaxBlockSize = uint64_t{1} << 40;
inline constexpr size_t kBodyHashOffset = 24;

// The value of the hash field (header bytes 24..31) for `header` (at least 24 bytes; only bytes
// 0..23 are read) and `body` under `version`'s rule: XXH3-64 of the body for version 1, of header
// bytes 0..23 followed by the body for every later version.
uint64_t SealHash(std::string_view header, std::string_view body, uint32_t version);

// Writes `version` (default, 0: VersionFor(md), the oldest that holds `md`). Versions 1 and 2
// are for tests and tools that must produce them; they need md.block_size == 0.
std::string Encode(const Metadata& md, uint32_t version = 0);

// The version field of a metadata header (at least kHeaderSize bytes; not checked otherwise).
uint32_t HeaderVersion(std::string_view header);

// Errors: kDataLoss for a corrupt or truncated encoding or a foreign file,
// kFailedPrecondition for a version or header flags this build does not read.
Result<Metadata> Decode(std::string_view data);

}  // namespace dcp::metadata
