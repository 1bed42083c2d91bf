#include "storage/data_files.h"

#include <xxhash.h>

#include <memory>
#include <nlohmann/json.hpp>

namespace dcp::storage {
namespace {

// Hash and write in pieces so each piece is hashed while it is still in cache.
constexpr size_t kPiece = size_t{8} << 20;

Status AppendHashed(WritableFile& f, std::span<const std::byte> data, uint64_t* hash) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> st(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(st.get());
  for (size_t pos = 0; pos < data.size(); pos += kPiece) {
    auto piece = data.subspan(pos, std::min(kPiece, data.size() - pos));
    XXH3_64bits_update(st.get(), piece.data(), piece.size());
    DCP_RETURN_IF_ERROR(f.Append(piece));
  }
  *hash = XXH3_64bits_digest(st.get());
  return OkStatus();
}

Status Finish(WritableFile& f) {
  DCP_RETURN_IF_ERROR(f.Sync());
  return f.Close();
}

}  // namespace

uint64_t Checksum(std::span<const std::byte> data) { return XXH3_64bits(data.data(), data.size()); }

Result<WrittenFile> WriteSafetensorsFile(FileSystem& fs, const std::string& path,
                                         const std::vector<TensorToWrite>& tensors) {
  // Built as text, in order, in linear time (an ordered_json object's operator[] is a linear
  // search: quadratic in tensors per file). Same bytes as ordered_json::dump().
  std::string json = R"({"__metadata__":{"format":"pt"})";
  uint64_t pos = 0;
  for (const TensorToWrite& t : tensors) {
    json += ',';
    json += nlohmann::json(t.key).dump();
    json += R"(:{"dtype":")";
    json += DTypeName(t.dtype);
    json += R"(","shape":[)";
    for (int d = 0; d < t.shape.rank(); ++d) {
      if (d > 0) json += ',';
      json += std::to_string(t.shape[d]);
    }
    json += R"(],"data_offsets":[)" + std::to_string(pos) + "," +
            std::to_string(pos + t.data.size()) + "]}";
    pos += t.data.size();
  }
  json += '}';
  // Pad with spaces so the data starts 8-byte aligned, as the safetensors writer does.
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>(uint64_t{json.size()} >> (8 * i));
  prefix += json;

  DCP_ASSIGN_OR_RETURN(auto file, fs.NewWritableFile(path));
  DCP_RETURN_IF_ERROR(file->Append(std::as_bytes(std::span(prefix.data(), prefix.size()))));
  WrittenFile out;
  uint64_t offset = prefix.size();
  for (const TensorToWrite& t : tensors) {
    WrittenRange r{offset, t.data.size(), 0};
    DCP_RETURN_IF_ERROR(AppendHashed(*file, t.data, &r.xxh3));
    offset += t.data.size();
    out.ranges.push_back(r);
  }
  DCP_RETURN_IF_ERROR(Finish(*file));
  out.size = offset;
  return out;
}

Result<WrittenFile> WriteBytesFile(FileSystem& fs, const std::string& path,
                                   const std::vector<std::span<const std::byte>>& payloads) {
  DCP_ASSIGN_OR_RETURN(auto file, fs.NewWritableFile(path));
  WrittenFile out;
  uint64_t offset = 0;
  for (auto p : payloads) {
    WrittenRange r{offset, p.size(), 0};
    DCP_RETURN_IF_ERROR(AppendHashed(*file, p, &r.xxh3));
    offset += p.size();
    out.ranges.push_back(r);
  }
  DCP_RETURN_IF_ERROR(Finish(*file));
  out.size = offset;
  return out;
}

}  // namespace dcp::storage
