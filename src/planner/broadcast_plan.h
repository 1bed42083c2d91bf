// Read-once broadcast planning for load: who reads each shared destination shard.
//
// A destination shard (tensor, box) held by several ranks is "shared": one member of its
// group (the ranks holding it) reads it from storage and broadcasts it to the others. A
// shard larger than a slab (a fraction of a rank's fair share of all bytes read) is cut
// along dimension 0 into slabs, each read and broadcast by a different member, so that no
// reader carries a whole large shard while the others wait. Every rank computes the same
// plan from the same gathered identities: slabs are weighed by their bytes, taken largest
// first, each given to the group member with the fewest bytes assigned so far (ties: lowest
// rank); execution then walks them in one global order (tensor, box, slab), which keeps
// every group's collectives in step.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/box.h"
#include "dcp/status.h"
#include "metadata/metadata.h"

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

// A shared destination shard, or one dimension-0 slab of it: the unit read by one member
// and broadcast. A slab's rows are contiguous in the destination's (row-major) memory.
struct SharedShard {
  uint32_t tensor = 0;
  Box box;              // the destination shard, as its holders hold it
  Box slab;             // the part this entry moves: `box` itself, or a dimension-0 slab
  uint64_t nbytes = 0;  // of the slab
  uint32_t group = 0;   // index into BroadcastPlan::groups
  int reader = -1;      // world rank that reads and broadcasts it
};

// A stored chunk that several ranks would each read (in part) for different destination
// shards, so that reading it separately would fetch more than its bytes from storage
// (resharding with checksums on, or column slices of row-major data), or that a rank needs but
// cannot read where it is (BroadcastPlanOptions::readable): one rank reads it whole and
// broadcasts it -- a consumer, or with `readable` possibly a rank needing none of it -- and
// every consumer copies its regions out of the received copy. When the other members need no
// more than the chunk's bytes in all, or the group is small (kPartsMaxMembers), `parts` says
// what each needs, and a backend that can (Comm::scatters_parts) sends each member only its
// part.
struct SharedChunk {
  uint32_t tensor = 0;  // metadata tensor
  uint32_t stored = 0;  // stored chunk index within it
  uint64_t nbytes = 0;
  uint32_t group = 0;  // the consumers, and its reader
  int reader = -1;     // a consumer, or (BroadcastPlanOptions::readable) a rank that can read it
  // Empty, or per member of the group (in its order): the regions of the chunk it needs, in
  // the tensor's coordinates, sorted (none for a reader needing none of it).
  std::vector<std::vector<Box>> parts;
};

// Groups of at most this many members send a shared chunk as parts whatever the members need.
inline constexpr size_t kPartsMaxMembers = 4;

// A part of a stored chunk as byte spans of it: the row-major runs of `regions` inside `chunk`,
// sorted, adjacent ones merged. Sender and receiver of a part derive its bytes with this.
struct ByteSpan {
  uint64_t offset = 0;
  uint64_t length = 0;
  friend bool operator==(const ByteSpan&, const ByteSpan&) = default;
};
std::vector<ByteSpan> PartSpans(DType dtype, const Box& chunk, const std::vector<Box>& regions);

struct BroadcastPlan {
  std::vector<SharedShard> shards;       // global execution order: (tensor, box, slab)
  std::vector<SharedChunk> chunks;       // executed first, in (tensor, stored) order
  std::vector<std::vector<int>> groups;  // distinct member lists, sorted, each sorted
  // Per rank, the storage bytes it is expected to read.
  std::vector<uint64_t> read_bytes;
};

