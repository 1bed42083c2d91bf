#include "storage/chunk_reader.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "core/checksum.h"

namespace dcp::storage {
namespace {

// Checksummed data is read in pieces small enough to stay in the L2 cache between the read
// that writes a piece and the hash (and scatter) that read it: hashing a piece after a large
// read finished fetches it from memory again. Measured warm here: 256 KiB pieces read + hash
// at ~1.5x the rate of 64 MiB pieces; the extra preads cost little.
constexpr size_t kVerifiedPiece = size_t{256} << 10;
constexpr size_t kBouncePiece = size_t{1} << 20;
constexpr size_t kDirectPiece = size_t{64} << 20;  // unverified: straight into destination

// Copies the part of `target`'s runs that falls in chunk bytes [lo, lo + piece.size()).
void Scatter(const ChunkTarget& target, uint64_t lo, std::span<const std::byte> piece) {
  const CopyRuns& runs = *target.runs;
  const uint64_t hi = lo + piece.size();
  for (uint64_t i = runs.FirstRunEndingAfter(lo); i < runs.num_runs(); ++i) {
    uint64_t s = runs.src_offset(i);
    if (s >= hi) break;
    uint64_t a = std::max(s, lo), b = std::min(s + runs.run_bytes(), hi);
    std::memcpy(target.dst + runs.dst_offset(i) + (a - s), piece.data() + (a - lo), b - a);
  }
}

Status Mismatch(const std::string& path, uint64_t begin, uint64_t end) {
  return DataLoss("checksum mismatch in " + path + " at bytes [" + std::to_string(begin) + ", " +
                  std::to_string(end) + ")");
}

// Verifies bytes [begin, end) of the range as they stream by: against the range's one
// checksum (then [begin, end) must be the whole range), or against its block checksums
// (then begin is on a block boundary).
class Verifier {
 public:
  Verifier(const StoredRange& range, uint64_t begin)
      : range_(range), begin_(begin), hasher_(range.block_xxh3.empty() ? 0 : range.block_size) {}
  void Update(std::span<const std::byte> data) { hasher_.Update(data); }
  Status Check(const std::string& file, uint64_t end) {
    const uint64_t at = range_.byte_offset;
    if (range_.block_xxh3.empty()) {
      std::vector<uint64_t> unused;
      if (hasher_.Finish(&unused) != range_.xxh3) return Mismatch(file, at, at + end);
      return OkStatus();
    }
    const uint64_t bs = range_.block_size;
    const std::vector<uint64_t> got = hasher_.FinishBlocks();
    const uint64_t first = begin_ / bs;
    for (uint64_t k = 0; k < got.size(); ++k) {
      if (first + k >= range_.block_xxh3.size() || got[k] != range_.block_xxh3[first + k]) {
        const uint64_t b = (first + k) * bs;
        return Mismatch(file, at + b, at + std::min(b + bs, range_.byte_length));
      }
    }
    return OkStatus();
  }

