#include "hf/safetensors_header.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace dcp::hf {
namespace {

Status Bad(std::string_view file, const std::string& what) {
  return DataLoss("safetensors file " + std::string(file) + ": " + what);
}
Status BadTensor(std::string_view file, std::string_view tensor, const std::string& what) {
  return Bad(file, "tensor '" + std::string(tensor) + "' " + what);
}

// Error text from the JSON parser without the raw bytes it quotes (they may be anything).
std::string Printable(std::string_view s, size_t max = 160) {
  std::string out;
  for (char c : s.substr(0, max)) out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  if (s.size() > max) out += "...";
  return out;
}

// A SAX handler that accepts exactly the safetensors header grammar and stops at the first
// deviation, so nesting, size or type tricks never build a document in memory:
//   { "__metadata__": {string: string, ...}?,
//     name: {"dtype": string, "shape": [uint, ...], "data_offsets": [uint, uint]}, ... }
class HeaderSax {
 public:
  using json = nlohmann::json;

  explicit HeaderSax(std::string_view file) : file_(file) {}

  const Status& status() const { return status_; }
  SafetensorsHeader& header() { return header_; }

  bool null() { return Unexpected("null"); }
  bool boolean(bool) { return Unexpected("a boolean"); }
  bool number_float(double, const std::string&) { return Unexpected("a non-integer number"); }
  bool binary(json::binary_t&) { return Unexpected("binary data"); }
  bool number_integer(int64_t v) {
    if (v >= 0) return number_unsigned(static_cast<uint64_t>(v));
    return Unexpected("a negative number");
  }
  bool number_unsigned(uint64_t v) {
    if (state_ == State::kShape) {
      HeaderTensor& t = header_.tensors.back();
      if (t.shape.rank() == kMaxDims) {
        return Fail(
            BadTensor(file_, t.name, "has more than " + std::to_string(kMaxDims) + " dimensions"));
      }
      if (v > static_cast<uint64_t>(INT64_MAX)) {
        return Fail(BadTensor(file_, t.name, "has a dimension of " + std::to_string(v)));
      }
      t.shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (state_ == State::kOffsets) {
      HeaderTensor& t = header_.tensors.back();
      if (offsets_seen_ == 2) return Fail(BadTensor(file_, t.name, "has more than 2 data_offsets"));
      (offsets_seen_++ == 0 ? t.begin : t.end) = v;
      return true;
    }
    return Unexpected("a number");
  }
  bool string(std::string& v) {
    if (state_ == State::kMetadata) {
      header_.metadata[key_] = std::move(v);
      return true;
    }
    if (state_ == State::kTensor && field_ == kDType) {
      HeaderTensor& t = header_.tensors.back();
      auto d = ParseDType(v);
      if (!d) return Fail(BadTensor(file_, t.name, "has unknown dtype '" + Printable(v) + "'"));
      t.dtype = *d;
      return true;
    }
    return Unexpected("a string");
  }
  bool start_object(size_t) {
    switch (state_) {
      case State::kStart:
        state_ = State::kTop;
        return true;
      case State::kTop:
        state_ = key_ == "__metadata__" ? State::kMetadata : State::kTensor;
        fields_seen_ = 0;
        return true;
      default:
        return Unexpected("an object");
    }
  }
  bool key(std::string& k) {
    switch (state_) {
      case State::kTop:
        if (k == "__metadata__") {
          if (seen_metadata_) return Fail(Bad(file_, "duplicate key '__metadata__' in the header"));
          seen_metadata_ = true;
        } else {
          header_.tensors.emplace_back().name = k;
        }
        key_ = std::move(k);
        return true;
      case State::kMetadata:
        if (header_.metadata.count(k)) {
          return Fail(Bad(file_, "duplicate key '" + Printable(k) + "' in __metadata__"));
        }
        key_ = std::move(k);
        return true;
      case State::kTensor: {
        const std::string& name = header_.tensors.back().name;
        if (k == "dtype") {
          field_ = kDType;
        } else if (k == "shape") {
          field_ = kShape;
        } else if (k == "data_offsets") {
          field_ = kOffsets;
        } else {
          return Fail(BadTensor(file_, name, "has unknown field '" + Printable(k) + "'"));
        }
        if (fields_seen_ & field_) {
          return Fail(BadTensor(file_, name, "has field '" + k + "' twice"));
        }
        fields_seen_ |= field_;
        return true;
      }
      default:
        return Unexpected("a key");
    }
  }
  bool end_object() {
    switch (state_) {
      case State::kTop:
        state_ = State::kDone;
        return true;
      case State::kMetadata:
        state_ = State::kTop;
        return true;
      case State::kTensor:
        if (fields_seen_ != (kDType | kShape | kOffsets)) {
          return Fail(BadTensor(file_, header_.tensors.back().name,
                                "lacks one of dtype, shape, data_offsets"));
        }
        state_ = State::kTop;
        return true;
      default:
        return Unexpected("the end of an object");
    }
  }
  bool start_array(size_t) {
    if (state_ == State::kTensor && field_ == kShape) {
      state_ = State::kShape;
      return true;
    }
    if (state_ == State::kTensor && field_ == kOffsets) {
      state_ = State::kOffsets;
      offsets_seen_ = 0;
      return true;
    }
    return Unexpected("an array");
  }
  bool end_array() {
    if (state_ == State::kShape) {
      state_ = State::kTensor;
      return true;
    }
    if (state_ == State::kOffsets) {
      if (offsets_seen_ != 2) {
        return Fail(
            BadTensor(file_, header_.tensors.back().name,
                      "has " + std::to_string(offsets_seen_) + " data_offsets instead of 2"));
      }
      state_ = State::kTensor;
      return true;
    }
    return Unexpected("the end of an array");
  }
  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception& ex) {
    if (!status_.ok()) return false;
    std::string what = ex.what();
    if (size_t p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    if (size_t p = what.find("; last read"); p != std::string::npos) what.resize(p);
    return Fail(Bad(file_, "header is not valid JSON at byte " + std::to_string(position) + " (" +
                               Printable(what) + ")"));
  }

 private:
  enum class State { kStart, kTop, kMetadata, kTensor, kShape, kOffsets, kDone };
  static constexpr int kDType = 1, kShape = 2, kOffsets = 4;

  bool Fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
    return false;
  }
  bool Unexpected(const char* what) {
    switch (state_) {
      case State::kStart:
        return Fail(Bad(file_, std::string("header is ") + what + ", not a JSON object"));
      case State::kTop:
        return Fail(key_ == "__metadata__"
                        ? Bad(file_, std::string("__metadata__ is ") + what + ", not an object")
                        : BadTensor(file_, key_, std::string("is ") + what + ", not an object"));
      case State::kMetadata:
        return Fail(Bad(file_, "__metadata__ value of '" + Printable(key_) + "' is " + what +
                                   ", not a string (it must be a flat string map)"));
      case State::kTensor:
      case State::kShape:
      case State::kOffsets:
        return Fail(BadTensor(file_, header_.tensors.back().name,
                              std::string("has ") + what + " where " +
                                  (state_ == State::kShape     ? "a dimension"
                                   : state_ == State::kOffsets ? "a data offset"
                                   : field_ == kDType          ? "a dtype string"
                                                               : "an array") +
                                  " belongs"));
      default:
        return Fail(Bad(file_, std::string("header has ") + what + " after its end"));
    }
  }

