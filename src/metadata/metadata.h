// The global metadata: the contract between a save and every later load. The structs are
// public (dcp/metadata.h); the codec (codec.h) turns them into the on-disk encoding specified
// in docs/format.md.
#pragma once

#include <cstdint>

#include "dcp/metadata.h"

namespace dcp::metadata {

// Version of the metadata encoding (docs/format.md) that saves write.
inline constexpr uint32_t kFormatVersion = 3;
// Checksum block size that saves write (Metadata::block_size), chosen by measurement
// (docs/format.md, section 3): small enough that a resharding load reads little beyond the
// bytes it needs, large enough that hashing and metadata stay cheap (8 bytes per block).
inline constexpr uint64_t kChecksumBlockSize = uint64_t{1} << 20;

using dcp::BytesMeta;
using dcp::FileInfo;
using dcp::Metadata;
using dcp::StoredChunk;
using dcp::TensorMeta;

}  // namespace dcp::metadata
