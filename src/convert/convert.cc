#include "convert/convert.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "checkpoint/load.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/save.h"
#include "convert/source_mapping.h"
#include "hf/hf_checkpoint.h"
#include "hf/torch_hf_format.h"
#include "metadata/codec.h"
#include "storage/data_files.h"

namespace dcp {
namespace convert {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string ShardName(size_t i, size_t n) {
  if (n == 1) return std::string(hf::kSingleFileName);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// The safetensors header of a shard (storage::SafetensorsHeader, as dcp's own data files).
std::string ShardHeader(const std::vector<OutTensor>& tensors, const OutShard& shard) {
  storage::SafetensorsHeader header;
  for (size_t i : shard.tensors)
    header.Add(tensors[i].fqn, tensors[i].dtype, tensors[i].shape, tensors[i].bytes);
  return std::move(header).Finish();
}

// Writes one output shard, counted into `out`.
Status WriteShard(const std::string& src, const std::string& dst,
                  const std::vector<OutTensor>& tensors, const OutShard& shard,
                  const DcpToHfOptions& opts, storage::FileSystem& src_fs, storage::FileSystem& fs,
                  std::vector<std::byte>& buffer, DcpToHfResult* out) {
  const uint64_t bytes_before = out->bytes, tensors_before = out->tensors;
  DCP_RETURN_IF_ERROR(WriteLoadedTensors(
      src, storage::JoinPath(dst, shard.file), ShardHeader(tensors, shard), tensors, shard.tensors,
      opts.buffer_bytes,
      [&](uint64_t bytes, uint64_t count) {
        out->bytes = bytes_before + bytes;
        out->tensors = tensors_before + count;
        if (opts.progress) opts.progress(out->bytes, out->tensors);
      },
      src_fs, fs, buffer));
  ++out->shards;
  return OkStatus();
}

// The source must not change under an export: its metadata, encoded, must stay the bytes read
// at the start. Saves never reuse a save_id, so once the source changed it stays changed, and
// a check after the last load catches a change during any earlier one.
Status CheckSourceUnchanged(storage::FileSystem& fs, const std::string& src,
                            const std::string& encoded) {
  auto now = checkpoint::ReadMetadata(fs, src);
  if (!now.ok() || metadata::Encode(*now) != encoded) {
    return FailedPrecondition("checkpoint " + src +
                              " changed during the export (another save replaced it?); the "
                              "export would mix two checkpoints, so it was abandoned" +
                              (now.ok() ? "" : " (" + now.status().message() + ")"));
  }
  return OkStatus();
}

std::string Canonical(const std::string& p) {
  std::error_code ec;
  auto c = std::filesystem::weakly_canonical(std::filesystem::absolute(p, ec), ec);
  return ec ? p : c.lexically_normal().string();
}

// True when `inner` is `outer` or lies below it.
bool Within(const std::string& inner, const std::string& outer) {
  std::string i = Canonical(inner), o = Canonical(outer);
  while (o.size() > 1 && o.back() == '/') o.pop_back();
  return i == o || (i.size() > o.size() && i.compare(0, o.size(), o) == 0 && i[o.size()] == '/');
}

// Puts the complete export `staging` in place of `dst`: atomically (an exchange) where the file
// system can, else by renaming the old export aside first. Removes the old one afterwards.
Status InstallExport(storage::FileSystem& fs, const std::string& staging, const std::string& dst,
                     bool dst_exists, const std::string& aside) {
  const std::string parent = std::filesystem::path(dst).parent_path().string();
  const std::string parent_dir = parent.empty() ? "." : parent;
  DCP_RETURN_IF_ERROR(fs.SyncDir(staging));
  if (!dst_exists) {
    DCP_RETURN_IF_ERROR(fs.Rename(staging, dst));
    return fs.SyncDir(parent_dir);
  }
  if (fs.Exchange(staging, dst).ok()) {
    DCP_RETURN_IF_ERROR(fs.SyncDir(parent_dir));
    (void)fs.RemoveTree(staging);  // now the old export
    return OkStatus();
  }
  // No exchange: a crash between these two renames leaves the old export at `aside`, intact.
  DCP_RETURN_IF_ERROR(fs.Rename(dst, aside));
  Status st = fs.Rename(staging, dst);
  if (!st.ok()) {
    (void)fs.Rename(aside, dst);
    return st;
  }
  DCP_RETURN_IF_ERROR(fs.SyncDir(parent_dir));
  (void)fs.RemoveTree(aside);
  return OkStatus();
}

}  // namespace

namespace {

// The header, then the tensors loaded group by group (WriteLoadedTensors).
Status WriteLoadedInto(storage::WritableFile& file, const std::string& src,
                       const std::string& header, const std::vector<OutTensor>& tensors,
                       const std::vector<size_t>& order, uint64_t buffer_bytes,
                       const std::function<void(uint64_t bytes, uint64_t tensors)>& progress,
                       storage::FileSystem& src_fs, std::vector<std::byte>& buffer) {
  DCP_RETURN_IF_ERROR(file.Append(std::as_bytes(std::span(header.data(), header.size()))));
  uint64_t done_bytes = 0;
  for (size_t i = 0; i < order.size();) {
    // A group: consecutive tensors up to the budget, at least one.
    uint64_t group_bytes = 0;
    size_t j = i;
    while (j < order.size() && (j == i || group_bytes + tensors[order[j]].bytes <= buffer_bytes)) {
      group_bytes += tensors[order[j]].bytes;
      ++j;
    }
    // Grown to the largest group, never shrunk: no zero-filling pass over fresh memory
    // beyond the first use.
    if (buffer.size() < std::max<uint64_t>(group_bytes, 1))
      buffer.resize(std::max<uint64_t>(group_bytes, 1));
    StateDict sd;
    uint64_t pos = 0;
    for (size_t k = i; k < j; ++k) {
      const OutTensor& t = tensors[order[k]];
      sd.add(t.fqn, TensorView{buffer.data() + pos, t.dtype, t.shape});
      pos += t.bytes;
    }
    auto loaded = checkpoint::Load(sd, src, LoadOptions{}, src_fs);
    if (!loaded.ok()) return loaded.status();
    DCP_RETURN_IF_ERROR(file.Append(std::span<const std::byte>(buffer.data(), group_bytes)));
    done_bytes += group_bytes;
    if (progress) progress(done_bytes, j);
    i = j;
  }
  DCP_RETURN_IF_ERROR(file.Sync());
  return file.Close();
}

}  // namespace

Status WriteLoadedTensors(const std::string& src, const std::string& path,
                          const std::string& header, const std::vector<OutTensor>& tensors,
                          const std::vector<size_t>& order, uint64_t buffer_bytes,
                          const std::function<void(uint64_t bytes, uint64_t tensors)>& progress,
                          storage::FileSystem& src_fs, storage::FileSystem& fs,
                          std::vector<std::byte>& buffer) {
  const std::string tmp = path + ".tmp";
  DCP_ASSIGN_OR_RETURN(auto file, fs.NewWritableFile(tmp));
  Status st =
      WriteLoadedInto(*file, src, header, tensors, order, buffer_bytes, progress, src_fs, buffer);
  if (st.ok()) st = fs.Rename(tmp, path);
  if (!st.ok()) (void)fs.Remove(tmp);  // a failed write leaves nothing behind
  return st;
}

std::vector<int> AssignFiles(const std::vector<uint64_t>& file_bytes, int world) {
  std::vector<size_t> order(file_bytes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return file_bytes[a] > file_bytes[b]; });
  std::vector<uint64_t> load(std::max(world, 1), 0);
  std::vector<int> owner(file_bytes.size(), 0);
  for (size_t f : order) {
    int best = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[f] = best;
    load[best] += file_bytes[f];
  }
  return owner;
}

Result<HfToDcpResult> HfToDcp(const std::string& src, const std::string& dst,
                              const HfToDcpOptions& opts, storage::FileSystem& fs,
                              storage::FileSystem* dst_fs) {
  storage::FileSystem& out = dst_fs ? *dst_fs : fs;
  const auto t0 = Clock::now();
  std::shared_ptr<Comm> comm = opts.comm ? opts.comm : LocalComm();
  HfToDcpResult result;
  // Every rank opens (and checks) the whole source, so all agree on the file assignment.
  auto source = hf::OpenSource(fs, src);
  DCP_RETURN_IF_ERROR(AgreeOnStatus(*comm, source.status()));
  result.total_bytes = source->TotalTensorBytes();
  {
    std::set<std::string> keys;
    for (const hf::ShardFile& f : source->files) {
      for (const auto& [k, v] : f.header.metadata) {
        // The sharding keys are read (each chunk goes where they place it), not dropped.
        if (k != "format" && k != hf::kShardingInfoKey && k != hf::kShardingVersionKey) {
          keys.insert(k);
        }
      }
    }
    result.dropped_metadata_keys.assign(keys.begin(), keys.end());
  }
  std::vector<uint64_t> sizes;
  for (const hf::ShardFile& f : source->files) sizes.push_back(f.size);
  // A tensor stored in chunks (torch's shard files) is saved as those chunks of its whole shape.
  std::unordered_map<std::string, Shape> whole;
  for (const metadata::TensorMeta& t : hf::ToMetadata(*source).tensors)
    whole[t.fqn] = t.global_shape;
  const std::vector<int> owner = AssignFiles(sizes, comm->size());

  std::vector<std::unique_ptr<SourceMapping>> maps;
  StateDict sd;
  Status st;
  for (size_t i = 0; i < source->files.size() && st.ok(); ++i) {
    if (owner[i] != comm->rank()) continue;
    const hf::ShardFile& f = source->files[i];
    auto m = SourceMapping::Open(storage::JoinPath(source->data_dir, f.name), f.size);
    if (!m.ok()) {
      st = m.status();
      break;
    }
    // Saving only reads what the views point to.
    auto* data = const_cast<std::byte*>((*m)->data()) + f.header.data_start();
    for (size_t k = 0; k < f.header.tensors.size(); ++k) {
      const hf::HeaderTensor& t = f.header.tensors[k];
      sd.add(t.name, TensorView{data + t.begin, t.dtype, t.shape},
             Chunk{whole.at(t.name), f.offsets[k]});
      ++result.tensors;
      result.bytes += t.end - t.begin;
    }
    maps.push_back(std::move(m).value());
    ++result.files;
  }
  DCP_RETURN_IF_ERROR(AgreeOnStatus(*comm, st));
  if (opts.on_start) opts.on_start(result.total_bytes, result.bytes);
  // The mappings stay until the save returned. A source that shrank meanwhile was read in
  // part as zeros: that checkpoint is not the model, so the save must not commit it (a
  // checkpoint already in dst stays as it was).
  checkpoint::SaveHooks hooks;
  hooks.before_commit = [&maps]() -> Status {
    for (const auto& m : maps) DCP_RETURN_IF_ERROR(m->Check());
    return OkStatus();
  };
  auto saved = checkpoint::Save(sd, dst, SaveOptions{.comm = comm}, out, &hooks);
  if (!saved.ok()) return saved.status();
  result.save = std::move(saved).value();
  result.seconds = Since(t0);
  return result;
}

std::vector<OutShard> PlanShards(const std::vector<OutTensor>& tensors, uint64_t max_shard_bytes) {
  std::vector<OutShard> shards;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (shards.empty() || (!shards.back().tensors.empty() &&
                           shards.back().bytes + tensors[i].bytes > max_shard_bytes)) {
      shards.emplace_back();
    }
    shards.back().tensors.push_back(i);
    shards.back().bytes += tensors[i].bytes;
  }
  for (size_t s = 0; s < shards.size(); ++s) {
    shards[s].file = ShardName(s, shards.size());
    std::stable_sort(shards[s].tensors.begin(), shards[s].tensors.end(), [&](size_t a, size_t b) {
      return DTypeBits(tensors[a].dtype) > DTypeBits(tensors[b].dtype);
    });
  }
  return shards;
}

