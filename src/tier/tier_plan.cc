#include "tier/tier_plan.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/wire.h"

namespace dcp::tier {
namespace {

bool TransferOrder(const Transfer& a, const Transfer& b) {
  return std::tie(a.from, a.to, a.file) < std::tie(b.from, b.to, b.file);
}

// Position of `rank` among its host's ranks.
int LocalIndex(const Hosts& hosts, int rank) {
  const auto& mine = hosts.ranks[hosts.host_of_rank[rank]];
  return static_cast<int>(std::lower_bound(mine.begin(), mine.end(), rank) - mine.begin());
}

const StepCopy* FindStep(const Inventory& inv, int64_t step) {
  for (const StepCopy& c : inv) {
    if (c.step == step) return &c;
  }
  return nullptr;
}

}  // namespace

uint64_t Transfer::bytes() const {
  if (spans.empty()) return size;
  uint64_t n = 0;
  for (const Span& s : spans) n += s.length;
  return n;
}

Hosts Hosts::From(const std::vector<std::string>& name_of_rank) {
  Hosts h;
  h.names = name_of_rank;
  std::sort(h.names.begin(), h.names.end());
  h.names.erase(std::unique(h.names.begin(), h.names.end()), h.names.end());
  h.ranks.resize(h.names.size());
  h.host_of_rank.resize(name_of_rank.size());
  for (size_t r = 0; r < name_of_rank.size(); ++r) {
    const int i = h.Find(name_of_rank[r]);
    h.host_of_rank[r] = i;
    h.ranks[i].push_back(static_cast<int>(r));
  }
  return h;
}

int Hosts::Find(std::string_view name) const {
  auto it = std::lower_bound(names.begin(), names.end(), name);
  return it != names.end() && *it == name ? static_cast<int>(it - names.begin()) : -1;
}

std::vector<int> PartnersOf(const Hosts& hosts, int h, int replicas) {
  std::vector<int> out;
  for (int k = 1; k <= replicas && k < hosts.size(); ++k) out.push_back((h + k) % hosts.size());
  return out;
}

std::vector<Transfer> PlanReplication(const Hosts& hosts, int replicas,
                                      const std::vector<std::vector<FileRef>>& files_of_rank) {
  std::vector<Transfer> out;
  for (int r = 0; r < static_cast<int>(files_of_rank.size()); ++r) {
    for (int p : PartnersOf(hosts, hosts.host_of_rank[r], replicas)) {
      const auto& theirs = hosts.ranks[p];
      const int to = theirs[LocalIndex(hosts, r) % theirs.size()];
      for (const FileRef& f : files_of_rank[r]) out.push_back({r, to, f.name, f.size});
    }
  }
  std::sort(out.begin(), out.end(), TransferOrder);
  return out;
}

std::string EncodeInventory(const Inventory& inv) {
  std::string out;
  wire::Writer w(out);
  auto files = [&](const std::vector<FileRef>& fs) {
    w.Varint(fs.size());
    for (const FileRef& f : fs) {
      w.String(f.name);
      w.Varint(f.size);
    }
  };
  w.Varint(inv.size());
  for (const StepCopy& c : inv) {
    w.Varint(static_cast<uint64_t>(c.step));
    w.Fixed64(c.metadata_digest);
    files(c.required);
    files(c.present);
  }
  return out;
}

Result<Inventory> DecodeInventory(std::string_view data) {
  wire::Reader r(data);
  auto files = [&](std::vector<FileRef>* fs) {
    const uint64_t n = r.Varint();
    for (uint64_t i = 0; i < n && r.ok(); ++i) {
      FileRef f;
      f.name = std::string(r.String());
      f.size = r.Varint();
      fs->push_back(std::move(f));
    }
  };
  Inventory inv;
  const uint64_t n = r.Varint();
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    StepCopy c;
    c.step = static_cast<int64_t>(r.Varint());
    c.metadata_digest = r.Fixed64();
    files(&c.required);
    files(&c.present);
    inv.push_back(std::move(c));
  }
  if (!r.ok() || !r.AtEnd()) return DataLoss("corrupt memory tier inventory received");
  return inv;
}

namespace {

// Step `step` under the metadata `digest` (held by `metadata_hosts`): who holds each of its
// files, or nullopt when a file has no intact copy beside that metadata and is not durable.
std::optional<MemoryStep> CompleteCopy(const std::vector<Inventory>& by_host,
                                       const std::set<BadCopy>& bad,
                                       const std::set<int64_t>& durable, int64_t step,
                                       uint64_t digest, const std::vector<int>& metadata_hosts) {
  const int hosts = static_cast<int>(by_host.size());
  MemoryStep m;
  m.step = step;
  m.metadata_digest = digest;
  m.metadata_hosts = metadata_hosts;
  m.files = FindStep(by_host[metadata_hosts.front()], step)->required;
  m.holders.resize(m.files.size());
  m.from_storage.assign(m.files.size(), false);
  for (size_t f = 0; f < m.files.size(); ++f) {
    for (int h = 0; h < hosts; ++h) {
      const StepCopy* c = FindStep(by_host[h], step);
      if (!c || bad.count({h, step, m.files[f].name})) continue;
      // A copy counts only beside the same metadata, or where the host has none (a file
      // replicated before its metadata arrived is still the same save's: names are unique).
      if (c->metadata_digest != 0 && c->metadata_digest != digest) continue;
      if (std::find(c->present.begin(), c->present.end(), m.files[f]) != c->present.end()) {
        m.holders[f].push_back(h);
      }
    }
    if (m.holders[f].empty()) {
      if (!durable.count(step)) return std::nullopt;
      m.from_storage[f] = true;
      m.bytes_from_storage += m.files[f].size;
    }
  }
  return m;
}

}  // namespace