struct BroadcastPlanOptions {
  // The checkpoint's metadata; null: no stored-chunk sharing (and read_bytes count
  // destination bytes).
  const metadata::Metadata* md = nullptr;
  // Whether checksums are verified: a partial read of a stored chunk then costs the blocks
  // it touches, or the whole chunk when the chunk has one checksum (formats before 3).
  bool whole_chunk_reads = true;
  // The host of every rank; null: every rank on a host of its own. Ranks of one host share
  // its page cache, so when every rank needing some bytes is on one host, each reads them
  // itself (the first read fetches them from storage, the others copy them from memory,
  // which is cheaper than a broadcast between processes); only groups spanning hosts
  // broadcast.
  const std::vector<uint64_t>* host_of_rank = nullptr;
  // Shared shards larger than this are cut into dimension-0 slabs of about this size;
  // 0: a rank's fair share of all the bytes read / kSlabsPerShare, at least kMinSlabBytes.
  // With whole_chunk_reads, slabs end where no stored chunk crosses, or inside chunks with
  // block checksums (format 3) at rows that start a checksum block of every chunk crossing
  // them, so the readers on either side fetch and verify disjoint blocks (a cut elsewhere
  // would have both fetch the edge block, and ShareStoredChunks then broadcast the whole
  // chunk instead). A chunk with one checksum (formats 1, 2) is read whole and never cut.
  uint64_t slab_bytes = 0;
  // [rank][file of md]: whether the rank can read the file where it is (a memory tier's
  // restore: its host holds a copy); null: every rank reads every file. A shared stored
  // chunk or shard then goes to the member with the least bytes to read, counting what it
  // cannot read where it is twice (it must be brought to it first). A stored chunk that a
  // rank needs but cannot read where it is, while another rank can, is read by the least
  // loaded rank that can (a consumer on ties, or a rank that needs none of it) and broadcast
  // to its consumers (SharedChunk's group then holds that reader too); a shard none of whose
  // holders can read all its files, while each of them is readable somewhere, is not shared,
  // so that its chunks go to all holders at once. Only what no rank can read where it is, and
  // bytes entries (each rank reads its own), must be brought (LoadHooks::before_reads).
  const std::vector<std::vector<bool>>* readable = nullptr;
};

inline constexpr uint64_t kSlabsPerShare = 8;
inline constexpr uint64_t kMinSlabBytes = uint64_t{256} << 10;

// One broadcast of shared stored chunks: items of one (group, reader) sent together.
struct BroadcastOp {
  uint32_t group = 0;
  int reader = -1;
  uint64_t bytes = 0;
  std::vector<uint32_t> items;  // indices into BroadcastPlan::chunks
};

// The broadcasts of `plan`'s shared stored chunks in issue order, which every member of a
// group follows. A chunk of at least `batch_bytes` (or any chunk when it is 0) goes alone,
// when reached; smaller ones join the open batch of their (group, reader, whether it is sent
// as parts), which is issued when the next would overflow it; batches still open at the end are
// issued in the order they were opened.
std::vector<BroadcastOp> ScheduleBroadcasts(const BroadcastPlan& plan, uint64_t batch_bytes);

// One all-gather of shared shards (Comm::IAllGatherV over the group): every member sends the
// slabs it reads among `items` and receives the others'.
struct GatherOp {
  uint32_t group = 0;
  uint32_t round = 0;           // the op's place among its group's
  uint64_t small_bytes = 0;     // of slabs under GatherLimits::in_place_bytes
  std::vector<uint32_t> items;  // indices into BroadcastPlan::shards, in global order
};

struct GatherLimits {
  // A group's shards, in global order, are cut into this many rounds of about equal bytes,
  // so that reading one round overlaps the exchange of the one before...
  uint32_t rounds = 4;
  // ...and into more where a member would send more than this in one, so that reading and
  // exchanging stay overlapped in steps of bounded size at any state size...
  uint64_t max_member_bytes = uint64_t{1} << 30;
  // ...or its slabs under `in_place_bytes` would exceed `max_small_bytes` (what a backend
  // without scattered all-gathers packs into buffers: Comm::IAllGatherV's default).
  uint64_t max_small_bytes = uint64_t{64} << 20;
  uint64_t in_place_bytes = uint64_t{1} << 20;  // Comm::kInPlaceBytes
};

// The shared shards' all-gathers in issue order, by (round, group): every member walks them
// in this one global order, so no two groups' exchanges wait on each other in a cycle. A rank
// takes part in about `rounds` collectives per group it belongs to, whatever the group's size.
std::vector<GatherOp> ScheduleGathers(const BroadcastPlan& plan, const GatherLimits& limits);

// `holders[i]` are the ranks whose identity equals `identities[i]` (sorted, disjoint,
// covering 0..world_size-1).
BroadcastPlan PlanBroadcast(const std::vector<LoadIdentity>& identities,
                            const std::vector<std::vector<int>>& holders, int world_size,
                            const BroadcastPlanOptions& opts = {});

}  // namespace dcp::planner
