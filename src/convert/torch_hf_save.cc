// save_torch_hf: the files torch's HuggingFaceStorageWriter writes (hf/torch_hf_format.h),
// planned and written by the engine.
//
// Steps, each ending in an agreement so every rank reports the same failure: (1) plan as a
// save does, replicas assigned as torch's dedup assigns them; (2) every rank writes its chunks
// under hidden names, one file per output index, put in place once all are written, the
// earlier save's files removed just before (PlaceAll); (3) optional consolidation: output
// files spread over the ranks by bytes, each filled by loads of the shards just written, put
// in place the same way; rank 0 writes the index.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "checkpoint/names.h"
#include "convert/convert.h"
#include "hf/hf_checkpoint.h"
#include "hf/torch_hf_format.h"
#include "planner/plan_classes.h"
#include "planner/save_plan.h"
#include "storage/data_files.h"
#include "storage/file_system.h"

namespace dcp {
namespace convert {
namespace {

// Where a non-distributed save under several ranks writes its shards before consolidating.
constexpr std::string_view kStagingShards = ".dcp-hf-shards";

using ChunkKey = std::pair<std::string, Shape>;  // (fqn, offsets): torch's MetadataIndex

struct Planned {
  planner::GlobalSavePlan plan;    // validated; its tensors' dtypes and shapes
  std::map<ChunkKey, int> writer;  // as torch's dedup_save_plans assigns them
  std::vector<std::string> order;  // torch's metadata order (AssignAsTorch)
};

// Who writes each chunk, as torch's dedup_save_plans decides: each chunk, in order of first
// appearance over the ranks' plans (rank order), to the holder with the fewest bytes so far
// (ties to the first in Python's order of the set of holders), so the shard files hold what
// torch's would. `order`: the tensors
// in order of first appearance over what each rank writes, rank by rank: torch's metadata
// order, which its consolidation follows without a mapping.
void AssignAsTorch(const std::vector<planner::LocalSavePlan>& distinct,
                   const planner::PlanClasses& classes, int world, Planned* out) {
  std::map<ChunkKey, size_t> id;
  std::vector<ChunkKey> keys;
  std::vector<uint64_t> bytes;
  std::vector<std::vector<int>> holders;
  std::vector<std::vector<size_t>> ids_of_class(distinct.size());
  for (size_t c = 0; c < distinct.size(); ++c) {  // classes by lowest rank: first appearance
    for (const planner::SaveItem& item : distinct[c].items) {
      auto [it, fresh] = id.emplace(ChunkKey{item.fqn, item.box.offsets}, keys.size());
      if (fresh) {
        keys.push_back(it->first);
        bytes.push_back(item.is_bytes ? 1 : std::max<uint64_t>(item.nbytes, 1));
        holders.emplace_back();
      }
      ids_of_class[c].push_back(it->second);
      const std::vector<int>& ranks = classes.holders[c];
      holders[it->second].insert(holders[it->second].end(), ranks.begin(), ranks.end());
    }
  }
  std::vector<uint64_t> size(world, 0);
  std::vector<int> writer(keys.size());
  for (size_t k = 0; k < keys.size(); ++k) {
    std::sort(holders[k].begin(), holders[k].end());
    // torch: min(plan_indices, key=size) over a set, so ties go by the set's order.
    int best = holders[k].front();
    size_t tied = 0;
    for (int r : holders[k]) {
      if (size[r] < size[best]) best = r, tied = 0;
      tied += size[r] == size[best];
    }
    if (tied > 1) {
      for (int r : hf::PythonSetOrder(holders[k])) {
        if (size[r] == size[best]) {
          best = r;
          break;
        }
      }
    }
    writer[k] = best;
    size[best] += bytes[k];
    out->writer.emplace(keys[k], best);
  }
  std::vector<std::tuple<int, size_t, size_t>> written;  // (writer, position in its plan, id)
  for (size_t c = 0; c < distinct.size(); ++c) {
    for (size_t p = 0; p < ids_of_class[c].size(); ++p) {
      const size_t k = ids_of_class[c][p];
      if (classes.class_of[writer[k]] == static_cast<int>(c)) written.emplace_back(writer[k], p, k);
    }
  }
  std::sort(written.begin(), written.end());
  std::set<std::string_view> seen;
  for (const auto& [w, p, k] : written) {
    if (seen.insert(keys[k].first).second) out->order.push_back(keys[k].first);
  }
}

Status CheckLocal(const planner::LocalSavePlan& local,
                  const std::unordered_map<std::string, int>& index_of, const std::string& dir) {
  for (const planner::SaveItem& item : local.items) {
    if (item.is_bytes) {
      return InvalidArgument("save to " + dir + " (HuggingFace safetensors): '" + item.fqn +
                             "' is not a tensor, and safetensors files hold tensors only; save "
                             "it with dcp save, or leave it out of this state dict");
    }
    if (!index_of.empty() && !index_of.count(item.fqn)) {
      return InvalidArgument("save to " + dir +
                             " (HuggingFace safetensors): fqn_to_index_mapping " +
                             "gives no file for tensor '" + item.fqn + "'");
    }
  }
  return OkStatus();
}

// (1): the global plan over the distinct local plans, each sent once by its class's lowest
// rank.
Result<Planned> PlanGlobally(Comm& comm, const StateDict& sd,
                             const std::unordered_map<std::string, int>& index_of,
                             const std::string& dir) {
  auto local = planner::BuildLocalSavePlan(sd);
  Status st = local.status();
  if (st.ok()) st = CheckLocal(*local, index_of, dir);
  std::string encoded = st.ok() ? planner::EncodeLocalPlan(*local) : std::string();
  DCP_RETURN_IF_ERROR(AgreeOnStatus(comm, st));
  const uint64_t hash = planner::PlanHash(encoded);
  DCP_ASSIGN_OR_RETURN(auto hash_bytes,
                       comm.AllGather(std::string_view(reinterpret_cast<const char*>(&hash), 8)));
  std::vector<uint64_t> hashes(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    if (hash_bytes[r].size() != 8) return Internal("HuggingFace save: bad plan hash from a rank");
    std::copy_n(hash_bytes[r].data(), 8, reinterpret_cast<char*>(&hashes[r]));
  }
  const planner::PlanClasses classes = planner::GroupByPlanHash(hashes);
  DCP_ASSIGN_OR_RETURN(auto raw,
                       comm.AllGather(classes.IsSender(comm.rank()) ? encoded : std::string()));
  std::vector<planner::LocalSavePlan> distinct(classes.holders.size());
  for (size_t c = 0; c < classes.holders.size(); ++c) {
    DCP_ASSIGN_OR_RETURN(distinct[c], planner::DecodeLocalPlan(raw[classes.holders[c].front()]));
  }
  auto global = planner::PlanSave(distinct, classes.holders, comm.size(),
                                  {.balance = true, .split_replicas = false});
  if (!global.ok()) return global.status().Annotate("save to " + dir + ": ");
  Planned out;
  out.plan = std::move(global).value();
  AssignAsTorch(distinct, classes, comm.size(), &out);
  return out;
}

// Rank 0's mapping, on every rank (torch, too, takes its coordinator's): ranks handed different
// ones would otherwise write files the index does not name, or fail apart and hang.
Result<std::vector<std::pair<std::string, int>>> RankZeroMapping(
    Comm& comm, const std::vector<std::pair<std::string, int>>& mine) {
  std::string wire;
  if (comm.rank() == 0) {
    for (const auto& [name, index] : mine) {
      wire += std::to_string(name.size()) + ':' + name + std::to_string(index) + ';';
    }
  }
  DCP_RETURN_IF_ERROR(comm.Broadcast(wire, 0));
  std::vector<std::pair<std::string, int>> out;
  const char* p = wire.data();
  const char* end = p + wire.size();
  while (p < end) {
    size_t len = 0;
    int index = 0;
    auto l = std::from_chars(p, end, len);
    if (l.ec != std::errc() || l.ptr == end || *l.ptr != ':' ||
        static_cast<size_t>(end - l.ptr - 1) < len) {
      return Internal("HuggingFace save: a malformed fqn_to_index_mapping from rank 0");
    }
    std::string name(l.ptr + 1, len);
    auto i = std::from_chars(l.ptr + 1 + len, end, index);
    if (i.ec != std::errc() || i.ptr == end || *i.ptr != ';') {
      return Internal("HuggingFace save: a malformed fqn_to_index_mapping from rank 0");
    }
    out.emplace_back(std::move(name), index);
    p = i.ptr + 1;
  }
  return out;
}

struct Item {
  std::string_view fqn;
  const TensorChunk* chunk;
  DType dtype;
};

// (2): this rank's chunks, by output index in order of first appearance (as torch buckets
// them), each file's items in state dict order.
Result<std::vector<std::pair<int, std::vector<Item>>>> MyFiles(
    const StateDict& sd, const Planned& planned, int rank,
    const std::unordered_map<std::string, int>& index_of) {
  std::vector<std::pair<int, std::vector<Item>>> files;
  for (const StateEntry& e : sd.entries()) {
    if (e.kind != StateEntry::Kind::kTensor) continue;
    for (const TensorChunk& c : e.chunks) {
      auto w = planned.writer.find(ChunkKey{e.fqn, c.box.offsets});
      if (w == planned.writer.end() || w->second != rank) continue;
      const int index = index_of.empty() ? 1 : index_of.at(e.fqn);
      auto f =
          std::find_if(files.begin(), files.end(), [&](const auto& p) { return p.first == index; });
      if (f == files.end()) {
        files.emplace_back(index, std::vector<Item>());
        f = std::prev(files.end());
      }
      for (const Item& other : f->second) {
        if (other.fqn == e.fqn) {
          return InvalidArgument("tensor '" + e.fqn + "': rank " + std::to_string(rank) +
                                 " writes two of its chunks into one HuggingFace file, which " +
                                 "holds one chunk of a tensor per rank");
        }
      }
      f->second.push_back({e.fqn, &c, e.dtype});
    }
  }
  return files;
}

Status WriteShardFile(storage::FileSystem& fs, const std::string& path, std::vector<Item> items,
                      TorchHfSaveResult* result) {
  std::vector<hf::ShardedTensor> info;
  for (const Item& it : items) info.push_back({std::string(it.fqn), it.chunk->box.offsets});
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return hf::SafetensorsOrderLess(a.dtype, a.fqn, b.dtype, b.fqn);
  });
  storage::SafetensorsHeader header(
      {{std::string(hf::kShardingInfoKey), hf::ShardingInfoJson(info)},
       {std::string(hf::kShardingVersionKey), std::string(hf::kShardingVersion)},
       {"format", "pt"}});
  std::vector<storage::TensorToWrite> tensors;
  for (const Item& it : items) {
    const TensorView& v = it.chunk->view;
    const uint64_t n =
        DTypeBytes(it.dtype, it.chunk->box.lengths.NumElements().value_or(0)).value_or(0);
    tensors.push_back({std::string(it.fqn), it.dtype, it.chunk->box.lengths,
                       std::span(static_cast<const std::byte*>(v.data), n)});
    header.Add(it.fqn, it.dtype, it.chunk->box.lengths, n);
    result->bytes += n;
  }
  (void)fs.Remove(path);  // a part left by a save that died
  auto written =
      storage::WriteSafetensorsFileWithHeader(fs, path, std::move(header).Finish(), tensors);
  if (!written.ok()) {
    (void)fs.Remove(path);
    return written.status().Annotate("writing " + path + ": ");
  }
  ++result->files;
  return OkStatus();
}

// A file being written, under a hidden name: no reader takes it for one of torch's.
std::string Part(const std::string& dir, const std::string& name) {
  return storage::JoinPath(dir, "." + name + ".part");
}

// A HuggingFace file of an earlier save, which readers of `dir` would take (a torch-named file,
// or model.safetensors, which outranks them): `keep_shards` spares shard files (this save's,
// when consolidating into their own directory).
bool EarlierSaves(const std::string& name, bool keep_shards) {
  if (name == hf::kSingleFileName || name == hf::kIndexFileName) return true;
  return hf::IsTorchHfFileName(name) && !(keep_shards && name.rfind("shard-", 0) == 0);
}

// Every rank's files (`mine`, written as Part) put in place once all are written. Before any is,
// rank 0 removes the earlier save's files and index: a rank dying among the renames leaves a
// directory that fails to load, never one that loads two saves mixed. On a failure reported by
// any rank, every rank removes its parts and the files it already placed.
Status PlaceAll(Comm& comm, storage::FileSystem& fs, const std::string& dir,
                const std::vector<std::string>& mine, bool keep_shards, const Status& wrote) {
  Status st = AgreeOnStatus(comm, wrote);
  if (st.ok() && comm.rank() == 0) {
    auto names = fs.List(dir);
    st = names.status();
    for (size_t i = 0; st.ok() && i < names->size(); ++i) {
      if (!EarlierSaves((*names)[i], keep_shards)) continue;
      st = fs.Remove(storage::JoinPath(dir, (*names)[i]));
      if (st.code() == StatusCode::kNotFound) st = OkStatus();
    }
  }
  st = AgreeOnStatus(comm, st);
  std::vector<std::string> placed;
  for (const std::string& name : mine) {
    if (st.ok()) st = fs.Rename(Part(dir, name), storage::JoinPath(dir, name));
    if (st.ok()) {
      placed.push_back(name);
    } else {
      (void)fs.Remove(Part(dir, name));
    }
  }
  st = AgreeOnStatus(comm, st);
  if (!st.ok()) {
    for (const std::string& name : placed) (void)fs.Remove(storage::JoinPath(dir, name));
  }
  return st;
}

// On rank 0, once every rank's files are in place (PlaceAll removed the earlier save's): the
// parts a save that died left, and an older dcp checkpoint's metadata and `.metadata` probe
// (readers would take that checkpoint first).
Status Sweep(Comm& comm, storage::FileSystem& fs, const std::string& dir) {
  Status st;
  if (comm.rank() == 0) {
    auto names = fs.List(dir);
    st = names.status();
    const bool dcp_checkpoint = st.ok() && std::find(names->begin(), names->end(),
                                                     checkpoint::kMetadataName) != names->end();
    for (size_t i = 0; st.ok() && i < names->size(); ++i) {
      const std::string& n = (*names)[i];
      const bool part = n.size() > 6 && n[0] == '.' &&
                        (n.ends_with(".part") || n.ends_with(".part.tmp")) &&
                        hf::IsTorchHfFileName(n.substr(1, n.rfind(".part") - 1));
      if (part || (dcp_checkpoint &&
                   (n == checkpoint::kMetadataName || n == checkpoint::kTorchProbeName))) {
        st = fs.Remove(storage::JoinPath(dir, n));
        if (st.code() == StatusCode::kNotFound) st = OkStatus();
      }
    }
  }
  return AgreeOnStatus(comm, st);
}

// (3): whole tensors from the shards in `shards` into files of `out_dir`, and the index.
Status Consolidate(Comm& comm, storage::FileSystem& fs, const std::string& shards,
                   const std::string& out_dir, const Planned& planned,
                   const TorchHfSaveOptions& opts, TorchHfSaveResult* result) {
  std::unordered_map<std::string_view, const planner::GlobalSavePlan::Tensor*> by_name;
  for (const auto& t : planned.plan.tensors) by_name[t.fqn] = &t;
  std::vector<std::pair<std::string, int>> order = opts.fqn_to_index;
  int max_index = 1;
  if (order.empty()) {
    for (const std::string& n : planned.order) order.push_back({n, 1});
  }
  for (const auto& [name, index] : order) max_index = std::max(max_index, index);
  // Output files in order of first appearance, tensors in the mapping's order.
  std::vector<OutTensor> tensors;
  std::vector<int> file_index;
  std::vector<std::vector<size_t>> members;
  std::vector<uint64_t> file_bytes;
  for (const auto& [name, index] : order) {
    auto t = by_name.find(name);
    if (t == by_name.end()) continue;  // in the mapping, not in the state dict
    const auto* pt = t->second;
    auto f = std::find(file_index.begin(), file_index.end(), index) - file_index.begin();
    if (f == static_cast<long>(file_index.size())) {
      file_index.push_back(index);
      members.emplace_back();
      file_bytes.push_back(0);
    }
    const uint64_t bytes =
        DTypeBytes(pt->dtype, pt->global_shape.NumElements().value_or(0)).value_or(0);
    members[f].push_back(tensors.size());
    file_bytes[f] += bytes;
    tensors.push_back({pt->fqn, pt->dtype, pt->global_shape, bytes});
  }
  const std::vector<int> owner = AssignFiles(file_bytes, comm.size());
  Status st = fs.CreateDirs(out_dir);
  std::vector<std::byte> buffer;
  // Written under hidden names and put in place only once every rank's loads are done: a file
  // in place would join the shards' source when `out_dir` is their directory.
  std::vector<std::string> mine;
  for (size_t f = 0; f < members.size() && st.ok(); ++f) {
    if (owner[f] != comm.rank()) continue;
    std::vector<hf::WholeTensor> whole;
    for (size_t i : members[f]) {
      whole.push_back({tensors[i].fqn, tensors[i].dtype, tensors[i].shape, tensors[i].bytes});
    }
    mine.push_back(hf::TorchHfFileName(file_index[f], max_index));
    (void)fs.Remove(Part(out_dir, mine.back()) + ".tmp");  // left by a save that died
    st = WriteLoadedTensors(shards, Part(out_dir, mine.back()), hf::TorchConsolidatedHeader(whole),
                            tensors, members[f], opts.buffer_bytes, {}, fs, fs, buffer);
    if (st.ok()) {
      ++result->files;
      result->bytes += file_bytes[f];
    }
  }
  const bool beside_shards = storage::NormalPath(out_dir) == storage::NormalPath(shards);
  DCP_RETURN_IF_ERROR(PlaceAll(comm, fs, out_dir, mine, /*keep_shards=*/beside_shards,
                               st.ok() ? st : st.Annotate("consolidating into " + out_dir + ": ")));
  DCP_RETURN_IF_ERROR(Sweep(comm, fs, out_dir));
  if (comm.rank() == 0) {
    std::vector<std::pair<std::string, std::string>> weight_map;
    uint64_t total = 0;
    for (size_t f = 0; f < members.size(); ++f) {
      for (size_t i : members[f]) {
        weight_map.push_back({tensors[i].fqn, hf::TorchHfFileName(file_index[f], max_index)});
        total += tensors[i].bytes;
      }
    }
    st = fs.WriteAtomic(storage::JoinPath(out_dir, std::string(hf::kIndexFileName)),
                        hf::TorchIndexJson(total, weight_map), ".tmp");
  }
  return AgreeOnStatus(comm, st);
}

}  // namespace

