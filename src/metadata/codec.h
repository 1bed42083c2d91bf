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
// Version 1 hashed the body only (its header was unprotected); Decode still reads it. Encode
// writes kFormatVersion (2), whose hash covers header bytes 0..23 and the body.
inline constexpr uint32_t kLegacyVersion = 1;
inline constexpr size_t kBodyHashOffset = 24;

// The value of the hash field (header bytes 24..31) for `header` (at least 24 bytes; only bytes
// 0..23 are read) and `body` under `version`'s rule: XXH3-64 of the body for version 1, of header
// bytes 0..23 followed by the body for every later version.
uint64_t SealHash(std::string_view header, std::string_view body, uint32_t version);

std::string Encode(const Metadata& md);

// Errors: kDataLoss for a corrupt or truncated encoding or a foreign file,
// kFailedPrecondition for a version or header flags this build does not read.
Result<Metadata> Decode(std::string_view data);

}  // namespace dcp::metadata
