// The memory tier's decisions, as pure functions of what every rank gathered: which hosts partner
// which, what moves where after a save, which step a restore takes and where each of its files
// comes from. Every rank computes the same answers from the same inputs; nothing here touches
// storage or the communicator.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcp/status.h"
#include "storage/file_system.h"

namespace dcp::tier {

// The hosts of a job, in name order, each with its ranks (ascending).
struct Hosts {
  std::vector<std::string> names;
  std::vector<std::vector<int>> ranks;
  std::vector<int> host_of_rank;

  static Hosts From(const std::vector<std::string>& name_of_rank);
  int size() const { return static_cast<int>(names.size()); }
  // The index of `name`, or -1.
  int Find(std::string_view name) const;
};

// The partner hosts of host `h`: the next `replicas` hosts in name order, wrapping, never `h`
// itself; fewer when the job has fewer other hosts.
std::vector<int> PartnersOf(const Hosts& hosts, int h, int replicas);

struct FileRef {
  std::string name;
  uint64_t size = 0;
  bool operator==(const FileRef&) const = default;
};

// Bytes [offset, offset + length) of a file (joined by storage::MergeRanges).
using Span = storage::ByteRange;

// A file moving to rank `to`: from rank `from`'s host directory, or from durable storage
// (from == kFromStorage, copied by `to` itself). With `spans`, only those bytes move: the
// receiver holds a sparse copy of `size` bytes for one load, not a copy of the file.
inline constexpr int kFromStorage = -1;
struct Transfer {
  int from = kFromStorage;
  int to = 0;
  std::string file;
  uint64_t size = 0;
  std::vector<Span> spans;  // empty: the whole file

  uint64_t bytes() const;  // that move
};

// After a save into the tier: every file written by rank r (files_of_rank[r]) goes to one rank
// of each partner host of r's host, the partner's ranks taking turns (r's position on its host,
// modulo the partner's rank count). Sorted by (from, to, file).
std::vector<Transfer> PlanReplication(const Hosts& hosts, int replicas,
                                      const std::vector<std::vector<FileRef>>& files_of_rank);

// What one host's tier holds of one step.
struct StepCopy {
  int64_t step = 0;
  // A digest of the step's metadata as this host holds it; 0 when it has none that decodes.
  uint64_t metadata_digest = 0;
  std::vector<FileRef> required;  // the data files its metadata names (empty without one)
  std::vector<FileRef> present;   // the data files in the directory, with their sizes
};
using Inventory = std::vector<StepCopy>;  // one host's, any order

std::string EncodeInventory(const Inventory& inv);
Result<Inventory> DecodeInventory(std::string_view data);

// A copy found damaged (by its checksums, or while being sent): never used again.
struct BadCopy {
  int host = 0;
  int64_t step = 0;
  std::string file;
  auto operator<=>(const BadCopy&) const = default;
};

// The step a restore takes from the tiers, and who holds each of its files.
struct MemoryStep {
  int64_t step = -1;
  uint64_t metadata_digest = 0;
  std::vector<int> metadata_hosts;        // hosts holding that metadata, ascending
  std::vector<FileRef> files;             // the data files it names
  std::vector<std::vector<int>> holders;  // per file: hosts with an intact-looking copy
  // Files no tier holds, taken from durable storage (only when `step` is there, complete).
  std::vector<bool> from_storage;
  uint64_t bytes_from_storage = 0;
};

// The newest step below `below` that the surviving tiers can restore: its metadata (the digest
// `preferred` names for the step -- the durable copy's, when hosts disagree --, else the one
// most hosts agree on; ties to the first host in name order; the next when one's files are
// not all held) and every data file it names on some host with the recorded size, not among
// `bad`. A step in `durable` (complete in durable storage) may lack files in the tiers: they
// come from storage. nullopt when no step qualifies.
std::optional<MemoryStep> ChooseMemoryStep(const std::vector<Inventory>& by_host,
                                           const std::set<BadCopy>& bad,
                                           const std::set<int64_t>& durable,
                                           int64_t below = INT64_MAX,
                                           const std::map<int64_t, uint64_t>& preferred = {});
// The steps whose hosts hold more than one metadata copy (another save under the same number).
std::vector<int64_t> DisputedSteps(const std::vector<Inventory>& by_host);

// Every step the tiers could restore (ChooseMemoryStep's test, no bad copies), ascending.
std::vector<int64_t> RestorableSteps(const std::vector<Inventory>& by_host,
                                     const std::set<int64_t>& durable);

// What a restore of `step` moves before its load: for every host, each file its ranks read
// from (needed_by_host[h]: index into step.files -> the spans they read, whole stored chunks)
// is read where it lies when the host holds it, else sent by a holder -- the one with
// the fewest bytes assigned so far, ties to the first after the receiving host in name order
// -- or copied from storage. Only the spans move when they are less than `whole_fraction` of
// the file; else the whole file (the host then holds one more copy). Sender and receiver
// ranks take turns on their hosts.
struct RestorePlan {
  std::vector<Transfer> fetches;  // sorted by (from, to, file)
};
using NeededSpans = std::map<uint32_t, std::vector<Span>>;
RestorePlan PlanRestore(const Hosts& hosts, const MemoryStep& step,
                        const std::vector<NeededSpans>& needed_by_host,
                        double whole_fraction = 0.75);

}  // namespace dcp::tier
