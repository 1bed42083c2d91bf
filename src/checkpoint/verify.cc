#include "checkpoint/verify.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <span>
#include <unordered_map>

#include "checkpoint/chunk_reads.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/names.h"
#include "hf/safetensors_header.h"
#include "storage/chunk_reader.h"

namespace dcp::checkpoint {

namespace {

// A range of a data file: a tensor chunk or a bytes entry.
struct Range {
  storage::StoredRange range;
  const metadata::TensorMeta* tensor;
  const metadata::StoredChunk* chunk;
  const metadata::BytesMeta* bytes;
  std::string key;  // a tensor chunk's key in the file's safetensors header (ChunkKey)
};

// Every data file's ranges, each file's in file order (read sequentially once), from one pass
// over the metadata: O(chunks), however many files.
std::vector<std::vector<Range>> RangesByFile(const metadata::Metadata& md) {
  std::vector<std::vector<Range>> by_file(md.files.size());
  std::unordered_map<uint32_t, int64_t> in_file, next;  // per tensor: its chunks per file
  for (const auto& t : md.tensors) {
    in_file.clear();
    next.clear();
    if (t.chunks.size() > 1) {
      for (const auto& c : t.chunks) ++in_file[c.file];
    }
    for (const auto& c : t.chunks) {
      if (c.file >= by_file.size()) continue;
      const bool several = t.chunks.size() > 1 && in_file[c.file] > 1;
      by_file[c.file].push_back({RangeOf(md, c), &t, &c, nullptr,
                                 ChunkKey(t.fqn, several, several ? next[c.file]++ : 0)});
    }
  }
  for (const auto& b : md.bytes) {
    if (b.file >= by_file.size()) continue;
    by_file[b.file].push_back(
        {{b.byte_offset, b.byte_length, b.xxh3, 0, {}}, nullptr, nullptr, &b});
  }
  for (std::vector<Range>& ranges : by_file) {
    std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
      return a.range.byte_offset < b.range.byte_offset;
    });
  }
  return by_file;
}

// A dcp tensor data file is also a safetensors file other tools read: its header must parse
// and describe every stored chunk where the metadata puts it, with its dtype and shape. Loads
// never read the header and the chunk checksums do not cover it, so only a verify sees it.
// A base's file referenced by an incremental checkpoint holds its chunks under the base's keys.
Status VerifySafetensorsHeader(storage::FileSystem& fs, const std::string& path,
                               std::span<const Range> ranges, bool check_keys) {
  auto header = hf::ReadSafetensorsHeader(fs, path);
  if (!header.ok()) {
    return DataLoss("data file " + path +
                    ": its safetensors header is damaged: " + header.status().message());
  }
  std::unordered_map<uint64_t, const hf::HeaderTensor*> at;  // by absolute data offset
  for (const hf::HeaderTensor& t : header->tensors) {
    if (t.end > t.begin) at[header->data_start() + t.begin] = &t;
  }
  for (const Range& r : ranges) {
    if (!r.tensor || r.chunk->byte_length == 0) continue;
    const metadata::TensorMeta& t = *r.tensor;
    const metadata::StoredChunk& c = *r.chunk;
    auto it = at.find(c.byte_offset);
    const hf::HeaderTensor* h = it == at.end() ? nullptr : it->second;
    if (!h || h->end - h->begin != c.byte_length || h->dtype != t.dtype ||
        !(h->shape == c.box.lengths) || (check_keys && h->name != r.key)) {
      return DataLoss("data file " + path + ": its safetensors header does not describe tensor '" +
                      t.fqn + "' chunk " + c.box.ToString() + " at byte " +
                      std::to_string(c.byte_offset) + " as the metadata does");
    }
  }
  return OkStatus();
}

// Whether `r` lies wholly inside one of `spans` (or `spans` is empty: the whole file).
bool Inside(const storage::StoredRange& r,
            const std::vector<std::pair<uint64_t, uint64_t>>& spans) {
  if (spans.empty()) return true;
  for (const auto& [offset, length] : spans) {
    if (r.byte_offset >= offset && r.byte_offset + r.byte_length <= offset + length) return true;
  }
  return false;
}

// Data file `file` of `md`, read at `path`: present, its recorded size, every checksum of its
// ranges (already found). Adds the bytes checked.
Status VerifyRanges(storage::FileSystem& fs, const std::string& path, const metadata::Metadata& md,
                    uint32_t file, std::span<const Range> ranges, uint64_t* bytes_checked) {
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
  for (const Range& r : ranges) {
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

}  // namespace

std::vector<std::vector<storage::StoredRange>> StoredRangesByFile(const metadata::Metadata& md) {
  std::vector<std::vector<storage::StoredRange>> out(md.files.size());
  if (!md.has_checksums) return out;
  const std::vector<std::vector<Range>> by_file = RangesByFile(md);
  for (size_t f = 0; f < by_file.size(); ++f) {
    for (const Range& r : by_file[f]) out[f].push_back(r.range);
  }
  return out;
}

std::vector<storage::StoredRange> RangesWithin(
    std::span<const storage::StoredRange> ranges,
    const std::vector<std::pair<uint64_t, uint64_t>>& spans) {
  std::vector<storage::StoredRange> out;
  for (const storage::StoredRange& r : ranges) {
    if (Inside(r, spans)) out.push_back(r);
  }
  return out;
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
  const std::vector<std::vector<Range>> by_file = RangesByFile(md);
  for (uint32_t f = 0; f < md.files.size(); ++f) {
    const std::string path = DataFilePath(dir, md.files[f]);
    DCP_RETURN_IF_ERROR(VerifyRanges(fs, path, md, f, by_file[f], &report.bytes_checked));
    // dcp's own tensor data files (a HuggingFace source's metadata was built from its headers).
    if (TensorDataFileRank(md.files[f].name) >= 0) {
      // Keys follow from this metadata only in files this save wrote; in an incremental
      // checkpoint a file of a base (or of an earlier save here) holds its chunks under that
      // save's keys.
      const bool own = md.files[f].base.empty() &&
                       (metadata::VersionFor(md) < metadata::kFirstReferenceVersion ||
                        md.files[f].name.rfind("data-" + SaveIdHex(md.save_id) + "-", 0) == 0);
      DCP_RETURN_IF_ERROR(VerifySafetensorsHeader(fs, path, by_file[f], own));
    }
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace dcp::checkpoint