std::optional<MemoryStep> ChooseMemoryStep(const std::vector<Inventory>& by_host,
                                           const std::set<BadCopy>& bad,
                                           const std::set<int64_t>& durable, int64_t below,
                                           const std::map<int64_t, uint64_t>& preferred) {
  std::set<int64_t, std::greater<>> candidates;
  for (const Inventory& inv : by_host) {
    for (const StepCopy& c : inv) {
      if (c.step < below && c.metadata_digest != 0) candidates.insert(c.step);
    }
  }
  const int hosts = static_cast<int>(by_host.size());
  for (int64_t step : candidates) {
    // The metadata most hosts hold (ties: the first host's) -- and, when its files are not
    // all held, the next one: a copy of another save under the same step (a stale one) must
    // not hide a complete one.
    std::map<uint64_t, std::vector<int>> by_digest;
    for (int h = 0; h < hosts; ++h) {
      const StepCopy* c = FindStep(by_host[h], step);
      if (c && c->metadata_digest != 0) by_digest[c->metadata_digest].push_back(h);
    }
    std::vector<std::pair<uint64_t, const std::vector<int>*>> order;
    if (auto pick = preferred.find(step); pick != preferred.end()) {
      // The durable copy's digest known: no other save's copy is this step.
      if (auto it = by_digest.find(pick->second); it != by_digest.end()) {
        order.emplace_back(it->first, &it->second);
      }
    } else {
      for (const auto& [d, hs] : by_digest) order.emplace_back(d, &hs);
      std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
        if (a.second->size() != b.second->size()) return a.second->size() > b.second->size();
        return a.second->front() < b.second->front();
      });
    }
    for (const auto& [digest, metadata_hosts] : order) {
      if (auto m = CompleteCopy(by_host, bad, durable, step, digest, *metadata_hosts)) return m;
    }
  }
  return std::nullopt;
}

std::vector<int64_t> DisputedSteps(const std::vector<Inventory>& by_host) {
  std::map<int64_t, std::set<uint64_t>> digests;
  for (const Inventory& inv : by_host) {
    for (const StepCopy& c : inv) {
      if (c.metadata_digest != 0) digests[c.step].insert(c.metadata_digest);
    }
  }
  std::vector<int64_t> out;
  for (const auto& [step, ds] : digests) {
    if (ds.size() > 1) out.push_back(step);
  }
  return out;
}

std::vector<int64_t> RestorableSteps(const std::vector<Inventory>& by_host,
                                     const std::set<int64_t>& durable) {
  std::vector<int64_t> out;
  int64_t below = INT64_MAX;
  while (auto m = ChooseMemoryStep(by_host, {}, durable, below)) {
    out.push_back(m->step);
    below = m->step;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

RestorePlan PlanRestore(const Hosts& hosts, const MemoryStep& step,
                        const std::vector<NeededSpans>& needed_by_host, double whole_fraction) {
  RestorePlan plan;
  std::vector<uint64_t> assigned(hosts.size(), 0);
  std::vector<size_t> send_turn(hosts.size(), 0), receive_turn(hosts.size(), 0);
  for (int h = 0; h < hosts.size(); ++h) {
    for (const auto& [f, needed] : needed_by_host[h]) {
      const auto& holders = step.holders[f];
      if (std::find(holders.begin(), holders.end(), h) != holders.end()) continue;
      const auto& to_ranks = hosts.ranks[h];
      const int to = to_ranks[receive_turn[h]++ % to_ranks.size()];
      Transfer t{kFromStorage, to, step.files[f].name, step.files[f].size,
                 storage::MergeRanges(needed)};
      if (static_cast<double>(t.bytes()) >= whole_fraction * static_cast<double>(t.size)) {
        t.spans.clear();
      }
      if (holders.empty()) {  // from durable storage
        plan.fetches.push_back(std::move(t));
        continue;
      }
      // The least loaded holder; ties to the first after this host in name order, so that
      // hosts needing files from one another spread their requests.
      auto after_me = [&](int c) { return (c - h - 1 + hosts.size()) % hosts.size(); };
      int g = holders.front();
      for (int c : holders) {
        if (assigned[c] < assigned[g] ||
            (assigned[c] == assigned[g] && after_me(c) < after_me(g))) {
          g = c;
        }
      }
      assigned[g] += t.bytes();
      const auto& from_ranks = hosts.ranks[g];
      t.from = from_ranks[send_turn[g]++ % from_ranks.size()];
      plan.fetches.push_back(std::move(t));
    }
  }
  std::sort(plan.fetches.begin(), plan.fetches.end(), TransferOrder);
  return plan;
}

}  // namespace dcp::tier
