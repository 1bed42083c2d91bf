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

storage::StoredRange RangeOf(const metadata::Metadata& md, const metadata::StoredChunk& sc) {
  return {sc.byte_offset, sc.byte_length, sc.xxh3, md.block_size, sc.block_xxh3};
}

Status ChunkReads::Read(const planner::LocalLoadPlan& plan, std::span<const uint32_t> items) {
  const auto& entries = sd_.entries();
  done_.resize(plan.reads.size(), false);
  auto performs = [&](size_t k) { return from_storage_.empty() || from_storage_[k]; };
  std::vector<CopyRuns> runs;
  std::vector<storage::ChunkTarget> targets;
  for (const uint32_t item : items) {
    if (done_[item]) continue;
    const planner::ReadItem& first = plan.reads[item];
    const metadata::TensorMeta& t = md_.tensors[first.tensor];
    const metadata::StoredChunk& sc = t.chunks[first.stored];
    auto same_chunk = [&](size_t k) {
      return plan.reads[k].tensor == first.tensor && plan.reads[k].stored == first.stored;
    };
    // The items of this stored chunk: adjacent in plan.reads (PlanLoad sorts them so).
    size_t a = item, b = item + 1;
    while (a > 0 && same_chunk(a - 1)) --a;
    while (b < plan.reads.size() && same_chunk(b)) ++b;
    runs.clear();
    targets.clear();
    std::vector<uint32_t> mine;
    for (size_t k = a; k < b; ++k) {
      if (done_[k] || (k != item && !performs(k))) continue;
      const planner::ReadItem& r = plan.reads[k];
      auto cr = CopyRuns::Make(t.dtype, sc.box, entries[r.entry].chunks[r.dst_chunk].box, r.region);
      if (!cr.ok()) return cr.status().Annotate("checkpoint " + ckpt_ + ": '" + t.fqn + "': ");
      runs.push_back(std::move(cr).value());
      mine.push_back(static_cast<uint32_t>(k));
    }
    for (size_t k = 0; k < mine.size(); ++k) {
      const planner::ReadItem& r = plan.reads[mine[k]];
      targets.push_back({&runs[k], entries[r.entry].chunks[r.dst_chunk].view.bytes()});
      done_[mine[k]] = true;
    }
    auto file = Open(sc.file);
    Status s = file.status();
    if (s.ok()) {
      s = storage::ReadStoredChunk(**file, RangeOf(md_, sc), verify_, targets, bounce_,
                                   &stats_->bytes_read);
    }
    if (!s.ok()) {
      return s.Annotate("checkpoint " + ckpt_ + ": tensor '" + t.fqn + "' chunk " +
                        sc.box.ToString() + ": ");
    }
    ++stats_->chunks_read;
    if (between_chunks_) between_chunks_();
  }
  return OkStatus();
}

Status ChunkReads::ReadWhole(uint32_t tensor, uint32_t stored, std::span<std::byte> dst) {
  const metadata::TensorMeta& t = md_.tensors[tensor];
  const metadata::StoredChunk& sc = t.chunks[stored];
  auto file = Open(sc.file);
  Status s = file.status();
  if (s.ok()) {
    s = storage::ReadRangeInto(**file, RangeOf(md_, sc), verify_, dst.data(),
                               &stats_->bytes_read);
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
