// The global metadata: the contract between a save and every later load. The structs are
// public (dcp/metadata.h); the codec (codec.h) turns them into the on-disk encoding specified
// in docs/format.md.
#pragma once

#include <cstdint>
#include <string_view>

#include "dcp/metadata.h"

namespace dcp::metadata {

// The newest version of the metadata encoding (docs/format.md). Saves write the oldest version
// that holds what they wrote (VersionFor), so checkpoints without references stay readable
// by builds that read version 3.
inline constexpr uint32_t kFormatVersion = 4;
// Version 4 adds FileInfo::base: files referenced in a base checkpoint's directory.
inline constexpr uint32_t kFirstReferenceVersion = 4;
// Checksum block size that saves write (Metadata::block_size), chosen by measurement
// (docs/format.md, section 3): small enough that a resharding load reads little beyond the
// bytes it needs, large enough that hashing and metadata stay cheap (8 bytes per block).
inline constexpr uint64_t kChecksumBlockSize = uint64_t{1} << 20;

// The version a save writes `md` in: 4 when some file lies in a base's directory, else 3.
uint32_t VersionFor(const Metadata& md);
// Whether `name` may be FileInfo::base: one path component, neither "." nor "..".
bool ValidBaseName(std::string_view name);

using dcp::BytesMeta;
using dcp::FileInfo;
using dcp::Metadata;
using dcp::StoredChunk;
using dcp::TensorMeta;

}  // namespace dcp::metadata
