// Save and load: the library's entry points.
//
//   dcp::save(sd, "/ckpt/step_100");                // one process
//   dcp::save(sd, "/ckpt/step_100", {.comm = comm}); // every rank of `comm` calls it
//   dcp::load(sd, "/ckpt/step_100");                 // fills sd's memory in place, resharding
//
// Both throw dcp::Error with one clear message on failure. In a multi-rank job every rank
// gets the error (naming the failing rank), and a failed save never damages the checkpoint
// that was in the directory before: data files are new, and the metadata that makes a
// checkpoint visible is replaced atomically, last.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dcp/comm.h"
#include "dcp/metadata.h"
#include "dcp/state_dict.h"

namespace dcp {

struct SaveOptions {
  std::shared_ptr<Comm> comm;  // null: a world of one
  // Exchange plans and write one global metadata file. When false each rank writes its
  // own metadata file and replicas are not deduplicated.
  bool use_collectives = true;
  // Without collectives: the save's identity, the same on every rank and greater than the
  // previous save's (e.g. the training step); rank metadata files carry it in their names.
  // A load uses the newest step whose rank files are all present, so a save that did not
  // finish on every rank leaves the previous one loadable. Ignored with collectives.
  uint64_t step = 0;
  // Write each replicated chunk once, by the holder with the fewest bytes so far.
  bool dedup_replicas = true;
  // Reuse the global plan of the previous save of the same structure.
  bool plan_cache = true;
  // File recycling: a directory of retired data files, one per rank (r<rank>.safetensors).
  // When this rank's is there, its tensor data file is that file, renamed and overwritten in
  // place (storage that allocates new blocks slowly writes faster), instead of a new file.
  // The file is consumed: nothing else may need it. Empty: off. CheckpointManager sets it.
  std::string recycle_dir;
  // `dir` is node-local: each host has its own directory at that path (or the rank passes
  // its host's own path, as the manager's memory tier does) and keeps the files of its own
  // ranks. Every rank creates the directory; ranks are not required to see rank 0's; after
  // the commit, the first rank of every other host writes the same metadata into its host's
  // directory. The checkpoint is then the union of the hosts' directories.
  bool per_host_directory = false;
  // The directory's lock (dcp.lock, docs/failure-modes.md): a holder on another host renews
  // it every lease/4 seconds; once not renewed for this long it is gone and the next save
  // breaks its lock with a warning naming it. A dead holder of this host is seen at once.
  double lock_lease_seconds = 300;
  // Take the directory's lock from any holder not seen alive on this host (for a person who
  // knows that save is gone; `dcp unlock DIR` does the same by hand).
  bool break_lock = false;
  // An incremental save: a committed checkpoint in a sibling directory of `dir` (same parent).
  // A stored chunk the base holds with the same fqn, dtype and box and equal checksums is not
  // written; the metadata references the base's bytes instead (docs/incremental.md). The base
  // must then outlive this checkpoint: CheckpointManager's retention keeps bases of kept steps.
  // Empty: a full save.
  std::string incremental_base;
};

struct SaveResult {
  uint64_t bytes_written = 0;  // by this rank, tensor + bytes entries
  uint64_t items_written = 0;  // by this rank
  uint64_t files_written = 0;  // by this rank
  uint64_t unique_bytes = 0;   // in the whole checkpoint
  // Incremental saves: stored chunks this rank left in the base's files, and their bytes.
  uint64_t chunks_referenced = 0;
  uint64_t bytes_referenced = 0;
  bool plan_cache_hit = false;
  bool file_recycled = false;  // this rank's tensor data file was a recycled one
  // Planning payload this rank received (plan hashes, then each distinct plan once; with a
  // plan cache hit, the hashes only): what `dcp simulate` predicts per rank at scale. Also the
  // names and digests of values when ranks' values differ (docs/python.md, values), which
  // dcp simulate does not model.
  uint64_t plan_exchange_bytes = 0;
  double plan_seconds = 0;    // local plan + exchange + global plan
  double write_seconds = 0;   // data files, durable
  double commit_seconds = 0;  // gather results + metadata commit
  double total_seconds = 0;
};

struct LoadOptions {
  std::shared_ptr<Comm> comm;  // null: a world of one
  bool verify_checksums = true;
  // Skip state dict entries that the checkpoint lacks instead of failing.
  bool allow_partial = false;
  // Data files a reader keeps open (file systems; an object store's stay open, holding no
  // descriptor).
  int max_open_files = 8;
  // Read-once broadcast: a destination shard held by several ranks is read from storage
  // by one of them (byte-balanced) and sent to the others while the next is read. A group of
  // ranks holding the same shards exchanges them in a few all-gathers (Comm::IAllGatherV),
  // each member sending what it read, so over MPI a rank takes part in O(groups it is in)
  // collectives whatever the groups' sizes (backends without scattered all-gathers, torch's
  // process groups among them, run them as broadcasts per sender: Comm::IAllGatherV).
  bool broadcast = true;
  // Stored chunks a reshard shares (read whole once, broadcast) smaller than this travel
  // together per (group, reader); 0: no batching.
  uint64_t broadcast_batch_bytes = uint64_t{6} << 20;
  // A shared shard larger than this is cut along dimension 0 into slabs read and broadcast
  // by different members, so that the largest reader stays near the mean; 0: automatic (an
  // eighth of a rank's fair share of the bytes read, at least 256 KiB). Every rank must
  // pass the same value.
  uint64_t broadcast_slab_bytes = 0;
  int max_broadcasts_in_flight = 8;
  // Host memory a rank holds for collectives in flight beyond the destination tensors: the
  // whole stored chunks a reshard shares, and small shards packed by backends whose
  // all-gathers are not in place (all but MPI). Posting waits for older collectives while
  // more would be held; one buffer larger than this goes alone (so the bound is the larger of
  // this and the largest such buffer). LoadResult::peak_broadcast_buffer_bytes says what a
  // load held.
  uint64_t max_broadcast_buffer_bytes = uint64_t{256} << 20;
  // Ranks of one host share its page cache: by default, bytes wanted only by ranks of one
  // host are read by each of them (storage is read once, the others copy from memory, which
  // beats a broadcast between processes) and only groups spanning hosts broadcast. True
  // broadcasts within a host too (the read-once machinery on one machine, or memory that
  // page-cache copies cannot reach, such as device memory later). Object stores always do:
  // nothing caches their reads for the host, each one is a request.
  bool broadcast_within_host = false;
  // When every rank finds the stored chunks it would read in its host's page cache (a restart
  // on the machines that just wrote or read the checkpoint), reading them is a memory copy and
  // the load reads privately: no broadcast, no exchange of identities. True broadcasts anyway.
  bool broadcast_cached = false;
  // Name mapping, applied to the checkpoint's names before they are matched with the state
  // dict: a stored fqn starting with `strip_prefix` loses it, then `add_prefix` is prepended
  // (e.g. strip "model." to load a HuggingFace checkpoint into a bare module).
  std::string strip_prefix;
  std::string add_prefix;
};

struct LoadResult {
  uint64_t bytes_read = 0;  // from storage, by this rank
  // Opens of data files by this rank: a file reopened after max_open_files closed it, or
  // opened by both readers of a broadcast load, counts each time.
  uint64_t files_opened = 0;
  uint64_t chunks_read = 0;  // stored chunks this rank read from
  uint64_t entries_loaded = 0;
  uint64_t entries_skipped = 0;  // partial load
  // Read-once broadcast (this rank).
  uint64_t shared_shards = 0;           // destination shards this rank shares with others
  uint64_t shards_read_for_others = 0;  // shared shards this rank read and sent
  // Stored chunks several ranks needed parts of (resharding), or that a rank could not read
  // where it is (a memory tier's restore): read whole once, by one rank, and broadcast.
  uint64_t shared_chunks = 0;
  // Collectives this rank took part in: broadcasts and all-gathers (one each, even where a
  // backend runs an all-gather as several broadcasts).
  uint64_t broadcasts = 0;
  uint64_t batches = 0;         // broadcasts of several shared stored chunks
  uint64_t bytes_sent = 0;      // of what this rank read for others
  uint64_t bytes_received = 0;  // of what others read for this rank
  uint64_t groups_created = 0;  // group communicators created (cached across loads)
  // Broadcast buffers held at once (LoadOptions::max_broadcast_buffer_bytes).
  uint64_t peak_broadcast_buffer_bytes = 0;
  // What the caller should hear of: values saved per rank of which this rank got another
  // rank's (the job's world differs from the saving job's), one line each.
  std::vector<std::string> warnings;
  // Phases (seconds).
  double metadata_seconds = 0;
  double plan_seconds = 0;      // local plan
  double exchange_seconds = 0;  // plan identities gathered, readers and groups decided
  double shared_seconds = 0;    // shared shards: read + broadcast, overlapped
  double private_seconds = 0;   // shards no one else needs
  double read_seconds = 0;      // shared + private
  double total_seconds = 0;
  // CheckpointManager loads: the step loaded, and why newer complete steps were passed over
  // (each one "step N: <error>", marked bad on disk); -1 and empty otherwise.
  int64_t step = -1;
  std::string fell_back;
  // Managers with a memory tier: the step came from the hosts' memory tiers; the data files
  // copied to this rank's host before the load, from a partner host's tier or from durable
  // storage (only what its ranks read themselves and no local copy holds: bytes entries, files
  // no tier holds). Stored chunks read on another host and broadcast to this rank are not
  // copies: they count in bytes_received.
  bool from_memory = false;
  uint64_t files_from_peers = 0;
  uint64_t files_from_storage = 0;
  // Managers with a memory tier: every copy the restore found damaged, wherever it was found
  // (as a host read it, or as it arrived from its holder), one line each naming the holder's
  // host, the step and the file: "host h3: step 7, data_00001.safetensors: <why>". The same
  // list on every rank; such copies are never used again.
  std::vector<std::string> damaged_copies;
};

// Every rank of opts.comm calls it, with its own chunks. Throws dcp::Error; the checkpoint
// that was in `dir` before stays loadable.
SaveResult save(const StateDict& sd, const std::string& dir, const SaveOptions& opts = {});

// Fills the memory of sd's tensor chunks and replaces its bytes entries' payloads. Every rank
// of opts.comm calls it. On failure (dcp::Error, on every rank) the contents of sd's tensor
// memory and bytes entries are unspecified: some may hold checkpoint data, some old values,
// some bytes of a chunk whose checksum failed. Use sd only after a load that returned.
LoadResult load(StateDict& sd, const std::string& dir, const LoadOptions& opts = {});

// What a checkpoint holds -- names, dtypes, global shapes, stored chunks and files, bytes
// entries -- read from its metadata alone, so a caller can allocate before load (PyTorch
// DCP's read_metadata). `dir` may also be a HuggingFace source (a .safetensors file, or a
// directory with model.safetensors, model.safetensors.index.json or torch's HuggingFace shard
// files): has_checksums is then
// false. Throws dcp::Error: kFailedPrecondition when `dir` holds no committed checkpoint,
// kNotFound when it does not exist, kDataLoss when the metadata is corrupt.
Metadata read_metadata(const std::string& dir);

// Requests this process's object-store client (the one s3:// paths use) has sent so far, for
// benchmarks (requests per GiB); 0 before any.
uint64_t object_store_requests();

struct VerifyResult {
  uint64_t files = 0;
  uint64_t tensors = 0;
  uint64_t chunks = 0;
  uint64_t bytes_entries = 0;
  uint64_t bytes_checked = 0;  // hashed against the metadata's checksums
  bool has_checksums = true;   // false for HuggingFace sources: sizes checked only
  double seconds = 0;
};

// Checks the metadata, that every data file is present with its recorded size, and every
// chunk's and bytes entry's checksum (`dcp verify`). Throws dcp::Error (kDataLoss, kNotFound)
// naming the first file and fqn at fault.
VerifyResult verify(const std::string& dir);

}  // namespace dcp
