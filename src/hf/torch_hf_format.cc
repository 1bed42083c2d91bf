#include "hf/torch_hf_format.h"

#include <cstdio>
#include <nlohmann/json.hpp>

namespace dcp::hf {
namespace {

std::string Padded5(int n) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%05d", n);
  return buf;
}

// Consumes five digits (at least: zfill pads, never truncates) at `s`.
bool SkipNumber(std::string_view& s) {
  size_t n = 0;
  while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n;
  if (n < 5) return false;
  s.remove_prefix(n);
  return true;
}

bool SkipLiteral(std::string_view& s, std::string_view lit) {
  if (s.substr(0, lit.size()) != lit) return false;
  s.remove_prefix(lit.size());
  return true;
}

// The next code point of UTF-8 `s` at `i` (advancing i); U+FFFD for an invalid sequence.
uint32_t NextCodePoint(std::string_view s, size_t& i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  int extra = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  if (extra < 0 || i + extra >= s.size()) {
    ++i;
    return 0xFFFD;
  }
  uint32_t cp = extra == 0 ? c : c & (0x3F >> extra);
  for (int k = 1; k <= extra; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  i += extra + 1;
  if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0xFFFD;
  return cp;
}

void AppendU16Escape(std::string& out, uint32_t unit) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\u%04x", unit);
  out += buf;
}

void AppendPyList(std::string& out, const Shape& s) {
  out += '[';
  for (int d = 0; d < s.rank(); ++d) {
    if (d > 0) out += ", ";
    out += std::to_string(s[d]);
  }
  out += ']';
}

// Twice safetensors' enum position (the dtypes it lacks sit between their neighbours).
int SafetensorsRank(DType t) {
  switch (t) {
    case DType::kBool:
      return 0;
    case DType::kF4:
      return 2;
    case DType::kF6_E2M3:
      return 4;
    case DType::kF6_E3M2:
      return 6;
    case DType::kU8:
      return 8;
    case DType::kI8:
      return 10;
    case DType::kF8_E5M2:
      return 12;
    case DType::kF8_E4M3:
      return 14;
    case DType::kF8_E8M0:
      return 16;
    case DType::kF8_E4M3FNUZ:
      return 17;
    case DType::kF8_E5M2FNUZ:
      return 17;
    case DType::kI16:
      return 18;
    case DType::kU16:
      return 20;
    case DType::kF16:
      return 22;
    case DType::kBF16:
      return 24;
    case DType::kC32:
      return 25;
    case DType::kI32:
      return 26;
    case DType::kU32:
      return 28;
    case DType::kF32:
      return 30;
    case DType::kC64:
      return 32;
    case DType::kF64:
      return 34;
    case DType::kC128:
      return 35;
    case DType::kI64:
      return 36;
    case DType::kU64:
      return 38;
  }
  return 0;
}

}  // namespace

std::string TorchHfFileName(int index, int max_index, int shard) {
  std::string name = "model-" + Padded5(index) + "-of-" + Padded5(max_index) + ".safetensors";
  return shard > 0 ? "shard-" + Padded5(shard) + "-" + name : name;
}

bool IsTorchHfFileName(std::string_view name) {
  if (SkipLiteral(name, "shard-") && !(SkipNumber(name) && SkipLiteral(name, "-"))) return false;
  return SkipLiteral(name, "model-") && SkipNumber(name) && SkipLiteral(name, "-of-") &&
         SkipNumber(name) && name == ".safetensors";
}

std::string PyJsonString(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = NextCodePoint(s, i);
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (cp >= 0x20 && cp < 0x7F) {
      out += static_cast<char>(cp);
    } else if (cp < 0x10000) {
      AppendU16Escape(out, cp);
    } else {
      const uint32_t v = cp - 0x10000;
      AppendU16Escape(out, 0xD800 | (v >> 10));
      AppendU16Escape(out, 0xDC00 | (v & 0x3FF));
    }
  }
  out += '"';
  return out;
}

bool SafetensorsOrderLess(DType a_dtype, std::string_view a_name, DType b_dtype,
                          std::string_view b_name) {
  const int a = SafetensorsRank(a_dtype), b = SafetensorsRank(b_dtype);
  return a != b ? a > b : a_name < b_name;
}

