// Fuzz target: a whole checkpoint (metadata and data files) loaded and verified. Any input
// must load, or fail with a Status; never crash, hang or throw; and no single allocation
// during the load or verify may exceed a bound derived from the real sizes of the files
// (issue 19 item 4: sizes come from the files, never from the metadata alone).
//
// Input: byte 0 = flags (bit 0: the metadata part is a body to seal with a correct header, as
// in metadata_fuzz; bit 1: load with allow_partial; bit 2: without checksums), then a
// little-endian u32 length M, M bytes of metadata, and the data: file i of the metadata gets
// the next min(its recorded size, what is left) bytes, the last file whatever remains, so
// sizes that disagree with the metadata are explored too. Seeds (fuzz/corpus/checkpoint/)
// are real one-rank checkpoints packed this way (scripts/fuzz_seeds.py).
#include <sanitizer/allocator_interface.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/load.h"
#include "checkpoint/verify.h"
#include "metadata/codec.h"
#include "storage/file_system.h"

namespace {

using dcp::Result;
using dcp::Status;

std::atomic<bool> g_counting{false};
std::atomic<size_t> g_largest{0};

void OnMalloc(const volatile void*, size_t size) {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  size_t seen = g_largest.load(std::memory_order_relaxed);
  while (size > seen && !g_largest.compare_exchange_weak(seen, size)) {
  }
}
void OnFree(const volatile void*) {}

// Files in memory, read-only: all a load and a verify need.
class MemoryFileSystem final : public dcp::storage::FileSystem {
 public:
  std::map<std::string, std::string> files;

  class File final : public dcp::storage::ReadableFile {
   public:
    File(const std::string& data, std::string path) : data_(data), path_(std::move(path)) {}
    Status ReadAt(uint64_t offset, std::span<std::byte> dst) override {
      if (offset > data_.size() || dst.size() > data_.size() - offset) {
        return dcp::DataLoss("file " + path_ + " is truncated");
      }
      std::memcpy(dst.data(), data_.data() + offset, dst.size());
      return dcp::OkStatus();
    }
    uint64_t size() const override { return data_.size(); }
    const std::string& path() const override { return path_; }

   private:
    const std::string& data_;
    std::string path_;
  };

