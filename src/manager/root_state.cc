#include "manager/root_state.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "checkpoint/metadata_io.h"
#include "checkpoint/names.h"
#include "checkpoint/save_lock.h"
#include "dcp/manager.h"
#include "manager/manager.h"
#include "storage/lease_lock.h"
#include "tier/memory_tier.h"

namespace dcp::manager {

using storage::FileSystem;
using storage::JoinPath;

namespace {
// The steps among the directories `md`'s files lie in.
void AddStepBases(const metadata::Metadata& md, std::set<int64_t>* bases) {
  for (const auto& f : md.files) {
    if (f.base.empty()) continue;
    if (auto step = checkpoint::ParseStepDirName(f.base)) bases->insert(*step);
  }
}
}  // namespace

Result<std::set<int64_t>> ReadStepBases(FileSystem& fs, const std::string& dir) {
  DCP_ASSIGN_OR_RETURN(metadata::Metadata md, checkpoint::ReadMetadata(fs, dir));
  std::set<int64_t> bases;
  AddStepBases(md, &bases);
  return bases;
}

// Whether `dir` holds a complete checkpoint: committed metadata that decodes, and every data
// file it names present with its recorded size. OK, or why not.
Status CheckComplete(FileSystem& fs, const std::string& dir, std::set<int64_t>* bases) {
  if (auto bad = fs.FileSize(JoinPath(dir, manager::kBadName)); bad.ok()) {
    auto why = *bad <= 4096 ? storage::ReadWholeFile(fs, JoinPath(dir, manager::kBadName))
                            : Result<std::string>(DataLoss("too long to show"));
    std::string reason = why.ok() ? *why : std::string("(unreadable)");
    while (!reason.empty() && reason.back() == '\n') reason.pop_back();
    return DataLoss(dir + ": marked bad by a load: " + reason);
  }
  auto md = checkpoint::ReadMetadata(fs, dir);
  if (!md.ok()) return md.status();
  if (bases) AddStepBases(*md, bases);
  for (const auto& f : md->files) {
    const std::string path = checkpoint::DataFilePath(dir, f);
    auto size = fs.FileSize(path);
    if (!size.ok()) return size.status().Annotate(dir + ": ");
    if (*size != f.size) {
      return DataLoss(dir + ": data file " + path + " has " + std::to_string(*size) +
                      " bytes, the metadata says " + std::to_string(f.size));
    }
  }
  return OkStatus();
}

// True when `dir` holds no committed metadata at all (neither the global file nor a per-rank
// one): a save that never committed, or a step whose removal was cut short. Only such
// directories are cleaned up; one whose metadata is there but names missing or short files
// (damaged after the fact) or cannot be read is ignored but left for a person to look at.
bool HasNoMetadata(FileSystem& fs, const std::string& dir) {
  auto names = fs.List(dir);
  if (!names.ok()) return false;
  for (const auto& n : *names) {
    if (n == checkpoint::kMetadataName || checkpoint::ParseRankMetadataName(n) >= 0) return false;
  }
  return true;
}

std::optional<int64_t> ReadLatestRecord(FileSystem& fs, const std::string& root) {
  // A record is a number: anything larger is not one (and is never read whole).
  auto size = fs.FileSize(JoinPath(root, manager::kLatestName));
  if (!size.ok() || *size > 64) return std::nullopt;
  auto data = storage::ReadWholeFile(fs, JoinPath(root, manager::kLatestName));
  if (!data.ok()) return std::nullopt;
  std::string s = *data;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.empty() || s.size() > 18) return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

Result<Scan> ScanRoot(FileSystem& fs, const std::string& root) {
  DCP_ASSIGN_OR_RETURN(auto names, fs.List(root));
  Scan scan;
  for (const auto& n : names) {
    if (auto step = ParseStepDirName(n)) {
      Scan::Entry e{*step, OkStatus(), {}};
      e.status = CheckComplete(fs, JoinPath(root, n), &e.bases);
      scan.entries.push_back(std::move(e));
    } else if (n.rfind(std::string(manager::kLatestName) + ".tmp", 0) == 0) {
      scan.latest_tmps.push_back(n);
    }
  }
  std::sort(scan.entries.begin(), scan.entries.end(),
            [](const auto& a, const auto& b) { return a.step < b.step; });
  scan.latest_record = ReadLatestRecord(fs, root);
  return scan;
}

// Removes a step directory: metadata first (the step stops being complete in one operation),
// then the data files, then the empty directory. A crash half-way leaves an incomplete
// directory, never a damaged one that looks complete. With `recycle_dir` set, tensor data
// files move there (one per writer rank, replacing an older one) for the next save to
// overwrite instead of being deleted: they leave the step only after it stopped being one.
Status RemoveStepDir(FileSystem& fs, const std::string& dir, const std::string& recycle_dir) {
  // An object store's incomplete uploads under it (a killed save's) go too.
  (void)fs.DropUnfinishedWrites(dir);
  auto names = fs.List(dir);
  if (!names.ok()) {
    if (names.status().code() == StatusCode::kNotFound) return OkStatus();
    return names.status();
  }
  // The probe frameworks look for first (they stop taking the step for one), then the
  // global metadata, then per-rank and tmp metadata, then the rest.
  const std::string meta(checkpoint::kMetadataName), probe(checkpoint::kTorchProbeName);
  auto rank_of = [&](const std::string& n) {
    if (n == probe) return 0;
    if (n == meta) return 1;
    return n.rfind(meta, 0) == 0 ? 2 : 3;
  };
  std::vector<std::string> order(names->begin(), names->end());
  std::stable_sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
    return rank_of(a) < rank_of(b);
  });
  const size_t metadata_files = static_cast<size_t>(std::count_if(
      order.begin(), order.end(), [&](const std::string& n) { return rank_of(n) < 3; }));
  bool pool_ready = false;
  for (size_t i = 0; i < order.size(); ++i) {
    const std::string path = JoinPath(dir, order[i]);
    const int writer = checkpoint::TensorDataFileRank(order[i]);
    if (i >= metadata_files && writer >= 0 && !recycle_dir.empty()) {
      if (!pool_ready) {
        DCP_RETURN_IF_ERROR(fs.CreateDirs(recycle_dir).Annotate("recycle directory: "));
        pool_ready = true;
      }
      DCP_RETURN_IF_ERROR(
          fs.Rename(path, JoinPath(recycle_dir, checkpoint::RecycledFileName(writer)))
              .Annotate("recycle a retired data file: "));
    } else {
      DCP_RETURN_IF_ERROR(fs.Remove(path).Annotate("remove step directory: "));
    }
    // The step stops being complete durably before any of its data goes: a crash can leave
    // an incomplete directory (cleaned up by the next Open), never metadata over missing data.
    if (i + 1 == metadata_files) DCP_RETURN_IF_ERROR(fs.SyncDir(dir));
  }
  return fs.Remove(dir).Annotate("remove step directory: ");
}