std::vector<int> PythonSetOrder(const std::vector<int>& added) {
  // CPython's set of small ints: hash(i) == i; a table of 8 slots at first; a new key probes
  // its slot, the 9 after it where the table has them, then jumps (i * 5 + 1 + perturb);
  // past 3/5 full the table grows to the power of two above 4x the keys (2x past 50,000),
  // re-inserting the keys in slot order. Iteration is slot order.
  constexpr size_t kLinearProbes = 9;
  std::vector<int> table(8, -1);
  size_t fill = 0;
  auto insert = [](std::vector<int>& t, int key) {
    const size_t mask = t.size() - 1;
    size_t perturb = static_cast<size_t>(key);
    size_t i = perturb & mask;
    while (true) {
      const size_t probes = i + kLinearProbes <= mask ? kLinearProbes : 0;
      for (size_t j = 0; j <= probes; ++j) {
        if (t[i + j] < 0) {
          t[i + j] = key;
          return;
        }
      }
      perturb >>= 5;
      i = (i * 5 + 1 + perturb) & mask;
    }
  };
  for (int key : added) {
    insert(table, key);
    ++fill;
    if (fill * 5 >= (table.size() - 1) * 3) {
      const size_t want = fill > 50000 ? fill * 2 : fill * 4;
      size_t size = 8;
      while (size <= want) size <<= 1;
      std::vector<int> grown(size, -1);
      for (int k : table) {
        if (k >= 0) insert(grown, k);
      }
      table = std::move(grown);
    }
  }
  std::vector<int> out;
  for (int k : table) {
    if (k >= 0) out.push_back(k);
  }
  return out;
}

std::string ShardingInfoJson(const std::vector<ShardedTensor>& tensors) {
  std::string out = "{";
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i > 0) out += ", ";
    out += PyJsonString(tensors[i].name);
    out += ": {\"saved_offsets\": ";
    AppendPyList(out, tensors[i].offsets);
    out += '}';
  }
  out += '}';
  return out;
}

Result<std::vector<Shape>> ParseShardingInfo(std::string_view json,
                                             const std::vector<HeaderTensor>& tensors,
                                             std::string_view file) {
  constexpr uint64_t kMaxEnd = uint64_t{1} << 62;
  const std::string where = std::string(file) + ": " + std::string(kShardingInfoKey);
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(where + " is not a JSON object");
  std::vector<Shape> out;
  for (const HeaderTensor& t : tensors) {
    auto e = j.find(t.name);
    const nlohmann::json* offs = nullptr;
    if (e != j.end() && e->is_object()) {
      auto o = e->find("saved_offsets");
      if (o != e->end() && o->is_array()) offs = &*o;
    }
    if (!offs) return DataLoss(where + " gives no saved_offsets for tensor '" + t.name + "'");
    if (static_cast<int>(offs->size()) != t.shape.rank()) {
      return DataLoss(where + ": tensor '" + t.name + "' of " + std::to_string(t.shape.rank()) +
                      " dimensions has " + std::to_string(offs->size()) + " saved_offsets");
    }
    Shape at = Shape::Zeros(t.shape.rank());
    for (int d = 0; d < t.shape.rank(); ++d) {
      const nlohmann::json& o = (*offs)[d];
      if (!o.is_number_unsigned() || o.get<uint64_t>() > kMaxEnd ||
          o.get<uint64_t>() + static_cast<uint64_t>(t.shape[d]) > kMaxEnd) {
        return DataLoss(where + ": tensor '" + t.name + "' has a bad offset " +
                        o.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      }
      at[d] = o.get<int64_t>();
    }
    out.push_back(at);
  }
  return out;
}

std::string TorchConsolidatedHeader(const std::vector<WholeTensor>& tensors) {
  std::string json = "{";
  uint64_t pos = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const WholeTensor& t = tensors[i];
    if (i > 0) json += ", ";
    json += PyJsonString(t.name);
    json += ": {\"shape\": ";
    AppendPyList(json, t.shape);
    json += ", \"dtype\": \"";
    json += DTypeName(t.dtype);
    json += "\", \"data_offsets\": [" + std::to_string(pos) + ", " + std::to_string(pos + t.bytes) +
            "]}";
    pos += t.bytes;
  }
  json += '}';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t{json.size()} >> (8 * i));
  return out + json;
}

std::string TorchIndexJson(uint64_t total_size,
                           const std::vector<std::pair<std::string, std::string>>& weight_map) {
  std::string out = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total_size) +
                    "\n  },\n  \"weight_map\": {";
  for (size_t i = 0; i < weight_map.size(); ++i) {
    out += i > 0 ? ",\n    " : "\n    ";
    out += PyJsonString(weight_map[i].first) + ": " + PyJsonString(weight_map[i].second);
  }
  out += weight_map.empty() ? "}\n}" : "\n  }\n}";
  return out;
}

}  // namespace dcp::hf
