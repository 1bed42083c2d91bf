#include "checkpoint/verify.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "checkpoint/chunk_reads.h"
#include "checkpoint/metadata_io.h"
#include "hf/safetensors_header.h"
#include "storage/chunk_reader.h"

namespace dcp::checkpoint {

namespace {

// Every range of `md` (tensor chunks and bytes entries) stored in data file `file`.
struct Range {
  storage::StoredRange range;
  const metadata::TensorMeta* tensor;
  const metadata::StoredChunk* chunk;
  const metadata::BytesMeta* bytes;
};

std::vector<Range> RangesOfFile(const metadata::Metadata& md, uint32_t file) {
  std::vector<Range> ranges;
  for (const auto& t : md.tensors) {
    for (const auto& c : t.chunks) {
      if (c.file == file) ranges.push_back({RangeOf(md, c), &t, &c, nullptr});
    }
  }
  for (const auto& b : md.bytes) {
    if (b.file == file) {
      ranges.push_back({{b.byte_offset, b.byte_length, b.xxh3, 0, {}}, nullptr, nullptr, &b});
    }
  }
  // In file order: the file is read sequentially once.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.range.byte_offset < b.range.byte_offset;
  });
  return ranges;
}

// A dcp tensor data file is also a safetensors file other tools read: its header must parse
// and describe every stored chunk where the metadata puts it, with its dtype and shape. Loads
// never read the header and the chunk checksums do not cover it, so only a verify sees it.
Status VerifySafetensorsHeader(storage::FileSystem& fs, const std::string& path,
                               const metadata::Metadata& md, uint32_t file) {
  auto header = hf::ReadSafetensorsHeader(fs, path);
  if (!header.ok()) {
    return DataLoss("data file " + path +
                    ": its safetensors header is damaged: " + header.status().message());
  }
  std::unordered_map<uint64_t, const hf::HeaderTensor*> at;  // by absolute data offset
  for (const hf::HeaderTensor& t : header->tensors) {
    if (t.end > t.begin) at[header->data_start() + t.begin] = &t;
  }
  // One pass over the metadata: each chunk of this file with the key its writer gave it, the
  // fqn, or "<fqn>.__dcp_chunk_<k>" for the k-th (in metadata order) of several in this file.
  for (const auto& t : md.tensors) {
    int here = 0, k = 0;
    for (const auto& c : t.chunks) here += c.file == file;
    for (const auto& c : t.chunks) {
      if (c.file != file) continue;
      const std::string key = here == 1 ? t.fqn : t.fqn + ".__dcp_chunk_" + std::to_string(k);
      ++k;
      if (c.byte_length == 0) continue;
      auto it = at.find(c.byte_offset);
      const hf::HeaderTensor* h = it == at.end() ? nullptr : it->second;
      if (!h || h->end - h->begin != c.byte_length || h->dtype != t.dtype ||
          !(h->shape == c.box.lengths) || h->name != key) {
        return DataLoss("data file " + path +
                        ": its safetensors header does not describe tensor '" + t.fqn + "' chunk " +
                        c.box.ToString() + " at byte " + std::to_string(c.byte_offset) +
                        " as the metadata does");
      }
    }
  }
  return OkStatus();
}

}  // namespace

Status VerifyDataFile(storage::FileSystem& fs, const std::string& path,
                      const metadata::Metadata& md, uint32_t file, uint64_t* bytes_checked) {
  return VerifyDataFileSpans(fs, path, md, file, {}, bytes_checked);
}

Status VerifyDataFileSpans(storage::FileSystem& fs, const std::string& path,
                           const metadata::Metadata& md, uint32_t file,
                           const std::vector<std::pair<uint64_t, uint64_t>>& spans,
                           uint64_t* bytes_checked) {
  auto inside = [&](const storage::StoredRange& r) {
    if (spans.empty()) return true;
    for (const auto& [offset, length] : spans) {
      if (r.byte_offset >= offset && r.byte_offset + r.byte_length <= offset + length) return true;
    }
    return false;
  };
  auto f = fs.OpenReadable(path);
  if (!f.ok()) {
    if (f.status().code() == StatusCode::kNotFound) {
      return DataLoss("data file " + path + " is missing");
    }
    return f.status();
  }
  if ((*f)->size() != md.files[file].size) {
    return DataLoss("data file " + path + " is " + std::to_string((*f)->size()) +
                    " bytes, the metadata expects " + std::to_string(md.files[file].size));
  }
  // Without checksums (HuggingFace sources) there is nothing to check beyond the size.
  if (!md.has_checksums) return OkStatus();
  std::vector<std::byte> buf;
  uint64_t checked = 0;
  for (const Range& r : RangesOfFile(md, file)) {
    if (!inside(r.range)) continue;
    // Streamed through a bounded buffer; every block checksum, or the one checksum.
    Status s = storage::VerifyRange(**f, r.range, buf, &checked);
    if (!s.ok()) {
      std::string what = r.bytes
                             ? "bytes entry '" + r.bytes->fqn + "'"
                             : "tensor '" + r.tensor->fqn + "' chunk " + r.chunk->box.ToString();
      return s.Annotate(path + ": " + what + ": ");
    }
  }
  if (bytes_checked) *bytes_checked += checked;
  return OkStatus();
}

Result<VerifyResult> Verify(storage::FileSystem& fs, const std::string& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  DCP_ASSIGN_OR_RETURN(metadata::Metadata md, ReadMetadata(fs, dir));
  VerifyResult report;
  report.files = md.files.size();
  report.tensors = md.tensors.size();
  report.bytes_entries = md.bytes.size();
  report.has_checksums = md.has_checksums;
  report.chunks = md.TotalChunks();
  for (uint32_t f = 0; f < md.files.size(); ++f) {
    const std::string path = storage::JoinPath(DataDirOf(dir), md.files[f].name);
    DCP_RETURN_IF_ERROR(VerifyDataFile(fs, path, md, f, &report.bytes_checked));
    // HuggingFace sources: their metadata was built from these very headers.
    if (md.has_checksums && md.files[f].name.ends_with(".safetensors")) {
      DCP_RETURN_IF_ERROR(VerifySafetensorsHeader(fs, path, md, f));
    }
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace dcp::checkpoint
