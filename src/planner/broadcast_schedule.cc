// The broadcast plan turned into operations: the spans of a chunk a member receives, whole-
// chunk broadcasts batched per (group, reader), and each group's all-gathers in rounds.
#include <algorithm>
#include <map>
#include <tuple>

#include "core/copy_runs.h"
#include "planner/broadcast_plan.h"

namespace dcp::planner {

std::vector<ByteSpan> PartSpans(DType dtype, const Box& chunk, const std::vector<Box>& regions) {
  std::vector<ByteSpan> spans;
  for (const Box& region : regions) {
    auto runs = CopyRuns::Make(dtype, chunk, region, region);
    if (!runs.ok()) continue;  // not within the chunk: the planner made none such
    for (uint64_t i = 0; i < runs->num_runs(); ++i) {
      spans.push_back({runs->src_offset(i), runs->run_bytes()});
    }
  }
  std::sort(spans.begin(), spans.end(),
            [](const ByteSpan& a, const ByteSpan& b) { return a.offset < b.offset; });
  std::vector<ByteSpan> merged;
  for (const ByteSpan& s : spans) {
    if (!merged.empty() && s.offset <= merged.back().offset + merged.back().length) {
      merged.back().length =
          std::max(merged.back().length, s.offset + s.length - merged.back().offset);
    } else {
      merged.push_back(s);
    }
  }
  return merged;
}

std::vector<BroadcastOp> ScheduleBroadcasts(const BroadcastPlan& plan, uint64_t batch_bytes) {
  std::vector<BroadcastOp> ops;
  // (group, reader, sent as parts) -> index of its open batch in `open`; `open` keeps opening
  // order. Chunks sent as parts and chunks broadcast whole are batched apart (a batch goes as
  // parts only when all of its chunks can).
  std::map<std::tuple<uint32_t, int, bool>, size_t> open_of;
  std::vector<BroadcastOp> open;
  std::vector<bool> closed;
  for (uint32_t i = 0; i < plan.chunks.size(); ++i) {
    const SharedChunk& c = plan.chunks[i];
    if (batch_bytes == 0 || c.nbytes >= batch_bytes) {
      ops.push_back({c.group, c.reader, c.nbytes, {i}});
      continue;
    }
    const std::tuple<uint32_t, int, bool> key{c.group, c.reader, !c.parts.empty()};
    auto it = open_of.find(key);
    if (it != open_of.end() && open[it->second].bytes + c.nbytes > batch_bytes) {
      ops.push_back(std::move(open[it->second]));
      closed[it->second] = true;
      open_of.erase(it);
      it = open_of.end();
    }
    if (it == open_of.end()) {
      it = open_of.emplace(key, open.size()).first;
      open.push_back({c.group, c.reader, 0, {}});
      closed.push_back(false);
    }
    open[it->second].items.push_back(i);
    open[it->second].bytes += c.nbytes;
  }
  for (size_t b = 0; b < open.size(); ++b) {
    if (!closed[b]) ops.push_back(std::move(open[b]));
  }
  return ops;
}

std::vector<GatherOp> ScheduleGathers(const BroadcastPlan& plan, const GatherLimits& limits) {
  const uint32_t rounds = std::max<uint32_t>(limits.rounds, 1);
  std::vector<uint64_t> total(plan.groups.size(), 0);
  for (const SharedShard& s : plan.shards) total[s.group] += s.nbytes;
  // Per group: its ops so far (the last one open), and what each member sends in the open one.
  std::vector<std::vector<GatherOp>> of_group(plan.groups.size());
  std::vector<uint64_t> before(plan.groups.size(), 0);  // bytes of the group's earlier shards
  std::vector<std::map<int, uint64_t>> sent(plan.groups.size());
  std::vector<uint32_t> base_round(plan.groups.size(), 0);
  for (uint32_t i = 0; i < plan.shards.size(); ++i) {
    const SharedShard& s = plan.shards[i];
    const uint32_t g = s.group;
    // The round by bytes: the share of the group's bytes before this shard.
    const auto by_bytes = static_cast<uint32_t>(std::min<uint64_t>(
        rounds - 1, total[g] ? static_cast<uint64_t>(static_cast<unsigned __int128>(before[g]) *
                                                     rounds / total[g])
                             : 0));
    before[g] += s.nbytes;
    const bool small = s.nbytes < limits.in_place_bytes;
    std::vector<GatherOp>& ops = of_group[g];
    bool open_new = ops.empty() || by_bytes > base_round[g];
    if (!open_new) {
      const GatherOp& cur = ops.back();
      open_new = sent[g][s.reader] + s.nbytes > limits.max_member_bytes ||
                 (small && cur.small_bytes + s.nbytes > limits.max_small_bytes);
    }
    if (open_new) {
      base_round[g] = by_bytes;  // by_bytes only grows along a group's shards
      ops.push_back({g, static_cast<uint32_t>(ops.size()), 0, {}});
      sent[g].clear();
    }
    GatherOp& op = ops.back();
    op.items.push_back(i);
    if (small) op.small_bytes += s.nbytes;
    sent[g][s.reader] += s.nbytes;
  }
  std::vector<GatherOp> out;
  for (auto& ops : of_group) {
    for (GatherOp& op : ops) out.push_back(std::move(op));
  }
  std::stable_sort(out.begin(), out.end(), [](const GatherOp& a, const GatherOp& b) {
    return std::tie(a.round, a.group) < std::tie(b.round, b.group);
  });
  return out;
}

}  // namespace dcp::planner