  std::string_view file_;
  Status status_;
  SafetensorsHeader header_;
  State state_ = State::kStart;
  std::string key_;  // the current top-level or __metadata__ key
  int field_ = 0;
  int fields_seen_ = 0;
  int offsets_seen_ = 0;
  bool seen_metadata_ = false;
};

}  // namespace

Result<uint64_t> ParseHeaderLength(std::string_view prefix, uint64_t file_size,
                                   std::string_view file) {
  if (prefix.size() < kLengthPrefixBytes || file_size < kLengthPrefixBytes) {
    return Bad(file,
               "is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<uint8_t>(prefix[i])} << (8 * i);
  if (n > kMaxHeaderBytes) {
    return Bad(file, "header length " + std::to_string(n) + " exceeds the limit of " +
                         std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (n > file_size - kLengthPrefixBytes) {
    return Bad(file, "header length " + std::to_string(n) + " runs beyond the end of the " +
                         std::to_string(file_size) + "-byte file");
  }
  if (n < 2) return Bad(file, "header length " + std::to_string(n) + " is too small for JSON");
  return n;
}

Result<SafetensorsHeader> ParseHeaderJson(std::string_view json, uint64_t file_size,
                                          std::string_view file) {
  HeaderSax sax(file);
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(json.begin(), json.end(), &sax,
                                   nlohmann::json::input_format_t::json, /*strict=*/true);
  } catch (const std::exception& e) {
    return Bad(file, std::string("header is not valid JSON (") + Printable(e.what()) + ")");
  }
  if (!sax.status().ok()) return sax.status();
  if (!ok) return Bad(file, "header is not valid JSON");

  SafetensorsHeader h = std::move(sax.header());
  h.header_length = json.size();
  const uint64_t data_length = file_size - kLengthPrefixBytes - json.size();

  // Duplicate names: sorting by name puts them side by side.
  {
    std::vector<const std::string*> names;
    names.reserve(h.tensors.size());
    for (const HeaderTensor& t : h.tensors) names.push_back(&t.name);
    std::sort(names.begin(), names.end(), [](auto* a, auto* b) { return *a < *b; });
    for (size_t i = 1; i < names.size(); ++i) {
      if (*names[i] == *names[i - 1]) return BadTensor(file, *names[i], "appears twice");
    }
  }

  for (const HeaderTensor& t : h.tensors) {
    if (t.begin > t.end) {
      return BadTensor(file, t.name,
                       "has data_offsets [" + std::to_string(t.begin) + ", " +
                           std::to_string(t.end) + "] that end before they begin");
    }
    const std::string what =
        "of shape " + t.shape.ToString() + " and dtype " + std::string(DTypeName(t.dtype));
    auto elements = t.shape.NumElements();
    if (!elements) return BadTensor(file, t.name, what + " has too many elements");
    uint64_t bits = 0;
    if (__builtin_mul_overflow(*elements, uint64_t(DTypeBits(t.dtype)), &bits)) {
      return BadTensor(file, t.name, what + " is too large (its size overflows 64 bits)");
    }
    auto bytes = DTypeBytes(t.dtype, *elements);
    if (!bytes) return BadTensor(file, t.name, what + " does not fill whole bytes");
    if (*bytes != t.end - t.begin) {
      return BadTensor(file, t.name,
                       "of shape " + t.shape.ToString() + " and dtype " +
                           std::string(DTypeName(t.dtype)) + " needs " + std::to_string(*bytes) +
                           " bytes, its data_offsets span " + std::to_string(t.end - t.begin));
    }
  }

  // Contiguous from 0: in offset order each range starts where the previous one ended.
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  for (const HeaderTensor& t : h.tensors) {
    if (t.begin != pos) {
      return BadTensor(file, t.name,
                       "starts at data offset " + std::to_string(t.begin) + " but the previous " +
                           "tensor ends at " + std::to_string(pos) +
                           (t.begin > pos ? " (a gap)" : " (an overlap)"));
    }
    pos = t.end;
  }
  if (pos != data_length) {
    if (pos > data_length) {
      const std::string& last = h.tensors.back().name;
      return BadTensor(file, last,
                       "ends at data offset " + std::to_string(pos) + ", beyond the " +
                           std::to_string(data_length) + " data bytes of the file (truncated?)");
    }
    return Bad(file, std::to_string(data_length - pos) + " trailing bytes after the last tensor " +
                         "(the data is " + std::to_string(data_length) +
                         " bytes, the tensors cover " + std::to_string(pos) + ")");
  }
  return h;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view bytes, uint64_t file_size,
                                                 std::string_view file) {
  DCP_ASSIGN_OR_RETURN(uint64_t n, ParseHeaderLength(bytes, file_size, file));
  if (bytes.size() < kLengthPrefixBytes + n) {
    return Bad(file, "header runs beyond the bytes given");
  }
  return ParseHeaderJson(bytes.substr(kLengthPrefixBytes, n), file_size, file);
}

Result<SafetensorsHeader> ReadSafetensorsHeader(storage::FileSystem& fs, const std::string& path) {
  DCP_ASSIGN_OR_RETURN(auto f, fs.OpenReadable(path));
  const uint64_t size = f->size();
  std::string prefix(kLengthPrefixBytes, '\0');
  if (size >= kLengthPrefixBytes) {
    DCP_RETURN_IF_ERROR(
        f->ReadAt(0, std::as_writable_bytes(std::span(prefix.data(), prefix.size()))));
  }
  DCP_ASSIGN_OR_RETURN(uint64_t n, ParseHeaderLength(prefix, size, path));
  std::string json(n, '\0');
  DCP_RETURN_IF_ERROR(
      f->ReadAt(kLengthPrefixBytes, std::as_writable_bytes(std::span(json.data(), json.size()))));
  return ParseHeaderJson(json, size, path);
}

}  // namespace dcp::hf
