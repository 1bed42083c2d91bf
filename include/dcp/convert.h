// Converting between HuggingFace safetensors checkpoints and dcp checkpoints (`dcp convert`),
// streaming: neither direction holds the whole model in memory.
//
// HF -> dcp: every source file is mapped read-only and its tensors are saved straight from the
// mapping by one dcp save; under several ranks each converts a byte-balanced share of the
// files, in one collective save. dcp -> HF: the output shards are planned from the metadata
// alone (greedy in fqn order, as transformers does); each is written tensor group by tensor
// group, every group filled by a dcp load into one bounded buffer. Under several ranks shard i
// is written by rank i % world; rank 0 writes the index last.
//
// Both throw dcp::Error naming the file or tensor at fault, on every rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcp/checkpoint.h"
#include "dcp/comm.h"
#include "dcp/status.h"

namespace dcp {

struct HfToDcpOptions {
  std::shared_ptr<Comm> comm;  // null: a world of one
  // Called on every rank once the source is open, before the save: the tensor bytes of the
  // whole source and of this rank's share.
  std::function<void(uint64_t total_bytes, uint64_t my_bytes)> on_start;
};

struct HfToDcpResult {
  uint64_t files = 0;        // source files converted by this rank
  uint64_t tensors = 0;      // by this rank
  uint64_t bytes = 0;        // tensor bytes, by this rank
  uint64_t total_bytes = 0;  // tensor bytes of the whole source
  // `__metadata__` keys of the source files other than "format", sorted, unique: a dcp
  // checkpoint has no place for them, so they are not kept (the CLI warns).
  std::vector<std::string> dropped_metadata_keys;
  SaveResult save;
  double seconds = 0;
};

// `src`: a .safetensors file, or a directory with model.safetensors or
// model.safetensors.index.json. Every rank of opts.comm calls it.
HfToDcpResult convert_hf_to_dcp(const std::string& src, const std::string& dst,
                                const HfToDcpOptions& opts = {});

struct DcpToHfOptions {
  std::shared_ptr<Comm> comm;  // null: a world of one
  uint64_t max_shard_bytes = 5'000'000'000;
  // Tensors are loaded in groups of at most this many bytes (a larger tensor alone).
  uint64_t buffer_bytes = uint64_t{256} << 20;
  // Called on this rank after each group written: tensor bytes and tensors done so far.
  std::function<void(uint64_t bytes, uint64_t tensors)> progress;
  // Called on every rank once the shards are planned: this rank's tensor bytes and tensors.
  std::function<void(uint64_t my_bytes, uint64_t my_tensors)> on_start;
  // A non-empty `dst` is refused unless this is set; then it is replaced atomically: the export
  // is written into a hidden sibling directory and swapped in only once complete, so a killed
  // or failed export leaves the previous content of `dst`, never a mix.
  bool overwrite = false;
};

struct DcpToHfResult {
  uint64_t shards_total = 0;
  uint64_t shards = 0;       // written by this rank
  uint64_t tensors = 0;      // by this rank
  uint64_t bytes = 0;        // tensor bytes, by this rank
  uint64_t total_bytes = 0;  // tensor bytes of the whole output (the index's total_size)
  uint64_t total_tensors = 0;
  std::vector<std::string> skipped_bytes_entries;  // safetensors cannot hold them
  double seconds = 0;
};

// Writes model.safetensors, or model-0000i-of-0000n.safetensors shards and
// model.safetensors.index.json, into `dst`. Bytes entries are skipped (listed in the result).
// The shards are planned from the source metadata read at the start, and the metadata is
// compared with that copy after every shard and before the swap: if the source checkpoint
// changes during the export (a save replaced it), the export fails (kFailedPrecondition) and
// `dst` is left as it was.
DcpToHfResult convert_dcp_to_hf(const std::string& src, const std::string& dst,
                                const DcpToHfOptions& opts = {});

// ---- Saving as torch's HuggingFaceStorageWriter does (torch.distributed.checkpoint.hf_storage):
// the same files, names and headers, which torch's HuggingFaceStorageReader, its consolidation
// and transformers read, written by the engine. Replicated chunks are written once (byte-
// balanced over their holders); every rank writes its files at once.
struct TorchHfSaveOptions {
  std::shared_ptr<Comm> comm;  // null: a world of one
  // The output file (1..N) of each tensor, in the caller's order (the order of the
  // consolidated files and the index); empty: every tensor in file 1. A tensor of the state
  // dict it lacks is an error.
  std::vector<std::pair<std::string, int>> fqn_to_index;
  // true (torch's save_distributed): rank r writes its chunks into
  // shard-<r+1>-model-<i>-of-<N>.safetensors, with their offsets in the header. false (a full
  // state dict, torch's default): model-<i>-of-<N>.safetensors and the index; under several
  // ranks written as consolidated files (torch would have every rank write the same names).
  bool save_distributed = true;
  // With save_distributed: consolidated files (whole tensors, torch's header) and the index
  // are written into this directory (torch's enable_consolidation; `dir` is then its
  // "sharded" subdirectory); empty: none. Files are spread over the ranks by bytes.
  std::string consolidate_into;
  // Consolidation loads tensors in groups of at most this many bytes (a larger one alone).
  uint64_t buffer_bytes = uint64_t{256} << 20;
};

struct TorchHfSaveResult {
  uint64_t files = 0;        // written by this rank: its shards and consolidated files
  uint64_t bytes = 0;        // tensor bytes written by this rank
  uint64_t total_bytes = 0;  // tensor bytes of the state, each replica counted once
  uint64_t tensors = 0;      // distinct tensors
  double seconds = 0;
};

// Every rank of opts.comm calls it. Files are written under temporary names and renamed into
// place; torch-named shard files in `dir` that this save did not write (an earlier save on
// more ranks) are removed, so readers never mix two saves. Non-tensor entries are refused
// (safetensors holds tensors only), as is a rank holding two chunks of one tensor for one file.
TorchHfSaveResult save_torch_hf(const StateDict& sd, const std::string& dir,
                                const TorchHfSaveOptions& opts = {});

// "5GB", "500MB", "1.5GiB", "123": decimal units KB/MB/GB/TB (10^3...), binary KiB/MiB/GiB/TiB,
// case-insensitive, B optional. kInvalidArgument for anything else or 0.
Result<uint64_t> ParseByteSize(std::string_view text);

}  // namespace dcp