Result<TorchHfSaveResult> SaveTorchHf(const StateDict& sd, const std::string& dir,
                                      const TorchHfSaveOptions& opts, storage::FileSystem& fs) {
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<Comm> comm = opts.comm ? opts.comm : LocalComm();
  const int rank = comm->rank(), world = comm->size();
  TorchHfSaveResult result;
  TorchHfSaveOptions agreed = opts;
  DCP_ASSIGN_OR_RETURN(agreed.fqn_to_index, RankZeroMapping(*comm, opts.fqn_to_index));
  std::unordered_map<std::string, int> index_of;
  int max_index = 1;
  for (const auto& [name, index] : agreed.fqn_to_index) {
    if (index < 1) {
      return InvalidArgument("save to " + dir + ": fqn_to_index_mapping gives '" + name +
                             "' file " + std::to_string(index) + "; files are numbered from 1");
    }
    index_of[name] = index;
    max_index = std::max(max_index, index);
  }
  DCP_ASSIGN_OR_RETURN(Planned planned, PlanGlobally(*comm, sd, index_of, dir));
  result.total_bytes = planned.plan.unique_bytes;
  result.tensors = planned.plan.tensors.size();

  // A full state dict on several ranks goes through shards and consolidation: torch would
  // have every rank write the same file names.
  const bool staged = !opts.save_distributed && world > 1;
  const bool shard_names = opts.save_distributed || staged;
  const std::string shards = staged ? storage::JoinPath(dir, std::string(kStagingShards)) : dir;
  auto files = MyFiles(sd, planned, rank, index_of);
  Status st = files.status();
  if (st.ok()) st = fs.CreateDirs(shards);
  std::vector<std::string> mine;
  for (size_t i = 0; st.ok() && i < files->size(); ++i) {
    const auto& [index, items] = (*files)[i];
    mine.push_back(hf::TorchHfFileName(index, max_index, shard_names ? rank + 1 : 0));
    st = WriteShardFile(fs, Part(shards, mine.back()), items, &result);
  }
  DCP_RETURN_IF_ERROR(PlaceAll(*comm, fs, shards, mine, /*keep_shards=*/false,
                               st.ok() ? st : st.Annotate("save to " + dir + ": ")));
  DCP_RETURN_IF_ERROR(Sweep(*comm, fs, shards));

  if (!shard_names) {
    // One process of a full state dict: torch's index of what it wrote, in write order.
    std::vector<std::pair<std::string, std::string>> weight_map;
    uint64_t total = 0;
    for (size_t i = 0; i < files->size(); ++i) {
      for (const Item& it : (*files)[i].second) {
        weight_map.push_back({std::string(it.fqn), mine[i]});
        total += DTypeBytes(it.dtype, it.chunk->box.lengths.NumElements().value_or(0)).value_or(0);
      }
    }
    DCP_RETURN_IF_ERROR(fs.WriteAtomic(storage::JoinPath(dir, std::string(hf::kIndexFileName)),
                                       hf::TorchIndexJson(total, weight_map), ".tmp"));
  } else if (staged || !opts.consolidate_into.empty()) {
    DCP_RETURN_IF_ERROR(Consolidate(*comm, fs, shards, staged ? dir : opts.consolidate_into,
                                    planned, agreed, &result));
    if (staged && rank == 0) (void)fs.RemoveTree(shards);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace convert

TorchHfSaveResult save_torch_hf(const StateDict& sd, const std::string& dir,
                                const TorchHfSaveOptions& opts) {
  if (storage::IsObjectStorePath(dir)) {
    ThrowIfError(InvalidArgument("HuggingFace save to " + dir +
                                 ": safetensors files are written to a local path"));
  }
  return ValueOrThrow(convert::SaveTorchHf(sd, dir, opts, storage::PosixFileSystem()));
}

}  // namespace dcp
