#include "checkpoint/verify.h"

#include <algorithm>
#include <chrono>

#include "checkpoint/chunk_reads.h"
#include "checkpoint/metadata_io.h"
#include "storage/chunk_reader.h"

namespace dcp::checkpoint {

Result<VerifyResult> Verify(storage::FileSystem& fs, const std::string& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  DCP_ASSIGN_OR_RETURN(metadata::Metadata md, ReadMetadata(fs, dir));
  VerifyResult report;
  report.files = md.files.size();
  report.tensors = md.tensors.size();
  report.bytes_entries = md.bytes.size();
  report.has_checksums = md.has_checksums;

  // Every range of every file, in file order, so each file is read sequentially once.
  struct Range {
    uint32_t file;
    storage::StoredRange range;
    const metadata::TensorMeta* tensor;
    const metadata::StoredChunk* chunk;
    const metadata::BytesMeta* bytes;
  };
  std::vector<Range> ranges;
  for (const auto& t : md.tensors) {
    for (const auto& c : t.chunks) {
      ranges.push_back({c.file, RangeOf(md, c), &t, &c, nullptr});
    }
  }
  for (const auto& b : md.bytes) {
    ranges.push_back({b.file, {b.byte_offset, b.byte_length, b.xxh3, 0, {}}, nullptr, nullptr, &b});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return std::tie(a.file, a.range.byte_offset) < std::tie(b.file, b.range.byte_offset);
  });
  report.chunks = md.TotalChunks();

  std::vector<std::byte> buf;
  size_t i = 0;
  const std::string data_dir = DataDirOf(dir);
  for (uint32_t f = 0; f < md.files.size(); ++f) {
    const std::string path = storage::JoinPath(data_dir, md.files[f].name);
    auto file = fs.OpenReadable(path);
    if (!file.ok()) {
      if (file.status().code() == StatusCode::kNotFound) {
        return DataLoss("data file " + path + " is missing");
      }
      return file.status();
    }
    if ((*file)->size() != md.files[f].size) {
      return DataLoss("data file " + path + " is " + std::to_string((*file)->size()) +
                      " bytes, the metadata expects " + std::to_string(md.files[f].size));
    }
    // Without checksums (HuggingFace sources) there is nothing to check beyond the sizes.
    for (; i < ranges.size() && ranges[i].file == f && md.has_checksums; ++i) {
      const Range& r = ranges[i];
      // Streamed through a bounded buffer; every block checksum, or the one checksum.
      Status s = storage::VerifyRange(**file, r.range, buf, &report.bytes_checked);
      if (!s.ok()) {
        std::string what = r.bytes
                               ? "bytes entry '" + r.bytes->fqn + "'"
                               : "tensor '" + r.tensor->fqn + "' chunk " + r.chunk->box.ToString();
        return s.Annotate("checkpoint " + dir + ": " + what + ": ");
      }
    }
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace dcp::checkpoint
