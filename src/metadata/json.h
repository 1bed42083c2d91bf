// Views of a Metadata for people and scripts: what `dcp inspect` prints.
//
// MetadataToJson is the `dcp inspect --json` schema, specified in docs/format.md; scripts may
// rely on its keys. MetadataSummaryText is for people and may change.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "metadata/metadata.h"

namespace dcp::metadata {

// The whole metadata: files, every tensor with its chunks, bytes entries and totals. Chunk and
// bytes entries name their file; save_id and checksums are 16 lowercase hex digits.
nlohmann::json MetadataToJson(const Metadata& md);

// One line per tensor (fqn, dtype, shape, chunk count, size) and per bytes entry, then totals.
// With `list_chunks`, each tensor's chunks follow it, one line each.
std::string MetadataSummaryText(const Metadata& md, bool list_chunks);

// "0 B", "512 B", "1.5 KiB", "1.5 GiB": binary units, one decimal from KiB up.
std::string HumanBytes(uint64_t bytes);

// 16 lowercase hex digits, as save ids and checksums are spelled everywhere.
std::string Hex16(uint64_t v);

}  // namespace dcp::metadata