Result<DcpToHfResult> DcpToHf(const std::string& src, const std::string& dst,
                              const DcpToHfOptions& opts, storage::FileSystem& fs,
                              const std::function<void(size_t index)>& after_shard,
                              storage::FileSystem* src_fs) {
  storage::FileSystem& in = src_fs ? *src_fs : fs;
  const auto t0 = Clock::now();
  std::shared_ptr<Comm> comm = opts.comm ? opts.comm : LocalComm();
  const int rank = comm->rank(), world = comm->size();
  DcpToHfResult result;

  // Every rank reads the metadata once and plans the same shards; every later load is checked
  // against these bytes (CheckSourceUnchanged).
  auto md = checkpoint::ReadMetadata(in, src);
  DCP_RETURN_IF_ERROR(AgreeOnStatus(*comm, md.status()));
  const std::string encoded = metadata::Encode(*md);
  std::vector<OutTensor> tensors;
  Status st;
  for (const metadata::TensorMeta& t : md->tensors) {
    auto bytes = DTypeBytes(t.dtype, t.global_shape.NumElements().value_or(0));
    if (!bytes) {
      st = InvalidArgument("checkpoint " + src + ": tensor '" + t.fqn + "' of shape " +
                           t.global_shape.ToString() + " and dtype " +
                           std::string(DTypeName(t.dtype)) +
                           " does not fill whole bytes, which safetensors cannot store");
      break;
    }
    tensors.push_back({t.fqn, t.dtype, t.global_shape, *bytes});
    result.total_bytes += *bytes;
  }
  for (const metadata::BytesMeta& b : md->bytes) result.skipped_bytes_entries.push_back(b.fqn);
  result.total_tensors = tensors.size();
  // The destination: refused when it holds anything unless opts.overwrite; the export is
  // written into a hidden sibling directory and put in place only when complete, so a killed or
  // failed export leaves the previous export (or nothing), never a mix. Rank 0 decides.
  bool dst_exists = false;
  std::string staging, aside;
  if (st.ok() && rank == 0) {
    auto entries = fs.List(dst);
    dst_exists = entries.ok();
    if (Within(src, dst)) {
      st = InvalidArgument("destination " + dst + " is (or contains) the source checkpoint " + src +
                           "; export to another directory");
    } else if (!entries.ok() && entries.status().code() != StatusCode::kNotFound) {
      st = FailedPrecondition("destination " + dst + " exists and cannot be listed as a " +
                              "directory (" + entries.status().message() + ")");
    } else if (entries.ok() && !entries->empty() && !opts.overwrite) {
      st = FailedPrecondition("destination " + dst + " is not empty (it holds " +
                              std::to_string(entries->size()) + " entries, e.g. '" +
                              entries->front() +
                              "'); pass --overwrite (DcpToHfOptions::overwrite) to replace it");
    }
    if (st.ok()) {
      std::filesystem::path p = std::filesystem::path(dst).lexically_normal();
      if (p.filename().empty()) p = p.parent_path();
      const std::string tag = "." + p.filename().string() + ".dcp-export-" +
                              std::to_string(::getpid()) + "-" +
                              std::to_string(Clock::now().time_since_epoch().count());
      staging = (p.parent_path() / tag).string();
      aside = staging + "-old";
      if (!p.parent_path().empty()) st = fs.CreateDirs(p.parent_path().string());
      if (st.ok()) st = fs.CreateDirs(staging);
    }
  }
  DCP_RETURN_IF_ERROR(AgreeOnStatus(*comm, st));
  {
    std::string shared = staging;
    DCP_RETURN_IF_ERROR(comm->Broadcast(shared, 0));
    staging = shared;
  }
  auto abandon = [&](Status failed) {
    if (rank == 0) (void)fs.RemoveTree(staging);
    return failed;
  };

  const std::vector<OutShard> shards = PlanShards(tensors, opts.max_shard_bytes);
  result.shards_total = shards.size();
  if (opts.on_start) {
    uint64_t my_bytes = 0, my_tensors = 0;
    for (size_t s = rank; s < shards.size(); s += world) {
      my_bytes += shards[s].bytes;
      my_tensors += shards[s].tensors.size();
    }
    opts.on_start(my_bytes, my_tensors);
  }
  std::vector<std::byte> buffer;
  for (size_t s = 0; s < shards.size() && st.ok(); ++s) {
    if (static_cast<int>(s % world) != rank) continue;
    st = WriteShard(src, staging, tensors, shards[s], opts, in, fs, buffer, &result);
    if (st.ok()) st = CheckSourceUnchanged(in, src, encoded);
    if (st.ok() && after_shard) after_shard(s);
  }
  buffer = {};
  st = AgreeOnStatus(*comm, st);  // every shard is complete past this point
  if (!st.ok()) return abandon(st);

  if (rank == 0 && shards.size() > 1) {
    nlohmann::json index;
    index["metadata"] = {{"total_size", result.total_bytes}};
    index["weight_map"] = nlohmann::json::object();
    for (const OutShard& shard : shards) {
      for (size_t i : shard.tensors) index["weight_map"][tensors[i].fqn] = shard.file;
    }
    st = fs.WriteAtomic(storage::JoinPath(staging, std::string(hf::kIndexFileName)),
                        index.dump(2) + "\n", ".tmp");
  }
  // Every rank's loads are done: one last look at the source, then the swap.
  if (st.ok() && rank == 0) st = CheckSourceUnchanged(in, src, encoded);
  if (st.ok() && rank == 0) st = InstallExport(fs, staging, dst, dst_exists, aside);
  st = AgreeOnStatus(*comm, st);
  if (!st.ok()) return abandon(st);
  result.seconds = Since(t0);
  return result;
}

}  // namespace convert

