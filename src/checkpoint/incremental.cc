#include "checkpoint/incremental.h"

#include <algorithm>
#include <thread>

#include "checkpoint/metadata_io.h"
#include "core/checksum.h"
#include "metadata/codec.h"

namespace dcp::checkpoint {

Status CheckIncrementalBase(const std::string& dir_in, const std::string& base_in) {
  const std::string dir = storage::NormalPath(dir_in), base = storage::NormalPath(base_in);
  const std::string name = storage::LastComponent(base), parent = storage::ParentPath(base);
  auto refuse = [&](const std::string& why) {
    return InvalidArgument("incremental base " + base_in + " for " + dir_in + ": " + why);
  };
  if (name.empty() || !metadata::ValidBaseName(name)) return refuse("not a directory's name");
  // (Normal local paths are absolute: only a bucket has no parent.)
  if (parent != storage::ParentPath(dir) || parent.empty()) {
    return refuse(
        "the base must be a sibling of the checkpoint (the same parent directory), since "
        "references name it by its directory name");
  }
  if (name == storage::LastComponent(dir)) {
    return refuse(
        "a checkpoint cannot be its own base (its previous files are removed once it "
        "commits)");
  }
  return OkStatus();
}

namespace {
Status NoChecksums(const std::string& base) {
  return InvalidArgument("incremental base " + base +
                         " has no checksums (a HuggingFace source): a save cannot tell which of "
                         "its bytes are unchanged");
}
}  // namespace

bool SameBytes(const metadata::StoredChunk& chunk, uint64_t block_size,
               std::span<const std::byte> data) {
  if (chunk.byte_length != data.size()) return false;
  if (chunk.block_xxh3.empty()) return Xxh3(data) == chunk.xxh3;
  for (size_t b = 0; b < chunk.block_xxh3.size(); ++b) {
    const uint64_t at = b * block_size;
    if (Xxh3(data.subspan(at, std::min<uint64_t>(block_size, data.size() - at))) !=
        chunk.block_xxh3[b]) {
      return false;
    }
  }
  return true;
}

std::vector<std::optional<Reused>> BaseChunks::FindAll(const std::vector<Chunk>& chunks,
                                                       int threads) const {
  std::vector<std::optional<Reused>> out(chunks.size());
  std::vector<uint64_t> start(chunks.size() + 1, 0);
  for (size_t i = 0; i < chunks.size(); ++i) start[i + 1] = start[i] + chunks[i].data.size();
  const uint64_t total = start.back();
  // Waking a thread pays for itself past a few MiB of hashing each.
  const int n = static_cast<int>(
      std::clamp<uint64_t>(total / (uint64_t{16} << 20), 1, static_cast<uint64_t>(threads)));
  auto run = [&](int k) {
    const uint64_t lo = total * k / n, hi = total * (k + 1) / n;
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (start[i] < lo || start[i] >= hi) continue;
      out[i] = Find(*chunks[i].fqn, chunks[i].dtype, *chunks[i].box, chunks[i].data);
    }
  };
  std::vector<std::thread> workers;
  for (int k = 1; k < n; ++k) workers.emplace_back(run, k);
  run(0);
  for (std::thread& t : workers) t.join();
  return out;
}

Result<std::string> ReadIncrementalBase(storage::FileSystem& fs, const std::string& base) {
  auto found = FindMetadata(fs, base);
  if (!found.ok()) return found.status().Annotate("incremental base: ");
  if (found->built && !found->built->has_checksums) return NoChecksums(base);
  // The committed file's bytes as they are; metadata built from rank files, encoded.
  return found->built ? metadata::Encode(*found->built) : std::move(found->encoded);
}

Result<BaseChunks> BaseChunks::Decode(std::string_view encoded, const std::string& dir,
                                      const std::string& base) {
  auto md = DecodeMetadata(encoded, base);
  if (!md.ok()) return md.status().Annotate("incremental base: ");
  if (!md->has_checksums) return NoChecksums(base);
  BaseChunks b;
  b.md_ = std::move(md).value();
  b.base_name_ = storage::LastComponent(storage::NormalPath(base));
  b.dir_name_ = storage::LastComponent(storage::NormalPath(dir));
  return b;
}

const metadata::StoredChunk* BaseChunks::Locate(const std::string& fqn, DType dtype,
                                                const Box& box) const {
  const metadata::TensorMeta* t = md_.FindTensor(fqn);
  if (!t || t->dtype != dtype) return nullptr;
  auto it =
      std::lower_bound(t->chunks.begin(), t->chunks.end(), box,
                       [](const metadata::StoredChunk& c, const Box& b) { return c.box < b; });
  if (it == t->chunks.end() || !(it->box == box)) return nullptr;
  // The reference keeps the base's checksums, which must be what this save would record: block
  // checksums of kChecksumBlockSize (a base of format 1 or 2 has one checksum per chunk, which
  // serves only for chunks of one block).
  if (it->block_xxh3.size() != NumBlocks(metadata::kChecksumBlockSize, it->byte_length) ||
      (!it->block_xxh3.empty() && md_.block_size != metadata::kChecksumBlockSize)) {
    return nullptr;
  }
  return &*it;
}

Reused BaseChunks::ReferenceTo(const metadata::StoredChunk& c) const {
  Reused r;
  r.file = md_.files[c.file];
  // Where the bytes are, relative to the common parent: the base's own files are in the base;
  // a file the base referenced stays where it is (in this saving directory itself, when the
  // base referenced files of an earlier save here).
  if (r.file.base.empty()) r.file.base = base_name_;
  if (r.file.base == dir_name_) r.file.base.clear();
  r.byte_offset = c.byte_offset;
  r.byte_length = c.byte_length;
  r.xxh3 = c.xxh3;
  r.block_xxh3 = c.block_xxh3;
  return r;
}

std::optional<Reused> BaseChunks::Find(const std::string& fqn, DType dtype, const Box& box,
                                       std::span<const std::byte> data) const {
  const metadata::StoredChunk* c = Locate(fqn, dtype, box);
  if (!c || !SameBytes(*c, md_.block_size, data)) return std::nullopt;
  return ReferenceTo(*c);
}

std::optional<Reused> BaseChunks::FindRecorded(const std::string& fqn, DType dtype,
                                               const metadata::StoredChunk& recorded,
                                               uint64_t block_size) const {
  const metadata::StoredChunk* c = Locate(fqn, dtype, recorded.box);
  // Checksums of the same bytes over the same blocks are equal: the recorded ones compare as
  // the data would (a chunk of several blocks: the block checksums and their digest).
  if (!c || c->byte_length != recorded.byte_length || c->xxh3 != recorded.xxh3 ||
      c->block_xxh3 != recorded.block_xxh3 ||
      (!recorded.block_xxh3.empty() && block_size != md_.block_size)) {
    return std::nullopt;
  }
  return ReferenceTo(*c);
}

}  // namespace dcp::checkpoint
