#include "checkpoint/write_results.h"

#include <map>
#include <unordered_map>

#include "checkpoint/names.h"
#include "core/checksum.h"
#include "core/wire.h"

namespace dcp::checkpoint {

// A rank's write result: its file sizes and, per written item in plan order, the byte
// offset and checksum.
std::string EncodeWritten(const Written& written) {
  std::string out;
  wire::Writer w(out);
  for (const auto* f : {&written.tensors, &written.bytes}) {
    w.Varint(f->size);
    w.Varint(f->ranges.size());
    for (const auto& r : f->ranges) {
      w.Varint(r.byte_offset);
      w.Varint(r.byte_length);
      w.Fixed64(r.xxh3);
      w.Varint(r.block_xxh3.size());
      for (uint64_t h : r.block_xxh3) w.Fixed64(h);
    }
  }
  w.Varint(written.reused.size());
  for (const Reused& r : written.reused) {
    w.Varint(r.index);
    w.String(r.file.name);
    w.String(r.file.base);
    w.Varint(r.file.size);
    w.Varint(r.byte_offset);
    w.Varint(r.byte_length);
    w.Fixed64(r.xxh3);
    w.Varint(r.block_xxh3.size());
    for (uint64_t h : r.block_xxh3) w.Fixed64(h);
  }
  return out;
}

Result<Written> DecodeWritten(std::string_view in) {
  wire::Reader r(in);
  Written out;
  for (auto* f : {&out.tensors, &out.bytes}) {
    f->size = r.Varint();
    f->ranges.resize(r.Count(10));
    for (auto& x : f->ranges) {
      x.byte_offset = r.Varint();
      x.byte_length = r.Varint();
      x.xxh3 = r.Fixed64();
      x.block_xxh3.resize(r.Count(8));
      for (uint64_t& h : x.block_xxh3) h = r.Fixed64();
    }
  }
  out.reused.resize(r.Count(16));
  for (Reused& x : out.reused) {
    x.index = static_cast<uint32_t>(r.Varint());
    x.file.name = std::string(r.String());
    x.file.base = std::string(r.String());
    x.file.size = r.Varint();
    x.byte_offset = r.Varint();
    x.byte_length = r.Varint();
    x.xxh3 = r.Fixed64();
    x.block_xxh3.resize(r.Count(8));
    for (uint64_t& h : x.block_xxh3) h = r.Fixed64();
  }
  if (!r.ok() || !r.AtEnd()) return DataLoss("corrupt write result received");
  return out;
}

// `written[r]` is what rank r wrote (empty for ranks that wrote nothing).
Result<metadata::Metadata> BuildMetadata(const planner::GlobalSavePlan& plan, uint64_t save_id,
                                         const std::vector<Written>& written, int world) {
  metadata::Metadata md;
  md.save_id = save_id;
  md.world_size = static_cast<uint32_t>(world);
  md.block_size = metadata::kChecksumBlockSize;
  const int n = static_cast<int>(written.size());
  std::vector<int> tensor_file(n, -1), bytes_file(n, -1);
  for (int r = 0; r < n; ++r) {
    const Written& w = written[r];
    if (!w.tensors.ranges.empty()) {
      tensor_file[r] = static_cast<int>(md.files.size());
      md.files.push_back({DataFileName(save_id, r), w.tensors.size, {}});
    }
    if (!w.bytes.ranges.empty()) {
      bytes_file[r] = static_cast<int>(md.files.size());
      md.files.push_back({BytesFileName(save_id, r), w.bytes.size, {}});
    }
  }
  // Files of bases, numbered in the order first referenced (ranks in order): one entry each.
  std::map<std::pair<std::string, std::string>, uint32_t> referenced;  // (base, name)
  auto file_of = [&](const Reused& r) -> Result<uint32_t> {
    auto [it, added] =
        referenced.try_emplace({r.file.base, r.file.name}, static_cast<uint32_t>(md.files.size()));
    if (added) {
      md.files.push_back(r.file);
    } else if (md.files[it->second].size != r.file.size) {
      return Internal("ranks disagree on the size of the base's file " + r.file.name);
    }
    return it->second;
  };
  std::vector<size_t> next_tensor(n, 0), next_bytes(n, 0), next_reused(n, 0), planned(n, 0);
  for (const auto& t : plan.tensors) {
    metadata::TensorMeta tm{t.fqn, t.dtype, t.global_shape, {}, t.path};
    for (const auto& c : t.chunks) {
      const int w = c.writer;
      const std::string who = "rank " + std::to_string(w);
      const std::vector<Reused>& reused = written[w].reused;
      if (next_reused[w] < reused.size() && reused[next_reused[w]].index == planned[w]) {
        const Reused& r = reused[next_reused[w]++];
        ++planned[w];
        if (r.byte_length != c.nbytes || r.block_xxh3.size() != md.NumBlocks(r.byte_length)) {
          return Internal(who + " reported a reference of the wrong size for '" + t.fqn +
                          "' chunk " + c.box.ToString());
        }
        DCP_ASSIGN_OR_RETURN(uint32_t file, file_of(r));
        tm.chunks.push_back({c.box, file, r.byte_offset, r.byte_length, r.xxh3, r.block_xxh3});
        continue;
      }
      ++planned[w];
      const auto& ranges = written[w].tensors.ranges;
      if (next_tensor[w] >= ranges.size()) {
        return Internal(who + " reported too few written chunks");
      }
      const auto& wr = ranges[next_tensor[w]++];
      if (wr.block_xxh3.size() != md.NumBlocks(wr.byte_length)) {
        return Internal(who + " reported " + std::to_string(wr.block_xxh3.size()) +
                        " block checksums for '" + t.fqn + "' chunk " + c.box.ToString());
      }
      tm.chunks.push_back({c.box, static_cast<uint32_t>(tensor_file[w]), wr.byte_offset,
                           wr.byte_length, wr.xxh3, wr.block_xxh3});
    }
    md.tensors.push_back(std::move(tm));
  }
  for (int r = 0; r < n; ++r) {
    if (next_reused[r] != written[r].reused.size()) {
      return Internal("rank " + std::to_string(r) +
                      " reported references to chunks it did not plan");
    }
  }
  for (const auto& b : plan.bytes) {
    const auto& ranges = written[b.writer].bytes.ranges;
    if (next_bytes[b.writer] >= ranges.size()) {
      return Internal("rank " + std::to_string(b.writer) + " reported too few bytes entries");
    }
    const auto& wr = ranges[next_bytes[b.writer]++];
    md.bytes.push_back({b.fqn, static_cast<uint32_t>(bytes_file[b.writer]), wr.byte_offset,
                        wr.byte_length, wr.xxh3, b.path});
  }
  return md;
}

namespace {

// Calls add(writer, PlannedChunk) for every chunk of `plan` in plan order, of writer `only`
// (or of every writer when `only` < 0): one pass, however many ranks.
template <typename F>
void ForEachPlannedChunk(const planner::GlobalSavePlan& plan, int only, F&& add) {
  std::unordered_map<int, int> count, next;  // per tensor: chunks per writer, keys given
  for (uint32_t t = 0; t < plan.tensors.size(); ++t) {
    const auto& chunks = plan.tensors[t].chunks;
    count.clear();
    next.clear();
    for (const auto& c : chunks) {
      if (only < 0 || c.writer == only) ++count[c.writer];
    }
    const std::string& fqn = plan.tensors[t].fqn;
    for (uint32_t c = 0; c < chunks.size(); ++c) {
      const int w = chunks[c].writer;
      if (only >= 0 && w != only) continue;
      add(w, PlannedChunk{t, c, ChunkKey(fqn, count[w] > 1, count[w] > 1 ? next[w]++ : 0)});
    }
  }
}

}  // namespace

std::vector<PlannedChunk> PlannedChunksOf(const planner::GlobalSavePlan& plan, int rank) {
  std::vector<PlannedChunk> out;
  ForEachPlannedChunk(plan, rank, [&](int, PlannedChunk p) { out.push_back(std::move(p)); });
  return out;
}

std::vector<Written> LayOutWrites(const planner::GlobalSavePlan& plan, int world,
                                  uint64_t block_size) {
  std::vector<Written> out(world);
  uint64_t fake = 0x9e3779b97f4a7c15ULL;
  auto checksum = [&] { return fake = fake * 6364136223846793005ULL + 1442695040888963407ULL; };
  std::vector<std::vector<PlannedChunk>> planned(world);
  ForEachPlannedChunk(plan, -1, [&](int w, PlannedChunk p) { planned[w].push_back(std::move(p)); });
  for (int r = 0; r < world; ++r) {
    if (planned[r].empty()) continue;
    std::vector<storage::ChunkToLayOut> chunks;
    for (const PlannedChunk& p : planned[r]) {
      const auto& t = plan.tensors[p.tensor];
      chunks.push_back({p.key, t.dtype, &t.chunks[p.chunk].box.lengths, t.chunks[p.chunk].nbytes});
    }
    const storage::DataFileLayout layout = storage::LayOutDataFile(chunks);
    storage::WrittenFile& f = out[r].tensors;
    f.size = layout.header.size();
    f.ranges.resize(chunks.size());
    for (size_t i : layout.order) {
      storage::WrittenRange& range = f.ranges[i];
      range = {f.size, chunks[i].bytes, checksum(), {}};
      range.block_xxh3.resize(NumBlocks(block_size, chunks[i].bytes));
      for (uint64_t& h : range.block_xxh3) h = checksum();
      if (!range.block_xxh3.empty())
        range.xxh3 = BlockDigest(range.block_xxh3);  // as decoders check
      f.size += chunks[i].bytes;
    }
  }
  for (const auto& b : plan.bytes) {
    storage::WrittenFile& f = out[b.writer].bytes;
    f.ranges.push_back({f.size, b.nbytes, checksum(), {}});
    f.size += b.nbytes;
  }
  return out;
}

}  // namespace dcp::checkpoint