Result<uint64_t> ParseByteSize(std::string_view text) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
  }
  size_t n = 0;
  while (n < s.size() && (std::isdigit(static_cast<unsigned char>(s[n])) || s[n] == '.')) ++n;
  std::string unit = s.substr(n);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},           {"K", 1e3},           {"M", 1e6},
      {"G", 1e9},        {"T", 1e12},          {"KI", 1024},
      {"MI", 1048576.0}, {"GI", 1073741824.0}, {"TI", 1099511627776.0}};
  double scale = 0;
  for (const auto& [name, f] : kUnits) {
    if (unit == name) scale = f;
  }
  double value = 0;
  bool number_ok = n > 0 && std::count(s.begin(), s.begin() + n, '.') <= 1 &&
                   std::sscanf(s.substr(0, n).c_str(), "%lf", &value) == 1;
  double bytes = std::floor(value * scale);
  if (!number_ok || scale == 0 || !(bytes >= 1) || bytes > 1.8e19) {
    return InvalidArgument("bad size '" + std::string(text) +
                           "' (expected e.g. 5GB, 500MB, 2GiB or a byte count)");
  }
  return static_cast<uint64_t>(bytes);
}

namespace {

// A HuggingFace side is local: a source is mapped into memory, an export is written into a
// staging directory renamed into place (object stores have neither). The dcp side may be
// anywhere a checkpoint may be.
Status HfSideLocal(const std::string& hf_path, const char* role) {
  if (!storage::IsObjectStorePath(hf_path)) return OkStatus();
  return InvalidArgument(std::string("convert: the HuggingFace ") + role + " " + hf_path +
                         " must be a local path (safetensors files are mapped or written in "
                         "place); the dcp checkpoint may be on s3://");
}

}  // namespace

HfToDcpResult convert_hf_to_dcp(const std::string& src, const std::string& dst,
                                const HfToDcpOptions& opts) {
  ThrowIfError(HfSideLocal(src, "source"));
  storage::FileSystem* out = ValueOrThrow(storage::FileSystemFor(dst));
  return ValueOrThrow(convert::HfToDcp(src, dst, opts, storage::PosixFileSystem(), out));
}

DcpToHfResult convert_dcp_to_hf(const std::string& src, const std::string& dst,
                                const DcpToHfOptions& opts) {
  ThrowIfError(HfSideLocal(dst, "destination"));
  storage::FileSystem* in = ValueOrThrow(storage::FileSystemFor(src));
  return ValueOrThrow(convert::DcpToHf(src, dst, opts, storage::PosixFileSystem(), {}, in));
}

}  // namespace dcp