// Rank 0 at Open: the recycle directory holds only r<rank>.safetensors of ranks of this job
// (recycling on), or is gone (off). Best effort: a file left over is only disk space.
void TidyRecycleDir(FileSystem& fs, const std::string& recycle_dir, bool on, int world) {
  auto names = fs.List(recycle_dir);
  if (!names.ok()) return;
  std::set<std::string> wanted;
  for (int r = 0; on && r < world; ++r) wanted.insert(checkpoint::RecycledFileName(r));
  for (const auto& n : *names) {
    if (!wanted.count(n)) (void)fs.Remove(JoinPath(recycle_dir, n));
  }
  if (!on) (void)fs.Remove(recycle_dir);
}

// ---- What rank 0 decided, for every rank ------------------------------------------------

std::string EncodeSteps(const std::vector<int64_t>& steps) {
  std::string out;
  for (int64_t s : steps) out += std::to_string(s) + ' ';
  return out;
}

std::vector<int64_t> DecodeSteps(const std::string& d) {
  std::vector<int64_t> out;
  std::istringstream in(d);
  int64_t s;
  while (in >> s) out.push_back(s);
  return out;
}

}  // namespace dcp::manager

namespace dcp {

using manager::Scan;
using manager::ScanRoot;
using storage::FileSystem;
using storage::JoinPath;

StepBases RootInfo::bases() const {
  StepBases out;
  for (const StepInfo& s : steps) {
    if (!s.bases.empty()) out[s.step].insert(s.bases.begin(), s.bases.end());
  }
  return out;
}

std::vector<int64_t> RootInfo::complete_steps() const {
  std::vector<int64_t> out;
  for (const StepInfo& s : steps) {
    if (s.complete) out.push_back(s.step);
  }
  return out;
}

RootInfo inspect_root(const std::string& root) {
  FileSystem& fs = *ValueOrThrow(storage::FileSystemFor(root));
  Scan scan = ValueOrThrow(ScanRoot(fs, root));
  RootInfo info;
  info.latest_record = scan.latest_record;
  for (const auto& e : scan.entries) {
    StepInfo s;
    s.step = e.step;
    s.dir = JoinPath(root, StepDirName(e.step));
    s.complete = e.status.ok();
    if (!s.complete) s.problem = e.status.message();
    if (auto names = fs.List(s.dir); names.ok()) {
      for (const auto& n : *names) {
        if (auto size = fs.FileSize(JoinPath(s.dir, n)); size.ok()) s.bytes += *size;
      }
    }
    if (s.complete) info.latest = s.step;
    s.bases.assign(e.bases.begin(), e.bases.end());
    info.steps.push_back(std::move(s));
  }
  for (const StepInfo& s : info.steps) {
    for (int64_t b : s.bases) {
      for (StepInfo& t : info.steps) {
        if (t.step == b) t.referenced_by.push_back(s.step);
      }
    }
  }
  const std::string pool = JoinPath(root, manager::kRecycleName);
  if (auto names = fs.List(pool); names.ok()) {
    for (const auto& n : *names) {
      if (auto size = fs.FileSize(JoinPath(pool, n)); size.ok()) {
        ++info.recycle_files;
        info.recycle_bytes += *size;
      }
    }
  }
  return info;
}

std::vector<std::string> unlock(const std::string& path) {
  FileSystem& fs = *ValueOrThrow(storage::FileSystemFor(path));
  std::vector<std::string> removed;
  std::vector<std::string> locks = {JoinPath(path, manager::kLockName),
                                    JoinPath(path, std::string(checkpoint::kLockName))};
  // The lock file itself, as lock errors name it.
  const std::string base = path.substr(path.find_last_of('/') + 1);
  if (base == manager::kLockName || base == checkpoint::kLockName) locks = {path};
  for (const std::string& lock : locks) {
    auto who = storage::BreakLock(fs, lock);
    if (!who.ok() && who.status().code() == StatusCode::kNotFound) continue;
    removed.push_back(lock + " (held by " + ValueOrThrow(std::move(who)) + ")");
  }
  if (removed.empty()) ThrowIfError(NotFound(path + " holds no dcp lock"));
  return removed;
}

HostTierInfo inspect_memory_tier(const std::string& root, const std::string& tier_dir) {
  HostTierInfo info;
  info.dir = tier::HostTierDir(tier_dir, root);
  for (const tier::StepCopy& c : ValueOrThrow(tier::ScanHostTier(tier_dir, root))) {
    MemoryStepInfo s;
    s.step = c.step;
    s.has_metadata = c.metadata_digest != 0;
    s.files = c.present.size();
    s.files_named = c.required.size();
    std::set<int> writers;
    for (const auto& f : c.present) {
      s.bytes += f.size;
      if (int w = checkpoint::DataFileRank(f.name); w >= 0) writers.insert(w);
    }
    s.writers.assign(writers.begin(), writers.end());
    info.steps.push_back(std::move(s));
  }
  std::sort(info.steps.begin(), info.steps.end(),
            [](const MemoryStepInfo& a, const MemoryStepInfo& b) { return a.step < b.step; });
  return info;
}

}  // namespace dcp
