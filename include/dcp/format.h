// How dcp spells sizes and ids in messages, reports and tools.
#pragma once

#include <cstdint>
#include <string>

namespace dcp {

// "0 B", "512 B", "1.5 KiB", "1.5 GiB": binary units, one decimal from KiB up.
std::string HumanBytes(uint64_t bytes);

// 16 lowercase hex digits, as save ids and checksums are spelled everywhere.
std::string Hex16(uint64_t v);

}  // namespace dcp
