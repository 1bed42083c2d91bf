#include "storage/data_files.h"

#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/checksum.h"

namespace dcp::storage {
namespace {

// Hash and write in pieces so each piece is hashed while it is still in cache.
constexpr size_t kPiece = size_t{8} << 20;

Status AppendHashed(WritableFile& f, std::span<const std::byte> data, uint64_t block_size,
                    WrittenRange* r) {
  StreamHasher hasher(block_size);
  for (size_t pos = 0; pos < data.size(); pos += kPiece) {
    auto piece = data.subspan(pos, std::min(kPiece, data.size() - pos));
    hasher.Update(piece);
    DCP_RETURN_IF_ERROR(f.Append(piece));
  }
  r->xxh3 = hasher.Finish(&r->block_xxh3);
  return OkStatus();
}

Status Finish(WritableFile& f) {
  DCP_RETURN_IF_ERROR(f.Sync());
  return f.Close();
}

// The header, then each tensor's data in `order`; durable and closed on return. The ranges
// are in the tensors' order.
Result<WrittenFile> WriteTensors(WritableFile& file, const std::string& header,
                                 const std::vector<TensorToWrite>& tensors,
                                 std::span<const size_t> order, uint64_t block_size) {
  uint64_t total = header.size();
  for (const TensorToWrite& t : tensors) total += t.data.size();
  file.WillWrite(total);
  DCP_RETURN_IF_ERROR(file.Append(std::as_bytes(std::span(header.data(), header.size()))));
  WrittenFile out;
  out.ranges.resize(tensors.size());
  uint64_t offset = header.size();
  for (size_t i : order) {
    const TensorToWrite& t = tensors[i];
    WrittenRange& r = out.ranges[i];
    r.byte_offset = offset;
    r.byte_length = t.data.size();
    DCP_RETURN_IF_ERROR(AppendHashed(file, t.data, block_size, &r));
    offset += t.data.size();
  }
  DCP_RETURN_IF_ERROR(Finish(file));
  out.size = offset;
  return out;
}

}  // namespace

SafetensorsHeader::SafetensorsHeader()
    : SafetensorsHeader(std::vector<std::pair<std::string, std::string>>{{"format", "pt"}}) {}

SafetensorsHeader::SafetensorsHeader(
    const std::vector<std::pair<std::string, std::string>>& metadata)
    : json_(R"({"__metadata__":{)") {
  for (size_t i = 0; i < metadata.size(); ++i) {
    if (i > 0) json_ += ',';
    json_ +=
        nlohmann::json(metadata[i].first).dump() + ':' + nlohmann::json(metadata[i].second).dump();
  }
  json_ += '}';
}

void SafetensorsHeader::Add(std::string_view key, DType dtype, const Shape& shape, uint64_t bytes) {
  json_ += ',';
  json_ += nlohmann::json(std::string(key)).dump();
  json_ += R"(:{"dtype":")";
  json_ += DTypeName(dtype);
  json_ += R"(","shape":[)";
  for (int d = 0; d < shape.rank(); ++d) {
    if (d > 0) json_ += ',';
    json_ += std::to_string(shape[d]);
  }
  json_ +=
      R"(],"data_offsets":[)" + std::to_string(pos_) + "," + std::to_string(pos_ + bytes) + "]}";
  pos_ += bytes;
}

std::string SafetensorsHeader::Finish() && {
  json_ += '}';
  json_.append((8 - json_.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t{json_.size()} >> (8 * i));
  return out + json_;
}

uint64_t Checksum(std::span<const std::byte> data) { return Xxh3(data); }

std::vector<size_t> StoredOrder(std::span<const uint64_t> sizes) {
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_partition(order.begin(), order.end(),
                        [&](size_t i) { return sizes[i] < kSmallChunkBytes; });
  return order;
}

DataFileLayout LayOutDataFile(std::span<const ChunkToLayOut> chunks) {
  std::vector<uint64_t> sizes;
  for (const ChunkToLayOut& c : chunks) sizes.push_back(c.bytes);
  DataFileLayout out{{}, StoredOrder(sizes)};
  SafetensorsHeader header;
  for (size_t i : out.order) header.Add(chunks[i].key, chunks[i].dtype, *chunks[i].shape, sizes[i]);
  out.header = std::move(header).Finish();
  return out;
}

Result<WrittenFile> WriteSafetensorsFile(FileSystem& fs, const std::string& path,
                                         const std::vector<TensorToWrite>& tensors,
                                         uint64_t block_size, const std::string& recycle_from,
                                         bool* recycled) {
  std::vector<ChunkToLayOut> chunks;
  for (const TensorToWrite& t : tensors)
    chunks.push_back({t.key, t.dtype, &t.shape, t.data.size()});
  const DataFileLayout layout = LayOutDataFile(chunks);

  std::unique_ptr<WritableFile> file;
  if (!recycle_from.empty()) {
    auto reused = fs.ReuseFile(recycle_from, path);
    if (reused.ok()) {
      file = std::move(reused).value();
    } else if (reused.status().code() != StatusCode::kNotFound) {
      return reused.status();
    }
  }
  if (recycled) *recycled = file != nullptr;
  if (!file) {
    DCP_ASSIGN_OR_RETURN(file, fs.NewWritableFile(path));
  }
  return WriteTensors(*file, layout.header, tensors, layout.order, block_size);
}

Result<WrittenFile> WriteSafetensorsFileWithHeader(FileSystem& fs, const std::string& path,
                                                   const std::string& header,
                                                   const std::vector<TensorToWrite>& tensors) {
  DCP_ASSIGN_OR_RETURN(auto file, fs.NewWritableFile(path));
  std::vector<size_t> in_order(tensors.size());
  std::iota(in_order.begin(), in_order.end(), size_t{0});
  return WriteTensors(*file, header, tensors, in_order, 0);
}

Result<WrittenFile> WriteBytesFile(FileSystem& fs, const std::string& path,
                                   const std::vector<std::span<const std::byte>>& payloads) {
  DCP_ASSIGN_OR_RETURN(auto file, fs.NewWritableFile(path));
  uint64_t total = 0;
  for (auto p : payloads) total += p.size();
  file->WillWrite(total);
  WrittenFile out;
  uint64_t offset = 0;
  for (auto p : payloads) {
    WrittenRange r{offset, p.size(), 0, {}};
    DCP_RETURN_IF_ERROR(AppendHashed(*file, p, 0, &r));
    offset += p.size();
    out.ranges.push_back(r);
  }
  DCP_RETURN_IF_ERROR(Finish(*file));
  out.size = offset;
  return out;
}

}  // namespace dcp::storage
