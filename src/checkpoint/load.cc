// Load: metadata (read by rank 0, broadcast) -> local plan -> reads grouped by file and
// stored chunk, straight into destination memory.
#include "checkpoint/load.h"

#include <chrono>
#include <list>
#include <memory>

#include "checkpoint/exchange.h"
#include "checkpoint/metadata_io.h"
#include "planner/copy_runs.h"
#include "planner/load_plan.h"
#include "storage/chunk_reader.h"

namespace dcp::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Open data files, least recently used closed first. Opening checks the size recorded in
// the metadata, so a truncated file is reported as such before any read.
class OpenFiles {
 public:
  OpenFiles(storage::FileSystem& fs, const std::string& dir, const metadata::Metadata& md,
            size_t capacity)
      : fs_(fs), dir_(dir), md_(md), capacity_(std::max<size_t>(capacity, 1)) {}

  Result<storage::ReadableFile*> Get(uint32_t file, uint64_t* opened) {
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      if (it->first == file) {
        lru_.splice(lru_.begin(), lru_, it);
        return lru_.front().second.get();
      }
    }
    const metadata::FileInfo& info = md_.files[file];
    const std::string path = storage::JoinPath(dir_, info.name);
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
    ++*opened;
    if (lru_.size() == capacity_) lru_.pop_back();
    lru_.emplace_front(file, std::move(f).value());
    return lru_.front().second.get();
  }

 private:
  storage::FileSystem& fs_;
  const std::string& dir_;
  const metadata::Metadata& md_;
  size_t capacity_;
  std::list<std::pair<uint32_t, std::unique_ptr<storage::ReadableFile>>> lru_;
};

Status ExecuteReads(StateDict& sd, const metadata::Metadata& md,
                    const planner::LocalLoadPlan& plan, const std::string& dir,
                    const LoadOptions& opts, storage::FileSystem& fs, LoadResult* out) {
  OpenFiles files(fs, dir, md, static_cast<size_t>(opts.max_open_files));
  std::vector<std::byte> bounce;
  std::vector<planner::CopyRuns> runs;
  std::vector<storage::ChunkTarget> targets;
  auto& entries = sd.entries();
  // Reads are sorted by stored chunk: each group of reads from one stored chunk is served
  // by reading that chunk once.
  for (size_t i = 0; i < plan.reads.size();) {
    const planner::ReadItem& first = plan.reads[i];
    const metadata::TensorMeta& t = md.tensors[first.tensor];
    const metadata::StoredChunk& sc = t.chunks[first.stored];
    size_t j = i;
    runs.clear();
    targets.clear();
    for (; j < plan.reads.size() && plan.reads[j].tensor == first.tensor &&
           plan.reads[j].stored == first.stored;
         ++j) {
      const planner::ReadItem& r = plan.reads[j];
      const TensorChunk& dst = entries[r.entry].chunks[r.dst_chunk];
      auto cr = planner::CopyRuns::Make(t.dtype, sc.box, dst.box, r.region);
      if (!cr.ok()) return cr.status().Annotate("checkpoint " + dir + ": '" + t.fqn + "': ");
      runs.push_back(std::move(cr).value());
    }
    for (size_t k = i; k < j; ++k) {
      const planner::ReadItem& r = plan.reads[k];
      targets.push_back({&runs[k - i], entries[r.entry].chunks[r.dst_chunk].view.bytes()});
    }
    auto file = files.Get(sc.file, &out->files_opened);
    Status s = file.status();
    if (s.ok()) {
      s = storage::ReadStoredChunk(**file, {sc.byte_offset, sc.byte_length, sc.xxh3},
                                   opts.verify_checksums, targets, bounce, &out->bytes_read);
    }
    if (!s.ok()) {
      return s.Annotate("checkpoint " + dir + ": tensor '" + t.fqn + "' chunk " +
                        sc.box.ToString() + ": ");
    }
    ++out->chunks_read;
    i = j;
  }
  for (const planner::BytesRead& br : plan.bytes) {
    const metadata::BytesMeta& b = md.bytes[br.bytes];
    std::vector<std::byte>& dst = entries[br.entry].bytes;
    dst.resize(b.byte_length);
    auto file = files.Get(b.file, &out->files_opened);
    Status s = file.status();
    if (s.ok()) {
      s = storage::ReadRangeInto(**file, {b.byte_offset, b.byte_length, b.xxh3},
                                 opts.verify_checksums, dst.data(), &out->bytes_read);
    }
    if (!s.ok()) return s.Annotate("checkpoint " + dir + ": bytes entry '" + b.fqn + "': ");
  }
  return OkStatus();
}

}  // namespace

Result<LoadResult> Load(StateDict& sd, const std::string& dir, const LoadOptions& opts,
                        storage::FileSystem& fs) {
  std::shared_ptr<Comm> comm = opts.comm ? opts.comm : LocalComm();
  LoadResult result;
  const auto t0 = Clock::now();

  // 1. Metadata: read once by rank 0 and broadcast, so thousands of ranks do not all
  //    read the same file from shared storage.
  std::string raw;
  Status st;
  if (comm->rank() == 0) {
    auto data = ReadMetadataBytes(fs, dir);
    st = data.status();
    if (data.ok()) raw = std::move(data).value();
  }
  DCP_RETURN_IF_ERROR(BroadcastStatus(*comm, 0, st));
  DCP_RETURN_IF_ERROR(comm->Broadcast(raw, 0));
  auto md = DecodeMetadata(raw, dir);
  const auto t1 = Clock::now();

  // 2. Plan, with failures agreed on by every rank.
  Result<planner::LocalLoadPlan> plan = md.ok() ? planner::PlanLoad(sd, *md, opts.allow_partial, dir)
                                                : Result<planner::LocalLoadPlan>(md.status());
  DCP_RETURN_IF_ERROR(AgreeOnStatus(*comm, plan.status()));
  const auto t2 = Clock::now();

  // 3. Read.
  st = ExecuteReads(sd, *md, *plan, dir, opts, fs, &result);
  DCP_RETURN_IF_ERROR(AgreeOnStatus(*comm, st));
  const auto t3 = Clock::now();

  result.entries_loaded = sd.size() - plan->skipped.size();
  result.entries_skipped = plan->skipped.size();
  result.metadata_seconds = Seconds(t0, t1);
  result.plan_seconds = Seconds(t1, t2);
  result.read_seconds = Seconds(t2, t3);
  result.total_seconds = Seconds(t0, t3);
  return result;
}

}  // namespace dcp::checkpoint
