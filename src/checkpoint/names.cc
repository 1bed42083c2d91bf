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

namespace {

// data-<16 hex>-r<digits>.(safetensors|bytes): the writer's rank and the extension, or -1.
int ParseDataFileName(std::string_view name, std::string_view* ext) {
  if (name.size() < 24 || name.substr(0, 5) != "data-" || name[21] != '-' || name[22] != 'r') {
    return -1;
  }
  for (size_t i = 5; i < 21; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return -1;
  }
  size_t i = 23;
  int rank = 0;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) {
    if (i - 23 >= 9) return -1;
    rank = rank * 10 + (name[i] - '0');
    ++i;
  }
  if (i == 23) return -1;
  *ext = name.substr(i);
  return *ext == ".safetensors" || *ext == ".bytes" ? rank : -1;
}

}  // namespace

bool IsDcpDataFileName(std::string_view name) {
  std::string_view ext;
  return ParseDataFileName(name, &ext) >= 0;
}

int DataFileRank(std::string_view name) {
  std::string_view ext;
  return ParseDataFileName(name, &ext);
}

std::string ChunkKey(const std::string& fqn, bool several, uint64_t k) {
  return several ? fqn + ".__dcp_chunk_" + std::to_string(k) : fqn;
}

int TensorDataFileRank(std::string_view name) {
  std::string_view ext;
  const int rank = ParseDataFileName(name, &ext);
  return ext == ".safetensors" ? rank : -1;
}

std::string RecycledFileName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "r%05d.safetensors", rank);
  return buf;
}

bool IsMetadataTmpName(std::string_view name) {
  for (std::string_view base : {kMetadataName, kTorchProbeName}) {
    if (name.starts_with(std::string(base) + std::string(kTmpSuffixPrefix))) return true;
  }
  return false;
}

bool IsStaleLockName(std::string_view name) { return name.starts_with("dcp.lock.stale-"); }

}  // namespace dcp::checkpoint

namespace dcp::checkpoint {

std::string RankMetadataName(uint64_t step, int rank) {
  return std::string(kMetadataName) + ".step" + std::to_string(step) + ".rank" +
         std::to_string(rank);
}

namespace {

// Parses a decimal number of at most `max_digits` digits that fills `s`; false otherwise.
bool ParseDecimal(std::string_view s, size_t max_digits, uint64_t* out) {
  if (s.empty() || s.size() > max_digits) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

}  // namespace

int ParseRankMetadataName(std::string_view name, uint64_t* step, bool* legacy) {
  const std::string base = std::string(kMetadataName) + ".";
  if (!name.starts_with(base)) return -1;
  std::string_view rest = name.substr(base.size());
  uint64_t s = 0;
  bool old = true;
  if (rest.starts_with("step")) {
    const size_t dot = rest.find('.');
    if (dot == std::string_view::npos || !ParseDecimal(rest.substr(4, dot - 4), 19, &s)) {
      return -1;
    }
    rest = rest.substr(dot + 1);
    old = false;
  }
  uint64_t r = 0;
  if (!rest.starts_with("rank") || !ParseDecimal(rest.substr(4), 9, &r)) return -1;
  if (step) *step = s;
  if (legacy) *legacy = old;
  return static_cast<int>(r);
}

std::string StepDirName(int64_t step) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "step_%09lld", static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> ParseStepDirName(std::string_view name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.size() < kPrefix.size() + 9 || !name.starts_with(kPrefix)) return std::nullopt;
  int64_t v = 0;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    char c = name[i];
    if (c < '0' || c > '9') return std::nullopt;
    if (v > (INT64_MAX - 9) / 10) return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (StepDirName(v) != name) return std::nullopt;  // one spelling per step
  return v;
}

}  // namespace dcp::checkpoint