  Result<std::unique_ptr<dcp::storage::WritableFile>> NewWritableFile(
      const std::string& p) override {
    return dcp::FailedPrecondition("read-only: " + p);
  }
  Result<std::unique_ptr<dcp::storage::ReadableFile>> OpenReadable(const std::string& p) override {
    auto it = files.find(p);
    if (it == files.end()) return dcp::NotFound(p + " does not exist");
    return std::unique_ptr<dcp::storage::ReadableFile>(new File(it->second, p));
  }
  Status Rename(const std::string& a, const std::string&) override {
    return dcp::FailedPrecondition("read-only: " + a);
  }
  Status SyncDir(const std::string&) override { return dcp::OkStatus(); }
  Status Remove(const std::string& p) override {
    return dcp::FailedPrecondition("read-only: " + p);
  }
  Status CreateDirs(const std::string&) override { return dcp::OkStatus(); }
  Result<std::vector<std::string>> List(const std::string& dir) override {
    std::vector<std::string> names;
    for (const auto& [path, _] : files) {
      if (path.rfind(dir + "/", 0) == 0) names.push_back(path.substr(dir.size() + 1));
    }
    return names;
  }
  Result<uint64_t> FileSize(const std::string& p) override {
    auto it = files.find(p);
    if (it == files.end()) return dcp::NotFound(p + " does not exist");
    return it->second.size();
  }
};

std::string Seal(std::string_view body, uint32_t flags) {
  std::string out(dcp::metadata::kHeaderSize, '\0');
  auto put = [&](size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out[at + i] = static_cast<char>(v >> (8 * i));
  };
  std::memcpy(out.data(), dcp::metadata::kMagic, sizeof(dcp::metadata::kMagic));
  put(8, dcp::metadata::kFormatVersion, 4);
  put(12, flags, 4);
  put(16, body.size(), 8);
  put(24, dcp::metadata::SealHash(out, body, dcp::metadata::kFormatVersion), 8);
  out.append(body);
  return out;
}

// The load's destination: every tensor whole (when all of them fit 1 MiB) and every bytes
// entry, as a caller who read the metadata first would build it.
struct Destination {
  std::vector<std::vector<std::byte>> buffers;
  dcp::StateDict sd;
  uint64_t bytes = 0;
};

void Build(const dcp::Metadata& md, Destination* d) {
  constexpr uint64_t kBudget = 1 << 20;
  std::vector<uint64_t> sizes;
  for (const auto& t : md.tensors) {
    const auto n = t.global_shape.NumElements();
    if (!n || *n > kBudget) return;
    sizes.push_back(*n * static_cast<uint64_t>(dcp::DTypeBits(t.dtype)) / 8);
    d->bytes += sizes.back();
    if (d->bytes > kBudget) return;
  }
  for (size_t i = 0; i < md.tensors.size(); ++i) {
    auto& buf = d->buffers.emplace_back(sizes[i] + 1);
    d->sd.add(md.tensors[i].fqn,
              dcp::TensorView(buf.data(), md.tensors[i].dtype, md.tensors[i].global_shape));
  }
  for (const auto& b : md.bytes) d->sd.add_bytes(b.fqn);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  __sanitizer_install_malloc_and_free_hooks(OnMalloc, OnFree);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const uint8_t flags = data[0];
  uint32_t m = 0;
  std::memcpy(&m, data + 1, 4);
  std::string_view rest(reinterpret_cast<const char*>(data) + 5, size - 5);
  if (m > rest.size()) return 0;
  std::string meta(rest.substr(0, m));
  if (flags & 1) meta = Seal(meta, 0);
  std::string_view blob = rest.substr(m);

  const std::string dir = "/ckpt";
  MemoryFileSystem fs;
  fs.files[dir + "/dcp.metadata"] = meta;
  auto md = dcp::metadata::Decode(meta);
  Destination dest;
  if (md.ok()) {
    for (size_t i = 0; i < md->files.size() && i < 64; ++i) {
      const bool last = i + 1 == md->files.size() || i == 63;
      const size_t take = last ? blob.size() : std::min<uint64_t>(md->files[i].size, blob.size());
      if (md->files[i].name.find('/') != std::string::npos) continue;
      fs.files[dir + "/" + md->files[i].name] = std::string(blob.substr(0, take));
      blob.remove_prefix(take);
    }
    Build(*md, &dest);
  }
  // The bound: every file's real size, the destination, and room for fixed-size buffers.
  uint64_t real = 0;
  for (const auto& [_, f] : fs.files) real += f.size();
  const uint64_t bound = 4 * real + dest.bytes + (8u << 20);

  dcp::LoadOptions opts;
  opts.allow_partial = (flags & 2) != 0;
  opts.verify_checksums = (flags & 4) == 0;
  g_largest = 0;
  g_counting = true;
  try {
    auto loaded = dcp::checkpoint::Load(dest.sd, dir, opts, fs);
    auto verified = dcp::checkpoint::Verify(fs, dir);
    if (std::getenv("CHECKPOINT_FUZZ_VERBOSE")) {  // what a seed reaches
      std::fprintf(stderr, "load: %s\nverify: %s\nlargest allocation: %zu bytes (bound %llu)\n",
                   loaded.status().ToString().c_str(), verified.status().ToString().c_str(),
                   g_largest.load(), static_cast<unsigned long long>(bound));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_fuzz: exception escaped: %s\n", e.what());
    std::abort();
  }
  g_counting = false;
  if (g_largest > bound) {
    std::fprintf(stderr, "checkpoint_fuzz: an allocation of %zu bytes; the files hold %llu\n",
                 g_largest.load(), static_cast<unsigned long long>(real));
    std::abort();
  }
  return 0;
}
