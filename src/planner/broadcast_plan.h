// Read-once broadcast planning for load: who reads each shared destination shard.
//
// A destination shard (tensor, box) held by several ranks is "shared": one member of its
// group (the ranks holding it) reads it from storage and broadcasts it to the others.
// Every rank computes the same plan from the same gathered identities: shards are weighed
// by their bytes, taken largest first, each given to the group member with the fewest
// bytes assigned so far (ties: lowest rank); execution then walks them in one global order
// (tensor, offsets, lengths), which keeps every group's collectives in step.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/box.h"
#include "dcp/status.h"

namespace dcp::planner {

// One destination shard a rank wants filled.
struct ShardIdentity {
  uint32_t tensor = 0;  // index into the checkpoint metadata's tensors (sorted by fqn)
  Box box;
  uint64_t nbytes = 0;
  // False when this rank's memory for it cannot be moved by the comm backend: the shard
  // is then read by every holder itself.
  bool broadcastable = true;

  friend bool operator==(const ShardIdentity&, const ShardIdentity&) = default;
};

// A rank's identities, sorted by (tensor, box).
struct LoadIdentity {
  std::vector<ShardIdentity> shards;
};

std::string EncodeLoadIdentity(const LoadIdentity& id);
Result<LoadIdentity> DecodeLoadIdentity(std::string_view data);

struct SharedShard {
  uint32_t tensor = 0;
  Box box;
  uint64_t nbytes = 0;
  uint32_t group = 0;  // index into BroadcastPlan::groups
  int reader = -1;     // world rank that reads and broadcasts it
};

struct BroadcastPlan {
  std::vector<SharedShard> shards;       // global execution order: (tensor, box)
  std::vector<std::vector<int>> groups;  // distinct member lists, sorted, each sorted
  std::vector<uint64_t> read_bytes;      // per rank: shared bytes it reads + private bytes
};

// `holders[i]` are the ranks whose identity equals `identities[i]` (sorted, disjoint,
// covering 0..world_size-1).
BroadcastPlan PlanBroadcast(const std::vector<LoadIdentity>& identities,
                            const std::vector<std::vector<int>>& holders, int world_size);

}  // namespace dcp::planner