 private:
  const StoredRange& range_;
  uint64_t begin_;
  StreamHasher hasher_;
};

// Reads chunk bytes [begin, end) through `bounce`, scattering into the targets, verifying.
Status StreamInterval(ReadableFile& file, const StoredRange& range, bool verify, uint64_t begin,
                      uint64_t end, std::span<const ChunkTarget> targets,
                      std::vector<std::byte>& bounce, uint64_t* bytes_read) {
  std::optional<Verifier> verifier;  // no hasher state when not verifying
  if (verify) verifier.emplace(range, begin);
  // Sized, never shrunk, without zero-filling: every byte is read before it is used.
  const size_t n_bounce = std::min<uint64_t>(verify ? kVerifiedPiece : kBouncePiece, end - begin);
  if (bounce.size() < n_bounce) bounce.resize(n_bounce);
  for (uint64_t pos = begin; pos < end;) {
    const size_t n = std::min<uint64_t>(n_bounce, end - pos);
    std::span<std::byte> piece(bounce.data(), n);
    DCP_RETURN_IF_ERROR(file.ReadAt(range.byte_offset + pos, piece));
    *bytes_read += n;
    if (verifier) verifier->Update(piece);
    for (const ChunkTarget& t : targets) Scatter(t, pos, piece);
    pos += n;
  }
  return verifier ? verifier->Check(file.path(), end) : OkStatus();
}

// The unit a stored chunk is read in: a checksum block, the whole chunk when one checksum covers
// it, kUnverifiedReadPiece when nothing is checked.
uint64_t ReadBlock(const StoredRange& range, bool verify) {
  if (verify && range.block_xxh3.empty()) return std::max<uint64_t>(range.byte_length, 1);
  return range.block_xxh3.empty() ? kUnverifiedReadPiece : range.block_size;
}

}  // namespace

void ScatterFromMemory(const ChunkTarget& target, std::span<const std::byte> chunk) {
  Scatter(target, 0, chunk);
}

Status ReadRangeInto(ReadableFile& file, const StoredRange& range, bool verify, std::byte* dst,
                     uint64_t* bytes_read) {
  std::optional<Verifier> verifier;
  if (verify) verifier.emplace(range, 0);
  const size_t piece = verify ? kVerifiedPiece : kDirectPiece;
  for (uint64_t pos = 0; pos < range.byte_length; pos += piece) {
    size_t n = std::min<uint64_t>(piece, range.byte_length - pos);
    DCP_RETURN_IF_ERROR(file.ReadAt(range.byte_offset + pos, std::span(dst + pos, n)));
    if (verifier) verifier->Update(std::span(dst + pos, n));
    *bytes_read += n;
  }
  return verifier ? verifier->Check(file.path(), range.byte_length) : OkStatus();
}

Status VerifyRange(ReadableFile& file, const StoredRange& range, std::vector<std::byte>& bounce,
                   uint64_t* bytes_read) {
  return StreamInterval(file, range, /*verify=*/true, 0, range.byte_length, {}, bounce, bytes_read);
}

ByteRange BytesReadFor(const StoredRange& range, bool verify, const CopyRuns& runs) {
  if (runs.num_runs() == 0 || runs.run_bytes() == 0) return {};
  const uint64_t first = runs.src_offset(0);
  const uint64_t last = runs.src_offset(runs.num_runs() - 1) + runs.run_bytes();
  if (!verify) return {first, last - first};
  const uint64_t block = ReadBlock(range, verify);
  const uint64_t begin = first / block * block;
  return {begin, std::min(range.byte_length, (last + block - 1) / block * block) - begin};
}

Status ReadStoredChunk(ReadableFile& file, const StoredRange& range, bool verify,
                       std::span<const ChunkTarget> targets, std::vector<std::byte>& bounce,
                       uint64_t* bytes_read) {
  const uint64_t len = range.byte_length;
  // A destination that takes the whole chunk as one run: read straight into it, then the
  // others copy from there.
  for (const ChunkTarget& t : targets) {
    if (t.runs->num_runs() != 1 || t.runs->run_bytes() != len || len == 0) continue;
    std::byte* whole = t.dst + t.runs->dst_offset(0);
    DCP_RETURN_IF_ERROR(ReadRangeInto(file, range, verify, whole, bytes_read));
    for (const ChunkTarget& other : targets) {
      if (&other != &t) ScatterFromMemory(other, std::span<const std::byte>(whole, len));
    }
    return OkStatus();
  }

  // The blocks any target needs, read as maximal runs of consecutive blocks.
  const uint64_t block = ReadBlock(range, verify);
  std::vector<uint8_t> needed((len + block - 1) / block, 0);
  uint64_t lo = len, hi = 0;  // the first and last byte any target needs
  for (const ChunkTarget& t : targets) {
    const CopyRuns& runs = *t.runs;
    if (runs.num_runs() == 0 || runs.run_bytes() == 0) continue;
    lo = std::min(lo, runs.src_offset(0));
    hi = std::max(hi, runs.src_offset(runs.num_runs() - 1) + runs.run_bytes());
    MarkSourceBlocks(runs, block, needed);
  }
  if (lo >= hi) return OkStatus();
  for (uint64_t b = 0; b < needed.size();) {
    if (!needed[b]) {
      ++b;
      continue;
    }
    uint64_t e = b;
    while (e < needed.size() && needed[e]) ++e;
    uint64_t begin = b * block, end = std::min(e * block, len);
    if (!verify) {  // nothing to check: only the bytes some target needs
      begin = std::max(begin, lo);
      end = std::min(end, hi);
    }
    DCP_RETURN_IF_ERROR(
        StreamInterval(file, range, verify, begin, end, targets, bounce, bytes_read));
    b = e;
  }
  return OkStatus();
}

class StreamVerifier::RangeState : public Verifier {
 public:
  using Verifier::Verifier;
};

StreamVerifier::StreamVerifier(std::vector<StoredRange> ranges, std::string path)
    : ranges_(std::move(ranges)), path_(std::move(path)) {
  std::erase_if(ranges_, [](const StoredRange& r) { return r.byte_length == 0; });
}

StreamVerifier::~StreamVerifier() = default;
StreamVerifier::StreamVerifier(StreamVerifier&&) noexcept = default;

Status StreamVerifier::Add(uint64_t offset, std::span<const std::byte> data) {
  if (offset < end_) {
    return Internal(path_ + ": bytes at " + std::to_string(offset) + " came after bytes up to " +
                    std::to_string(end_));
  }
  end_ = offset + data.size();
  while (next_ < ranges_.size()) {
    const StoredRange& r = ranges_[next_];
    if (r.byte_offset >= end_) break;
    const uint64_t a = std::max(r.byte_offset, offset);
    const uint64_t b = std::min(r.byte_offset + r.byte_length, end_);
    if (a != r.byte_offset + seen_) return Missing();
    if (!open_) open_ = std::make_unique<RangeState>(r, 0);
    open_->Update(data.subspan(a - offset, b - a));
    seen_ += b - a;
    if (seen_ < r.byte_length) break;  // continues in the next piece
    Status s = open_->Check(path_, r.byte_length);
    open_.reset();
    seen_ = 0;
    ++next_;
    DCP_RETURN_IF_ERROR(s);
  }
  return OkStatus();
}

Status StreamVerifier::Finish() { return next_ < ranges_.size() ? Missing() : OkStatus(); }

Status StreamVerifier::Missing() const {
  const StoredRange& r = ranges_[next_];
  return DataLoss(path_ + ": bytes [" + std::to_string(r.byte_offset + seen_) + ", " +
                  std::to_string(r.byte_offset + r.byte_length) + ") of a stored range never came");
}

}  // namespace dcp::storage
