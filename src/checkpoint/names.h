// File names inside a checkpoint directory (docs/format.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dcp::checkpoint {

inline constexpr std::string_view kMetadataName = "dcp.metadata";
inline constexpr std::string_view kTmpSuffixPrefix = ".tmp-";
// What frameworks probe to find a torch DCP checkpoint; written after each commit
// (checkpoint/torch_probe.h).
inline constexpr std::string_view kTorchProbeName = ".metadata";

std::string SaveIdHex(uint64_t save_id);
std::string DataFileName(uint64_t save_id, int rank);   // data-<id>-r<rank>.safetensors
std::string BytesFileName(uint64_t save_id, int rank);  // data-<id>-r<rank>.bytes
// True for names a dcp save writes (data files, metadata tmp files): the only files a
// save may garbage-collect.
bool IsDcpDataFileName(std::string_view name);
bool IsMetadataTmpName(std::string_view name);  // dcp.metadata's or the probe's
// The writer rank of a data file (tensor or bytes); -1 for other names.
int DataFileRank(std::string_view name);
// The writer rank of a tensor data file (data-<id>-r<rank>.safetensors); -1 for other names.
int TensorDataFileRank(std::string_view name);
// A stored chunk's key in its data file's safetensors header: the tensor's fqn when it is the
// tensor's only chunk in that file, else "<fqn>.__dcp_chunk_<k>" for the k-th of them (in
// metadata order). Other safetensors readers see these names.
std::string ChunkKey(const std::string& fqn, bool several, uint64_t k);
// r<rank>.safetensors: a retired tensor data file waiting in a recycle directory to become
// rank <rank>'s next data file (SaveOptions::recycle_dir).
std::string RecycledFileName(int rank);
// dcp.lock.stale-<id>: a stale save lock moved aside while being taken over.
bool IsStaleLockName(std::string_view name);

}  // namespace dcp::checkpoint

namespace dcp::checkpoint {

// Per-rank metadata, written when saving without collectives:
// dcp.metadata.step<S>.rank<R>, S the caller's SaveOptions::step (the save's identity).
std::string RankMetadataName(uint64_t step, int rank);
// The rank of a per-rank metadata file name; -1 for any other name. Also accepts the
// older unstepped name dcp.metadata.rank<R> (*legacy set, *step 0).
int ParseRankMetadataName(std::string_view name, uint64_t* step = nullptr, bool* legacy = nullptr);

// "step_000000100": the directory of a step under a manager's root or memory tier
// (zero-padded so names sort; 9 digits or more), and back (nullopt for any other name).
std::string StepDirName(int64_t step);
std::optional<int64_t> ParseStepDirName(std::string_view name);

}  // namespace dcp::checkpoint
