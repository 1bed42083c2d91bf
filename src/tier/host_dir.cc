#include "tier/host_dir.h"

#include <xxhash.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <set>
#include <unordered_map>

#include "checkpoint/metadata_io.h"
#include "checkpoint/names.h"
#include "checkpoint/verify.h"
#include "metadata/codec.h"
#include "tier/file_transfer.h"

namespace dcp::tier {

using storage::JoinPath;

storage::FileSystem& Local() { return storage::PosixFileSystem(); }

std::string PathSafe(std::string s) {
  for (char& c : s) {
    if (c == '/' || c == '\0' || static_cast<unsigned char>(c) < 0x20) c = '_';
  }
  if (s.empty() || s == "." || s == "..") s = "_" + s;
  return s;
}

uint64_t Digest(std::string_view raw) { return XXH3_64bits(raw.data(), raw.size()) | 1; }

std::vector<std::pair<int64_t, std::string>> StepDirs(const std::string& host_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  auto names = Local().List(host_dir);
  if (!names.ok()) return out;
  for (const auto& n : *names) {
    if (auto step = checkpoint::ParseStepDirName(n)) out.push_back({*step, JoinPath(host_dir, n)});
  }
  std::sort(out.begin(), out.end(), std::greater<>());
  return out;
}

uint64_t DirBytes(const std::string& dir) {
  uint64_t total = 0;
  auto names = Local().List(dir);
  if (!names.ok()) return 0;
  for (const auto& n : *names) {
    if (auto size = Local().FileSize(JoinPath(dir, n)); size.ok()) total += *size;
  }
  return total;
}

void RemoveTree(const std::string& dir) {
  if (auto names = Local().List(dir); names.ok()) {
    for (const auto& n : *names) (void)Local().Remove(JoinPath(dir, n));
  }
  (void)Local().Remove(dir);
}

namespace {

bool IsPartName(std::string_view n) { return n.ends_with(".part"); }

// What a host directory holds of one step; with `tidy`, pieces of interrupted transfers are
// removed.
StepCopy ScanStep(int64_t step, const std::string& dir, bool tidy) {
  StepCopy c;
  c.step = step;
  if (Local().FileSize(JoinPath(dir, std::string(kPassedOverName))).ok()) return c;  // no copy
  if (auto names = Local().List(dir); names.ok()) {
    const std::set<std::string> all(names->begin(), names->end());
    for (const auto& n : *names) {
      // A sparse copy (a restore's, for one load) is no copy: without a tidy it is skipped,
      // with one it goes, its marker last.
      const bool sparse = all.count(SparseMarkerName(n)) > 0;
      if (IsPartName(n) || (sparse && tidy)) {
        if (tidy) (void)Local().Remove(JoinPath(dir, n));
      } else if (checkpoint::IsDcpDataFileName(n) && !sparse) {
        if (auto size = Local().FileSize(JoinPath(dir, n)); size.ok()) {
          c.present.push_back({n, *size});
        }
      }
    }
    if (tidy) {
      for (const auto& n : *names) {
        if (n.ends_with(".sparse")) (void)Local().Remove(JoinPath(dir, n));
      }
    }
  }
  auto raw = storage::ReadWholeFile(Local(), JoinPath(dir, std::string(checkpoint::kMetadataName)));
  if (!raw.ok()) return c;
  auto md = metadata::Decode(*raw);
  if (!md.ok()) return c;
  c.metadata_digest = Digest(*raw);
  for (const auto& f : md->files) c.required.push_back({f.name, f.size});
  return c;
}

}  // namespace

Inventory ScanHost(const std::string& host_dir, bool tidy) {
  Inventory inv;
  for (const auto& [step, dir] : StepDirs(host_dir)) inv.push_back(ScanStep(step, dir, tidy));
  return inv;
}

Result<std::pair<metadata::Metadata, std::string>> ReadStepMetadata(const std::string& dir) {
  DCP_ASSIGN_OR_RETURN(
      std::string raw,
      storage::ReadWholeFile(Local(), JoinPath(dir, std::string(checkpoint::kMetadataName))));
  DCP_ASSIGN_OR_RETURN(auto md, checkpoint::DecodeMetadata(raw, dir));
  return std::make_pair(std::move(md), std::move(raw));
}

CheckReceived ReceiveChecks(const metadata::Metadata& md) {
  struct Index {
    std::vector<std::vector<storage::StoredRange>> ranges;  // per file of md
    std::unordered_map<std::string, uint32_t> file;         // by name
  };
  auto index = std::make_shared<Index>();
  index->ranges = checkpoint::StoredRangesByFile(md);
  for (uint32_t f = 0; f < md.files.size(); ++f) index->file[md.files[f].name] = f;
  return [index](const Transfer& t) -> Result<storage::StreamVerifier> {
    const auto it = index->file.find(t.file);
    if (it == index->file.end())
      return DataLoss(t.file + ": not a data file of the step's metadata");
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const Span& s : t.spans) spans.push_back({s.offset, s.length});
    return storage::StreamVerifier(checkpoint::RangesWithin(index->ranges[it->second], spans),
                                   t.file);
  };
}

}  // namespace dcp::tier
