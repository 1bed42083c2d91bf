#include "checkpoint/incremental_copy.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "checkpoint/chunk_reads.h"
#include "checkpoint/names.h"
#include "storage/chunk_reader.h"
#include "storage/data_files.h"

namespace dcp::checkpoint {

IncrementalCopy PlanIncrementalCopy(const metadata::Metadata& src, const BaseChunks& base) {
  IncrementalCopy out;
  out.md = src;
  const size_t nfiles = src.files.size();
  std::vector<bool> holds_bytes(nfiles, false);
  for (const auto& b : src.bytes) {
    if (b.file < nfiles) holds_bytes[b.file] = true;
  }
  // What each chunk becomes, in metadata order (tensors by fqn, chunks by box).
  struct Kept {
    const metadata::StoredChunk* chunk;
    metadata::StoredChunk* copy;  // in out.md
    std::string key;
    DType dtype;
  };
  std::vector<std::vector<Kept>> kept(nfiles);
  std::vector<uint64_t> referenced_in(nfiles, 0);
  // The base files referenced, each once, in the order first referenced.
  std::map<std::pair<std::string, std::string>, uint32_t> referenced_file;  // (base, name)
  std::vector<metadata::FileInfo> referenced_files;
  std::vector<std::pair<metadata::StoredChunk*, uint32_t>> references;  // chunk, its entry
  for (size_t t = 0; t < src.tensors.size(); ++t) {
    const metadata::TensorMeta& tm = src.tensors[t];
    std::unordered_map<uint32_t, uint64_t> in_file, next;  // kept chunks of tm per file
    std::vector<std::optional<Reused>> found(tm.chunks.size());
    for (size_t c = 0; c < tm.chunks.size(); ++c) {
      const metadata::StoredChunk& sc = tm.chunks[c];
      if (sc.file >= nfiles || holds_bytes[sc.file] || !src.has_checksums) continue;
      found[c] = base.FindRecorded(tm.fqn, tm.dtype, sc, src.block_size);
    }
    for (size_t c = 0; c < tm.chunks.size(); ++c) {
      if (!found[c] && tm.chunks[c].file < nfiles) ++in_file[tm.chunks[c].file];
    }
    for (size_t c = 0; c < tm.chunks.size(); ++c) {
      const metadata::StoredChunk& sc = tm.chunks[c];
      metadata::StoredChunk& copy = out.md.tensors[t].chunks[c];
      if (sc.file >= nfiles) continue;
      if (found[c]) {
        const Reused& r = *found[c];
        auto [it, added] = referenced_file.try_emplace(
            {r.file.base, r.file.name}, static_cast<uint32_t>(referenced_files.size()));
        if (added) referenced_files.push_back(r.file);
        references.emplace_back(&copy, it->second);
        copy.byte_offset = r.byte_offset;
        ++referenced_in[sc.file];
        out.bytes_referenced += sc.byte_length;
        ++out.chunks_referenced;
        continue;
      }
      // The key the metadata implies (ChunkKey): over the chunks of tm the new file keeps.
      const bool several = in_file[sc.file] > 1;
      kept[sc.file].push_back(
          {&sc, &copy, ChunkKey(tm.fqn, several, several ? next[sc.file]++ : 0), tm.dtype});
    }
  }
  // The files: each source file kept whole, cut to its unreferenced chunks, or dropped; then
  // the referenced files of bases.
  std::vector<uint32_t> index(nfiles, 0);
  out.md.files.clear();
  for (size_t f = 0; f < nfiles; ++f) {
    FileCopy fc;
    fc.name = src.files[f].name;
    metadata::FileInfo info = src.files[f];
    if (referenced_in[f] == 0) {
      fc.kind = FileCopy::Kind::kWhole;
    } else if (kept[f].empty()) {
      fc.kind = FileCopy::Kind::kNone;
    } else {
      fc.kind = FileCopy::Kind::kSubset;
      // Kept chunks in the source's order: the source is read once, front to back.
      std::stable_sort(kept[f].begin(), kept[f].end(), [](const Kept& a, const Kept& b) {
        return a.chunk->byte_offset < b.chunk->byte_offset;
      });
      storage::SafetensorsHeader header;
      for (const Kept& k : kept[f]) {
        header.Add(k.key, k.dtype, k.chunk->box.lengths, k.chunk->byte_length);
      }
      fc.header = std::move(header).Finish();
      uint64_t at = fc.header.size();
      for (const Kept& k : kept[f]) {
        k.copy->byte_offset = at;
        at += k.chunk->byte_length;
        fc.kept.push_back(k.chunk);
      }
      info.size = at;
    }
    if (fc.kind != FileCopy::Kind::kNone) {
      index[f] = static_cast<uint32_t>(out.md.files.size());
      out.md.files.push_back(std::move(info));
      for (const Kept& k : kept[f]) k.copy->file = index[f];
    }
    out.files.push_back(std::move(fc));
  }
  const auto first_reference = static_cast<uint32_t>(out.md.files.size());
  for (auto& info : referenced_files) out.md.files.push_back(std::move(info));
  for (auto& [chunk, entry] : references) chunk->file = first_reference + entry;
  for (auto& b : out.md.bytes) b.file = index[b.file];
  return out;
}

Status WriteKeptChunks(const FileCopy& f, const metadata::Metadata& src,
                       storage::FileSystem& src_fs, const std::string& src_dir,
                       storage::FileSystem& dst_fs, const std::string& dst_dir) {
  const std::string from = storage::JoinPath(src_dir, f.name);
  DCP_ASSIGN_OR_RETURN(auto in, src_fs.OpenReadable(from));
  DCP_ASSIGN_OR_RETURN(auto out, dst_fs.NewWritableFile(storage::JoinPath(dst_dir, f.name)));
  std::vector<storage::StoredRange> ranges;
  for (const metadata::StoredChunk* c : f.kept) ranges.push_back(RangeOf(src, *c));
  storage::StreamVerifier verifier(ranges, from);
  DCP_RETURN_IF_ERROR(out->Append(std::as_bytes(std::span(f.header.data(), f.header.size()))));
  // Pieces of whole checksum blocks, so the verifier hashes as it goes.
  const uint64_t piece = std::max<uint64_t>(src.block_size, 1) * 16;
  std::vector<std::byte> buf;
  for (const storage::StoredRange& r : ranges) {
    for (uint64_t done = 0; done < r.byte_length;) {
      const uint64_t n = std::min<uint64_t>(piece, r.byte_length - done);
      buf.resize(std::max<uint64_t>(buf.size(), n));
      const std::span<std::byte> bytes(buf.data(), n);
      DCP_RETURN_IF_ERROR(in->ReadAt(r.byte_offset + done, bytes));
      DCP_RETURN_IF_ERROR(verifier.Add(r.byte_offset + done, bytes));
      DCP_RETURN_IF_ERROR(out->Append(bytes));
      done += n;
    }
  }
  DCP_RETURN_IF_ERROR(verifier.Finish());
  DCP_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

}  // namespace dcp::checkpoint
