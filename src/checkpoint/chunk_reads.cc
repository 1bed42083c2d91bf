#include "checkpoint/chunk_reads.h"

#include <algorithm>

#include "checkpoint/metadata_io.h"
#include "core/copy_runs.h"
#include "storage/chunk_reader.h"

namespace dcp::checkpoint {

ChunkReads::ChunkReads(StateDict& sd, const metadata::Metadata& md, const std::string& ckpt,
                       const LoadOptions& opts, storage::FileSystem& fs, LoadResult* stats)
    : sd_(sd),
      md_(md),
      ckpt_(ckpt),
      data_dir_(DataDirOf(ckpt)),  // differs from ckpt for a single-file HF source
      verify_(opts.verify_checksums && md.has_checksums),
      max_open_(static_cast<size_t>(std::max(opts.max_open_files, 1))),
      fs_(fs),
      stats_(stats) {}

// Opening checks the size recorded in the metadata, so a truncated file is reported as
// such before any read.
Result<storage::ReadableFile*> ChunkReads::Open(uint32_t file) {
  for (auto it = open_.begin(); it != open_.end(); ++it) {
    if (it->first == file) {
      open_.splice(open_.begin(), open_, it);
      return open_.front().second.get();
    }
  }
  const metadata::FileInfo& info = md_.files[file];
  const std::string path = storage::JoinPath(data_dir_, info.name);
  auto f = fs_.OpenReadable(path);
  if (!f.ok()) {
    if (f.status().code() == StatusCode::kNotFound) {
      return DataLoss("data file " + path + " is missing");
    }
    return f.status();
  }
  if ((*f)->size() != info.size) {
    return DataLoss("data file " + path + " is " + std::to_string((*f)->size()) +
                    " bytes, the metadata expects " + std::to_string(info.size) +
                    ((*f)->size() < info.size ? " (truncated)" : ""));
  }
  ++stats_->files_opened;
  if (open_.size() == max_open_) open_.pop_back();
  open_.emplace_front(file, std::move(f).value());
  return open_.front().second.get();
}

Status ChunkReads::Read(const planner::LocalLoadPlan& plan, std::span<const uint32_t> items) {
  const auto& entries = sd_.entries();
  std::vector<CopyRuns> runs;
  std::vector<storage::ChunkTarget> targets;
  for (size_t i = 0; i < items.size();) {
    const planner::ReadItem& first = plan.reads[items[i]];
    const metadata::TensorMeta& t = md_.tensors[first.tensor];
    const metadata::StoredChunk& sc = t.chunks[first.stored];
    size_t j = i;
    runs.clear();
    targets.clear();
    for (; j < items.size() && plan.reads[items[j]].tensor == first.tensor &&
           plan.reads[items[j]].stored == first.stored;
         ++j) {
      const planner::ReadItem& r = plan.reads[items[j]];
      auto cr = CopyRuns::Make(t.dtype, sc.box, entries[r.entry].chunks[r.dst_chunk].box, r.region);
      if (!cr.ok()) return cr.status().Annotate("checkpoint " + ckpt_ + ": '" + t.fqn + "': ");
      runs.push_back(std::move(cr).value());
    }
    for (size_t k = i; k < j; ++k) {
      const planner::ReadItem& r = plan.reads[items[k]];
      targets.push_back({&runs[k - i], entries[r.entry].chunks[r.dst_chunk].view.bytes()});
    }
    auto file = Open(sc.file);
    Status s = file.status();
    if (s.ok()) {
      s = storage::ReadStoredChunk(**file, {sc.byte_offset, sc.byte_length, sc.xxh3}, verify_,
                                   targets, bounce_, &stats_->bytes_read);
    }
    if (!s.ok()) {
      return s.Annotate("checkpoint " + ckpt_ + ": tensor '" + t.fqn + "' chunk " +
                        sc.box.ToString() + ": ");
    }
    ++stats_->chunks_read;
    if (between_chunks_) between_chunks_();
    i = j;
  }
  return OkStatus();
}

Status ChunkReads::ReadWhole(uint32_t tensor, uint32_t stored, std::span<std::byte> dst) {
  const metadata::TensorMeta& t = md_.tensors[tensor];
  const metadata::StoredChunk& sc = t.chunks[stored];
  auto file = Open(sc.file);
  Status s = file.status();
  if (s.ok()) {
    s = storage::ReadRangeInto(**file, {sc.byte_offset, sc.byte_length, sc.xxh3}, verify_,
                               dst.data(), &stats_->bytes_read);
  }
  if (!s.ok()) {
    return s.Annotate("checkpoint " + ckpt_ + ": tensor '" + t.fqn + "' chunk " +
                      sc.box.ToString() + ": ");
  }
  ++stats_->chunks_read;
  return OkStatus();
}

Status ChunkReads::ReadBytesEntries(const planner::LocalLoadPlan& plan) {
  for (const planner::BytesRead& br : plan.bytes) {
    const metadata::BytesMeta& b = md_.bytes[br.bytes];
    std::vector<std::byte>& dst = sd_.mutable_bytes(br.entry);
    dst.resize(b.byte_length);
    auto file = Open(b.file);
    Status s = file.status();
    if (s.ok()) {
      s = storage::ReadRangeInto(**file, {b.byte_offset, b.byte_length, b.xxh3}, verify_,
                                 dst.data(), &stats_->bytes_read);
    }
    if (!s.ok()) return s.Annotate("checkpoint " + ckpt_ + ": bytes entry '" + b.fqn + "': ");
  }
  return OkStatus();
}

}  // namespace dcp::checkpoint
