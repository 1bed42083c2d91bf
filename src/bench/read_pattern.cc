#include "bench/read_pattern.h"

#include <algorithm>
#include <numeric>

#include "bench/runner.h"
#include "checkpoint/metadata_io.h"
#include "core/wire.h"
#include "planner/load_plan.h"

namespace dcp::bench {

std::vector<std::vector<PatternRun>> AssignPatternReads(
    const std::vector<PatternChunk>& chunks, const std::vector<std::vector<uint32_t>>& needs) {
  const int ranks = static_cast<int>(needs.size());
  std::vector<std::vector<int>> needed_by(chunks.size());
  for (int r = 0; r < ranks; ++r) {
    for (uint32_t c : needs[r]) {
      if (c < chunks.size() && (needed_by[c].empty() || needed_by[c].back() != r)) {
        needed_by[c].push_back(r);  // ranks ascending; a rank's repeats dropped
      }
    }
  }
  std::vector<uint32_t> order(chunks.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const PatternChunk &x = chunks[a], &y = chunks[b];
    return x.file != y.file ? x.file < y.file : x.offset != y.offset ? x.offset < y.offset : a < b;
  });
  std::vector<uint64_t> assigned(ranks, 0);
  std::vector<std::vector<PatternRun>> runs(ranks);
  for (uint32_t c : order) {
    if (needed_by[c].empty()) continue;
    int reader = needed_by[c].front();
    for (int r : needed_by[c]) {
      if (assigned[r] < assigned[reader]) reader = r;
    }
    const PatternChunk& k = chunks[c];
    assigned[reader] += k.length;
    std::vector<PatternRun>& mine = runs[reader];
    if (!mine.empty() && mine.back().file == k.file &&
        mine.back().offset + mine.back().length == k.offset) {
      mine.back().length += k.length;
    } else {
      mine.push_back({k.file, k.offset, k.length});
    }
  }
  return runs;
}

namespace internal {
namespace {

// Reads `runs` (file order) of the files `names`, in pieces of at most kIoBlockBytes; on an
// object store each file's runs are announced first, as a load announces its reads.
Status ReadRuns(storage::FileSystem& fs, const std::vector<std::string>& paths,
                const std::vector<PatternRun>& runs, uint64_t* bytes_read) {
  std::vector<std::byte> block;
  std::unique_ptr<storage::ReadableFile> file;
  for (size_t i = 0; i < runs.size(); ++i) {
    const PatternRun& run = runs[i];
    if (i == 0 || runs[i - 1].file != run.file) {
      DCP_ASSIGN_OR_RETURN(file, fs.OpenReadable(paths.at(run.file)));
      if (fs.IsObjectStore()) {
        std::vector<storage::ByteRange> ranges;
        for (size_t j = i; j < runs.size() && runs[j].file == run.file; ++j) {
          ranges.push_back({runs[j].offset, runs[j].length});
        }
        file->WillRead(ranges);
      }
    }
    DCP_RETURN_IF_ERROR(ReadInPieces(*file, run.offset, run.length, block, bytes_read));
  }
  return OkStatus();
}

}  // namespace

Status Runner::RunReferencePattern(const std::string& kind, const workload::LayoutSpec& layout) {
  // What this rank's load needs (its load plan's stored chunks, numbered over all tensors'
  // chunks in metadata order), then who reads what, the same on every rank.
  std::vector<PatternChunk> chunks;
  std::vector<std::string> paths;
  std::string mine;
  Status st = [&]() -> Status {
    DCP_ASSIGN_OR_RETURN(metadata::Metadata md, checkpoint::ReadMetadata(*fs_, ckpt_));
    for (const FileInfo& f : md.files) paths.push_back(checkpoint::DataFilePath(ckpt_, f));
    std::vector<uint32_t> first(md.tensors.size());
    for (size_t t = 0; t < md.tensors.size(); ++t) {
      first[t] = static_cast<uint32_t>(chunks.size());
      for (const StoredChunk& c : md.tensors[t].chunks) {
        chunks.push_back({c.file, c.byte_offset, c.byte_length});
      }
    }
    DCP_ASSIGN_OR_RETURN(auto dst, workload::MakeEmptyLike(model_, layout, rank_));
    DCP_ASSIGN_OR_RETURN(auto plan, planner::PlanLoad(dst.sd, md, /*allow_partial=*/false, ckpt_));
    std::vector<uint32_t> ids;
    for (const planner::ReadItem& item : plan.reads)
      ids.push_back(first[item.tensor] + item.stored);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    wire::Writer w(mine);
    for (uint32_t id : ids) w.Varint(id);
    return OkStatus();
  }();
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm_, st.Annotate("bench: read pattern: ")));
  DCP_ASSIGN_OR_RETURN(auto all, comm_.AllGather(mine));
  std::vector<std::vector<uint32_t>> needs(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    wire::Reader in(all[r]);
    while (in.ok() && !in.AtEnd()) needs[r].push_back(static_cast<uint32_t>(in.Varint()));
    if (!in.ok())
      return DataLoss("bench: read pattern: corrupt chunk list from rank " + std::to_string(r));
  }
  const std::vector<PatternRun> runs = std::move(AssignPatternReads(chunks, needs)[rank_]);

  DCP_RETURN_IF_ERROR(PrepareCache(ckpt_, o_.cold).status());
  uint64_t bytes = 0;
  DCP_ASSIGN_OR_RETURN(double s, Timed([&] { return ReadRuns(*fs_, paths, runs, &bytes); }));
  auto& patterns = report_.reference.patterns;
  auto it = std::find_if(patterns.begin(), patterns.end(),
                         [&](const ReferenceReport::Pattern& p) { return p.kind == kind; });
  if (it == patterns.end()) it = patterns.insert(patterns.end(), {.kind = kind});
  it->layout = layout.ToString();
  it->seconds.push_back(s);
  DCP_ASSIGN_OR_RETURN(auto sums, SumAtRoot(comm_, {bytes, runs.size()}));
  if (rank_ == 0) {
    it->bytes = sums[0];
    it->runs = sums[1];
  }
  return OkStatus();
}

}  // namespace internal

}  // namespace dcp::bench
