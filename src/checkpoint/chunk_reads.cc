#include "checkpoint/chunk_reads.h"

#include <algorithm>
#include <new>
#include <tuple>

#include "checkpoint/metadata_io.h"
#include "core/copy_runs.h"
#include "storage/chunk_reader.h"

namespace dcp::checkpoint {

ChunkReads::ChunkReads(StateDict& sd, const metadata::Metadata& md, const std::string& ckpt,
                       const LoadOptions& opts, storage::FileSystem& fs, LoadResult* stats)
    : sd_(sd),
      md_(md),
      ckpt_(ckpt),
      verify_(opts.verify_checksums && md.has_checksums),
      max_open_(static_cast<size_t>(std::max(opts.max_open_files, 1))),
      fs_(fs),
      stats_(stats) {}

// Opening checks the size recorded in the metadata, so a truncated file is reported as
// such before any read (on an object store, which opens without asking, at the read that
// passes its end).
Result<storage::ReadableFile*> ChunkReads::Open(uint32_t file) {
  for (auto it = open_.begin(); it != open_.end(); ++it) {
    if (it->first == file) {
      open_.splice(open_.begin(), open_, it);
      return open_.front().second.get();
    }
  }
  const metadata::FileInfo& info = md_.files[file];
  const std::string path = DataFilePath(ckpt_, info);
  auto f = fs_.OpenReadableSized(path, info.size);
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
  // An object store's file holds no descriptor, but the extents announced in it: closing it
  // would send its reads out one GET each, so only file systems' files are limited.
  while (!fs_.IsObjectStore() && open_.size() >= max_open_) open_.pop_back();
  open_.emplace_front(file, std::move(f).value());
  if (auto it = announced_.find(file); it != announced_.end()) {
    open_.front().second->WillRead(it->second);
  }
  return open_.front().second.get();
}

storage::StoredRange RangeOf(const metadata::Metadata& md, const metadata::StoredChunk& sc) {
  return {sc.byte_offset, sc.byte_length, sc.xxh3, md.block_size, sc.block_xxh3};
}

void ChunkReads::HintRanges(const std::vector<std::pair<uint32_t, uint32_t>>& chunks) {
  std::map<uint32_t, std::vector<storage::ByteRange>> by_file;
  for (const auto& [tensor, stored] : chunks) {
    // Each stored chunk once (several items share one; the shared and private plans may name
    // the same), so that an extent waits for no byte twice.
    if (!announced_chunks_.insert({tensor, stored}).second) continue;
    const metadata::StoredChunk& sc = md_.tensors[tensor].chunks[stored];
    by_file[sc.file].push_back({sc.byte_offset, sc.byte_length});
  }
  Announce(by_file);
}

void ChunkReads::Announce(std::map<uint32_t, std::vector<storage::ByteRange>>& by_file) {
  for (auto& [file, ranges] : by_file) {
    auto f = Open(file);
    if (f.ok()) (*f)->WillRead(ranges);  // an open that fails is reported by the read itself
    // A file system's file closed by the LRU of open files is told again when reopened (Open);
    // an object store's files stay open until the load ends.
    if (!fs_.IsObjectStore()) {
      std::vector<storage::ByteRange>& kept = announced_[file];
      kept.insert(kept.end(), ranges.begin(), ranges.end());
    }
  }
}

void ChunkReads::HintWhole(const std::vector<std::pair<uint32_t, uint32_t>>& chunks) {
  if (fs_.IsObjectStore()) HintRanges(chunks);
}

void ChunkReads::HintPrivate() {
  if (!fs_.IsObjectStore() || private_plan_ == nullptr) return;
  std::vector<bool>& done = done_[private_plan_];
  done.resize(private_plan_->reads.size(), false);
  Hint(*private_plan_, done);
}

void ChunkReads::Hint(const planner::LocalLoadPlan& plan, const std::vector<bool>& done) {
  // Once per plan, for all of its reads this rank makes. An object store then fetches them in
  // file order ahead of reads that come one broadcast at a time. A file system reads a rank's
  // own chunks ahead by itself (they come in file order); the slabs of shared shards (some
  // rows of a tensor, the next ones another member's) are announced as the blocks each read
  // takes, and advised a window ahead of the reads (ReadableFile::WillRead).
  if (!fs_.IsObjectStore() && (private_plan_ == nullptr || &plan == private_plan_)) return;
  if (!hinted_.insert(&plan).second) return;
  if (!fs_.IsObjectStore()) {
    std::map<uint32_t, std::vector<storage::ByteRange>> by_file;
    for (size_t k = 0; k < plan.reads.size(); ++k) {
      if (done[k]) continue;
      const planner::ReadItem& r = plan.reads[k];
      const metadata::TensorMeta& t = md_.tensors[r.tensor];
      const metadata::StoredChunk& sc = t.chunks[r.stored];
      auto runs = CopyRuns::Make(t.dtype, sc.box, r.region, r.region);
      if (!runs.ok()) continue;  // the read itself reports it
      const storage::ByteRange b = storage::BytesReadFor(RangeOf(md_, sc), verify_, *runs);
      if (b.length > 0) by_file[sc.file].push_back({sc.byte_offset + b.offset, b.length});
    }
    Announce(by_file);
    return;
  }
  std::vector<std::pair<uint32_t, uint32_t>> chunks;
  for (size_t k = 0; k < plan.reads.size(); ++k) {
    if (done[k] || (&plan == private_plan_ && !FromStorage(k))) continue;
    chunks.emplace_back(plan.reads[k].tensor, plan.reads[k].stored);
  }
  HintRanges(chunks);
}

Status ChunkReads::Read(const planner::LocalLoadPlan& plan, std::span<const uint32_t> items) {
  const auto& entries = sd_.entries();
  std::vector<bool>& done = done_[&plan];
  done.resize(plan.reads.size(), false);
  std::vector<bool>* private_done = nullptr;
  if (private_plan_ && private_plan_ != &plan) {
    private_done = &done_[private_plan_];
    private_done->resize(private_plan_->reads.size(), false);
  }
  Hint(plan, done);
  std::vector<CopyRuns> runs;
  std::vector<storage::ChunkTarget> targets;
  std::vector<std::pair<std::vector<bool>*, size_t>> filled;
  for (const uint32_t item : items) {
    if (done[item]) continue;
    if (stop_.stop_requested()) return Unavailable("checkpoint " + ckpt_ + ": reads stopped");
    const planner::ReadItem& first = plan.reads[item];
    const metadata::TensorMeta& t = md_.tensors[first.tensor];
    const metadata::StoredChunk& sc = t.chunks[first.stored];
    auto same_chunk = [&](const planner::ReadItem& r) {
      return r.tensor == first.tensor && r.stored == first.stored;
    };
    runs.clear();
    targets.clear();
    filled.clear();
    auto add = [&](const planner::ReadItem& r, std::vector<bool>* d, size_t k) -> Status {
      auto cr = CopyRuns::Make(t.dtype, sc.box, entries[r.entry].chunks[r.dst_chunk].box, r.region);
      if (!cr.ok()) return cr.status().Annotate("checkpoint " + ckpt_ + ": '" + t.fqn + "': ");
      runs.push_back(std::move(cr).value());
      filled.push_back({d, k});
      return OkStatus();
    };
    // This plan's items of the stored chunk: adjacent.
    size_t a = item, b = item + 1;
    while (a > 0 && same_chunk(plan.reads[a - 1])) --a;
    while (b < plan.reads.size() && same_chunk(plan.reads[b])) ++b;
    const bool is_private = &plan == private_plan_;
    for (size_t k = a; k < b; ++k) {
      const bool mine = k == item || !is_private || FromStorage(k);
      if (!done[k] && mine) DCP_RETURN_IF_ERROR(add(plan.reads[k], &done, k));
    }
    // The private items it feeds too: adjacent in the private plan, which is sorted by
    // (file, byte offset, tensor, stored chunk).
    if (private_done) {
      const auto& pr = private_plan_->reads;
      auto key = [&](const planner::ReadItem& r) {
        const metadata::StoredChunk& c = md_.tensors[r.tensor].chunks[r.stored];
        return std::tuple(c.file, c.byte_offset, r.tensor, r.stored);
      };
      const auto want = key(first);
      size_t k = std::partition_point(pr.begin(), pr.end(),
                                      [&](const planner::ReadItem& r) { return key(r) < want; }) -
                 pr.begin();
      for (; k < pr.size() && same_chunk(pr[k]); ++k) {
        if (!(*private_done)[k] && FromStorage(k)) {
          DCP_RETURN_IF_ERROR(add(pr[k], private_done, k));
        }
      }
    }
    for (size_t k = 0; k < filled.size(); ++k) {
      const auto& [d, index] = filled[k];
      const planner::ReadItem& r = (d == &done ? plan : *private_plan_).reads[index];
      targets.push_back({&runs[k], entries[r.entry].chunks[r.dst_chunk].view.bytes()});
      (*d)[index] = true;
    }
    auto file = Open(sc.file);
    Status s = file.status();
    if (s.ok()) {
      s = storage::ReadStoredChunk(**file, RangeOf(md_, sc), verify_, targets, bounce_,
                                   &stats_->bytes_read);
    }
    if (!Noted(sc.file, s).ok()) {
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
    s = storage::ReadRangeInto(**file, RangeOf(md_, sc), verify_, dst.data(), &stats_->bytes_read);
  }
  if (!Noted(sc.file, s).ok()) {
    return s.Annotate("checkpoint " + ckpt_ + ": tensor '" + t.fqn + "' chunk " +
                      sc.box.ToString() + ": ");
  }
  ++stats_->chunks_read;
  return OkStatus();
}

Status ChunkReads::ReadBytesEntries(const planner::LocalLoadPlan& plan) {
  if (fs_.IsObjectStore()) {
    // Neighbouring values then come in one request rather than one round trip each.
    std::map<uint32_t, std::vector<storage::ByteRange>> by_file;
    for (const planner::BytesRead& br : plan.bytes) {
      const metadata::BytesMeta& b = md_.bytes[br.bytes];
      by_file[b.file].push_back({b.byte_offset, b.byte_length});
    }
    Announce(by_file);
  }
  for (const planner::BytesRead& br : plan.bytes) {
    const metadata::BytesMeta& b = md_.bytes[br.bytes];
    std::vector<std::byte>& dst = sd_.mutable_bytes(br.entry);
    // The file is opened first: opening checks its real size against the metadata's, which
    // the decoder checked against the entry's range, so no size from a metadata file alone
    // is allocated. An allocation that still fails is an error of this load, not an
    // exception past the collectives.
    auto file = Open(b.file);
    Status s = file.status();
    if (s.ok()) {
      try {
        dst.resize(b.byte_length);
      } catch (const std::bad_alloc&) {
        s = Unavailable("cannot allocate " + std::to_string(b.byte_length) + " bytes");
      }
    }
    if (s.ok()) {
      s = storage::ReadRangeInto(**file, {b.byte_offset, b.byte_length, b.xxh3}, verify_,
                                 dst.data(), &stats_->bytes_read);
    }
    if (!Noted(b.file, s).ok()) {
      return s.Annotate("checkpoint " + ckpt_ + ": bytes entry '" + b.fqn + "': ");
    }
  }
  return OkStatus();
}

bool ReadsAreCached(storage::FileSystem& fs, const std::string& ckpt, const metadata::Metadata& md,
                    const planner::LocalLoadPlan& plan,
                    const std::vector<std::vector<bool>>* readable, int me) {
  // Each stored chunk once, by file (reads are sorted by file and offset).
  std::map<uint32_t, std::vector<storage::ByteRange>> by_file;
  std::set<std::pair<uint32_t, uint32_t>> seen;
  uint64_t total = 0;
  for (const planner::ReadItem& r : plan.reads) {
    if (!seen.insert({r.tensor, r.stored}).second) continue;
    const metadata::StoredChunk& sc = md.tensors[r.tensor].chunks[r.stored];
    by_file[sc.file].push_back({sc.byte_offset, sc.byte_length});
    total += sc.byte_length;
  }
  // Stops at the first file that settles it: a cold load pays for about one file's check.
  double uncached = 0;
  const double allowed = 0.05 * static_cast<double>(total);
  for (const auto& [f, ranges] : by_file) {
    if (readable && !(static_cast<size_t>(me) < readable->size() && f < (*readable)[me].size() &&
                      (*readable)[me][f])) {
      return false;
    }
    const std::optional<double> part = fs.CachedFraction(DataFilePath(ckpt, md.files[f]), ranges);
    if (!part) return false;
    uint64_t bytes = 0;
    for (const auto& r : ranges) bytes += r.length;
    uncached += (1 - *part) * static_cast<double>(bytes);
    if (uncached > allowed) return false;
  }
  return true;
}

}  // namespace dcp::checkpoint
