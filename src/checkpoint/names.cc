#include "checkpoint/names.h"

#include <cctype>
#include <cstdio>

namespace dcp::checkpoint {

std::string SaveIdHex(uint64_t save_id) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(save_id));
  return buf;
}

std::string DataFileName(uint64_t save_id, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "data-%s-r%05d.safetensors", SaveIdHex(save_id).c_str(), rank);
  return buf;
}

std::string BytesFileName(uint64_t save_id, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "data-%s-r%05d.bytes", SaveIdHex(save_id).c_str(), rank);
  return buf;
}

bool IsDcpDataFileName(std::string_view name) {
  // data-<16 hex>-r<digits>.(safetensors|bytes)
  if (name.size() < 24 || name.substr(0, 5) != "data-" || name[21] != '-' || name[22] != 'r') {
    return false;
  }
  for (size_t i = 5; i < 21; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  size_t i = 23;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  if (i == 23) return false;
  std::string_view ext = name.substr(i);
  return ext == ".safetensors" || ext == ".bytes";
}

bool IsMetadataTmpName(std::string_view name) {
  return name.starts_with(std::string(kMetadataName) + std::string(kTmpSuffixPrefix));
}

bool IsStaleLockName(std::string_view name) { return name.starts_with("dcp.lock.stale-"); }

}  // namespace dcp::checkpoint

namespace dcp::checkpoint {

std::string RankMetadataName(int rank) {
  return std::string(kMetadataName) + ".rank" + std::to_string(rank);
}

int ParseRankMetadataName(std::string_view name) {
  const std::string prefix = std::string(kMetadataName) + ".rank";
  if (!name.starts_with(prefix) || name.size() == prefix.size() ||
      name.size() > prefix.size() + 9) {
    return -1;
  }
  int r = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9') return -1;
    r = r * 10 + (c - '0');
  }
  return r;
}

}  // namespace dcp::checkpoint
