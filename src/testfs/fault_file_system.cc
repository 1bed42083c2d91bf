#include "testfs/fault_file_system.h"

#include <unistd.h>

namespace dcp::testfs {
namespace {

class FaultWritableFile final : public storage::WritableFile {
 public:
  FaultWritableFile(FaultFileSystem& fs, std::unique_ptr<storage::WritableFile> base)
      : fs_(fs), base_(std::move(base)) {}
  Status Append(std::span<const std::byte> data) override {
    DCP_RETURN_IF_ERROR(fs_.Tick("write", path()));
    DCP_RETURN_IF_ERROR(base_->Append(data));
    written_ += data.size();
    return OkStatus();
  }
  Status Sync() override {
    DCP_RETURN_IF_ERROR(fs_.Tick("fdatasync", path()));
    DCP_RETURN_IF_ERROR(base_->Sync());
    fs_.RecordSynced(path(), written_);
    return OkStatus();
  }
  Status Close() override {
    DCP_RETURN_IF_ERROR(fs_.Tick("close", path()));
    return base_->Close();
  }
  const std::string& path() const override { return base_->path(); }

 private:
  FaultFileSystem& fs_;
  std::unique_ptr<storage::WritableFile> base_;
  uint64_t written_ = 0;
};

}  // namespace

Status FaultFileSystem::Tick(const char* op, const std::string& path) {
  std::lock_guard lock(mu_);
  int64_t n = ops_++;
  if (fail_at_ >= 0 && n >= fail_at_) {
    return Unavailable(std::string("injected failure: ") + op + " " + path);
  }
  return OkStatus();
}

void FaultFileSystem::RecordSynced(const std::string& path, uint64_t length) {
  std::lock_guard lock(mu_);
  synced_[path] = length;
}

void FaultFileSystem::SimulateCrash() {
  std::lock_guard lock(mu_);
  for (const auto& [path, length] : synced_) {
    auto size = base_.FileSize(path);
    if (size.ok() && *size > length) (void)::truncate(path.c_str(), static_cast<off_t>(length));
  }
}

Result<std::unique_ptr<storage::WritableFile>> FaultFileSystem::NewWritableFile(
    const std::string& path) {
  DCP_RETURN_IF_ERROR(Tick("create", path));
  DCP_ASSIGN_OR_RETURN(auto base, base_.NewWritableFile(path));
  RecordSynced(path, 0);
  return std::unique_ptr<storage::WritableFile>(new FaultWritableFile(*this, std::move(base)));
}

Result<std::unique_ptr<storage::WritableFile>> FaultFileSystem::NewExclusiveFile(
    const std::string& path) {
  DCP_RETURN_IF_ERROR(Tick("create", path));
  DCP_ASSIGN_OR_RETURN(auto base, base_.NewExclusiveFile(path));
  RecordSynced(path, 0);
  return std::unique_ptr<storage::WritableFile>(new FaultWritableFile(*this, std::move(base)));
}

Result<std::unique_ptr<storage::WritableFile>> FaultFileSystem::ReuseFile(
    const std::string& old_path, const std::string& path) {
  DCP_RETURN_IF_ERROR(Tick("recycle", old_path));
  DCP_ASSIGN_OR_RETURN(auto base, base_.ReuseFile(old_path, path));
  {
    // Overwritten in place: a crash before the sync leaves old and new bytes mixed, at the
    // old length (not cut back).
    std::lock_guard lock(mu_);
    synced_.erase(old_path);
    synced_.erase(path);
  }
  return std::unique_ptr<storage::WritableFile>(new FaultWritableFile(*this, std::move(base)));
}

Status FaultFileSystem::Rename(const std::string& from, const std::string& to) {
  DCP_RETURN_IF_ERROR(Tick("rename", from));
  DCP_RETURN_IF_ERROR(base_.Rename(from, to));
  std::lock_guard lock(mu_);
  if (auto it = synced_.find(from); it != synced_.end()) {
    synced_[to] = it->second;
    synced_.erase(it);
  }
  return OkStatus();
}

Status FaultFileSystem::SyncDir(const std::string& dir) {
  DCP_RETURN_IF_ERROR(Tick("fsync directory", dir));
  return base_.SyncDir(dir);
}

Status FaultFileSystem::Remove(const std::string& path) {
  DCP_RETURN_IF_ERROR(Tick("remove", path));
  return base_.Remove(path);
}

Status FaultFileSystem::CreateDirs(const std::string& dir) {
  DCP_RETURN_IF_ERROR(Tick("mkdir", dir));
  return base_.CreateDirs(dir);
}

}  // namespace dcp::testfs
