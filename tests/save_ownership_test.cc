// A save owns the files it creates and nothing else (issue 11, items 1, 2, 5, 12): concurrent
// saves into one directory, ranks that see different directories, full disks, and missing
// directories.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "checkpoint/load.h"
#include "checkpoint/metadata_io.h"
#include "checkpoint/names.h"
#include "checkpoint/save.h"
#include "checkpoint/save_lock.h"
#include "core/host_name.h"
#include "dcp/checkpoint.h"
#include "storage/lease_lock.h"
#include "test_util.h"
#include "testfs/forwarding_file_system.h"

namespace dcp {
namespace {

using testing::TempDir;

// One f32 tensor "w" of `n` elements, every element `value`.
struct OneTensor {
  std::vector<float> data;
  StateDict sd;
  OneTensor(size_t n, float value) : data(n, value) {
    sd.add("w", TensorView(data.data(), DType::kF32, Shape{static_cast<int64_t>(n)}));
  }
};

// Loads "w" of `n` elements from `dir`; the value of its first element, or the error.
Result<float> LoadValue(const std::string& dir, size_t n) {
  OneTensor t(n, -1.0f);
  auto r = checkpoint::Load(t.sd, dir, {}, storage::PosixFileSystem());
  if (!r.ok()) return r.status();
  for (float v : t.data) {
    if (v != t.data[0]) return DataLoss("mixed values loaded");
  }
  return t.data[0];
}

std::vector<std::string> DataFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& n : testing::ListFiles(dir)) {
    if (checkpoint::IsDcpDataFileName(n)) out.push_back(n);
  }
  return out;
}

std::string LockPath(const std::string& dir) {
  return dir + "/" + std::string(checkpoint::kLockName);
}

// A save lock as another save would leave it; times relative to now, in seconds.
void WriteLock(const std::string& dir, const std::string& host, int64_t pid,
               int64_t started_ago_s = 0, int64_t renewed_ago_s = 0) {
  std::filesystem::create_directories(dir);
  const int64_t now = storage::NowUnixMs();
  std::ofstream(LockPath(dir)) << storage::EncodeLockHolder({"save", "00000000000000aa", host, pid,
                                                             now - started_ago_s * 1000,
                                                             now - renewed_ago_s * 1000});
}

// A child process that holds `path`'s kernel lock (as a live save does) until killed.
pid_t HoldKernelLockInChild(const std::string& path) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  pid_t child = ::fork();
  if (child == 0) {
    int fd = ::open(path.c_str(), O_RDWR);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(1);
    char c = 1;
    (void)!::write(ready[1], &c, 1);
    for (;;) ::pause();
  }
  char c = 0;
  (void)!::read(ready[0], &c, 1);
  ::close(ready[0]);
  ::close(ready[1]);
  return child;
}

// Passes everything to the real file system, but the first Append to a data file waits at
// a gate until the test opens it.
class GatedFileSystem final : public testfs::ForwardingFileSystem {
 public:
  class File final : public storage::WritableFile {
   public:
    File(GatedFileSystem& fs, std::unique_ptr<storage::WritableFile> base)
        : fs_(fs), base_(std::move(base)) {}
    Status Append(std::span<const std::byte> d) override {
      if (checkpoint::IsDcpDataFileName(std::filesystem::path(path()).filename().string())) {
        fs_.WaitAtGate();
      }
      return base_->Append(d);
    }
    Status Sync() override { return base_->Sync(); }
    Status Close() override { return base_->Close(); }
    const std::string& path() const override { return base_->path(); }

   private:
    GatedFileSystem& fs_;
    std::unique_ptr<storage::WritableFile> base_;
  };
  Result<std::unique_ptr<storage::WritableFile>> NewWritableFile(const std::string& p) override {
    DCP_ASSIGN_OR_RETURN(auto f, base().NewWritableFile(p));
    return std::unique_ptr<storage::WritableFile>(new File(*this, std::move(f)));
  }

  void WaitAtGate() {
    std::unique_lock lock(mu_);
    if (passed_) return;
    reached_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    passed_ = true;
  }
  void WaitUntilReached() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return reached_; });
  }
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false, open_ = false, passed_ = false;
};

// Issue 11 item 1: a second save into a directory while the first is writing is refused,
// naming the directory and the holder; the first completes and its checkpoint loads. (Before
// the lock, both returned OK and the second deleted the first's files.)
TEST(SaveOwnership, ConcurrentSaveIntoOneDirectoryIsRefused) {
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  GatedFileSystem gated;
  OneTensor a(1000, 1.0f), b(1000, 2.0f);
  Status a_status;
  std::thread first([&] { a_status = checkpoint::Save(a.sd, dir, {}, gated).status(); });
  gated.WaitUntilReached();  // the first save is writing its data file
  auto second = checkpoint::Save(b.sd, dir, {}, storage::PosixFileSystem());
  gated.Open();
  first.join();
  ASSERT_FALSE(second.ok()) << "a second concurrent save into one directory succeeded";
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  const std::string msg = second.status().message();
  EXPECT_NE(msg.find(dir), std::string::npos) << msg;
  EXPECT_NE(msg.find("in use by"), std::string::npos) << msg;
  EXPECT_NE(msg.find("process " + std::to_string(::getpid())), std::string::npos) << msg;
  ASSERT_TRUE(a_status.ok()) << a_status.ToString();
  auto v = LoadValue(dir, 1000);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 1.0f);
  EXPECT_FALSE(std::filesystem::exists(LockPath(dir))) << "the lock outlived its save";
}

// A lock held by a live process of this host is respected; once that process is gone the
// lock is stale and the next save takes it over and removes the dead save's files.
TEST(SaveOwnership, LockOfLiveProcessIsRespectedAndOfDeadProcessTakenOver) {
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  OneTensor t(100, 3.0f);
  const uint64_t dead_id = 0x1234abcd5678ef00ULL;
  WriteLock(dir, HostName(), 4242);
  pid_t child = HoldKernelLockInChild(LockPath(dir));  // a live "other save" until killed
  ASSERT_GT(child, 0);
  // The other save's partial data file.
  std::ofstream(dir + "/" + checkpoint::DataFileName(dead_id, 0)) << "partial";
  auto refused = checkpoint::Save(t.sd, dir, {}, storage::PosixFileSystem());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("process 4242"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("is alive"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(DataFiles(dir).size(), 1u) << "a refused save touched the holder's files";

  ::kill(child, SIGKILL);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  auto r = checkpoint::Save(t.sd, dir, {}, storage::PosixFileSystem());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto v = LoadValue(dir, 100);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 3.0f);
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + checkpoint::DataFileName(dead_id, 0)))
      << "the dead save's file was left behind";
  EXPECT_FALSE(std::filesystem::exists(LockPath(dir)));
}

// Another host's processes cannot be checked: its lock is respected while its lease is
// renewed, and reported with its age and how to proceed.
TEST(SaveOwnership, LockOfAnotherHostIsRespectedWithItsAge) {
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  WriteLock(dir, "some-other-host", 4242, /*started_ago_s=*/3600, /*renewed_ago_s=*/10);
  OneTensor t(10, 1.0f);
  auto r = checkpoint::Save(t.sd, dir, {}, storage::PosixFileSystem());
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().message();
  EXPECT_NE(msg.find("host some-other-host"), std::string::npos) << msg;
  EXPECT_NE(msg.find("process 4242"), std::string::npos) << msg;
  EXPECT_NE(msg.find(" s ago"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("started 0 s ago"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dcp unlock " + LockPath(dir)), std::string::npos) << msg;
}

// Issue 19 item 1: a holder of another host that stopped renewing its lease is gone: the next
// save breaks its lock and says whose it was; break_lock takes a lock whose lease still runs.
TEST(SaveOwnership, ExpiredLeaseOfAnotherHostIsBrokenWithAWarning) {
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  // Its heartbeat is old by this clock, but clocks of two hosts may differ: broken once the
  // file went a whole lease (1 s here) unchanged as watched from this host.
  WriteLock(dir, "some-other-host", 4242, 4000, /*renewed_ago_s=*/400);
  OneTensor t(10, 4.0f);
  ::testing::internal::CaptureStderr();
  auto r = checkpoint::Save(t.sd, dir, {.lock_lease_seconds = 1}, storage::PosixFileSystem());
  const std::string warned = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(warned.find("process 4242 on host some-other-host"), std::string::npos) << warned;
  EXPECT_NE(warned.find("lease of 1 s expired (unchanged for 1 s as watched"), std::string::npos)
      << warned;

  WriteLock(dir, "some-other-host", 4243, 10, /*renewed_ago_s=*/1);
  EXPECT_FALSE(checkpoint::Save(t.sd, dir, {}, storage::PosixFileSystem()).ok());
  EXPECT_FALSE(
      checkpoint::Save(t.sd, dir, {.lock_lease_seconds = 60}, storage::PosixFileSystem()).ok());
  ::testing::internal::CaptureStderr();
  auto broken = checkpoint::Save(t.sd, dir, {.break_lock = true}, storage::PosixFileSystem());
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(broken.ok()) << broken.status().ToString();
  EXPECT_NE(said.find("process 4243"), std::string::npos) << said;
  EXPECT_FALSE(std::filesystem::exists(LockPath(dir)));
}

// Three saves into one directory at once: exactly one proceeds, the other two fail naming
// the holder, and the one that proceeded loads.
TEST(SaveOwnership, ThreeConcurrentSavesOneProceeds) {
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  GatedFileSystem gated;
  OneTensor a(1000, 1.0f), b(1000, 2.0f), c(1000, 3.0f);
  Status first_status;
  std::thread first([&] { first_status = checkpoint::Save(a.sd, dir, {}, gated).status(); });
  gated.WaitUntilReached();
  Status others[2];
  std::thread second(
      [&] { others[0] = checkpoint::Save(b.sd, dir, {}, storage::PosixFileSystem()).status(); });
  std::thread third(
      [&] { others[1] = checkpoint::Save(c.sd, dir, {}, storage::PosixFileSystem()).status(); });
  second.join();
  third.join();
  gated.Open();
  first.join();
  ASSERT_TRUE(first_status.ok()) << first_status.ToString();
  for (const Status& s : others) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("process " + std::to_string(::getpid())), std::string::npos)
        << s.message();
  }
  auto v = LoadValue(dir, 1000);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 1.0f);
}

// A lock removed while its save writes (a person ran `dcp unlock`, or another host broke an
// expired lease): the save commits nothing and says so; the previous checkpoint stays.
TEST(SaveOwnership, ASaveWhoseLockWasRemovedCommitsNothing) {
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  OneTensor old(1000, 7.0f), fresh(1000, 8.0f);
  ASSERT_TRUE(checkpoint::Save(old.sd, dir, {}, storage::PosixFileSystem()).ok());
  GatedFileSystem gated;
  Status st;
  std::thread saver([&] { st = checkpoint::Save(fresh.sd, dir, {}, gated).status(); });
  gated.WaitUntilReached();
  ASSERT_TRUE(std::filesystem::remove(LockPath(dir)));
  gated.Open();
  saver.join();
  ASSERT_FALSE(st.ok()) << "a save that lost its lock committed";
  EXPECT_NE(st.message().find("no longer this job's"), std::string::npos) << st.message();
  auto v = LoadValue(dir, 1000);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 7.0f);
}

// Planted links at the lock's name are never written through.
TEST(SaveOwnership, PlantedLinksAtTheLockAreRefused) {
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  std::filesystem::create_directories(dir);
  const std::string target = tmp.Sub("precious");
  std::ofstream(target) << "precious";
  std::filesystem::create_symlink(target, LockPath(dir));
  OneTensor t(10, 1.0f);
  auto r = checkpoint::Save(t.sd, dir, {}, storage::PosixFileSystem());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("symlink"), std::string::npos) << r.status().message();
  std::filesystem::remove(LockPath(dir));
  std::filesystem::create_hard_link(target, LockPath(dir));
  r = checkpoint::Save(t.sd, dir, {}, storage::PosixFileSystem());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("one link"), std::string::npos) << r.status().message();
  std::string kept;
  std::getline(std::ifstream(target), kept);
  EXPECT_EQ(kept, "precious");
}

// A lock of this process whose save has returned (it failed without removing the lock) is
// stale.
TEST(SaveOwnership, LockOfReturnedSaveOfThisProcessIsTakenOver) {
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  WriteLock(dir, HostName(), ::getpid());
  OneTensor t(10, 5.0f);
  auto r = checkpoint::Save(t.sd, dir, {}, storage::PosixFileSystem());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

// Issue 11 item 2: ranks given different directories (as with node-local disks, or one
// relative path from different working directories) all fail with one error naming the rank
// and the path, and nothing is written or deleted: the previous checkpoint in rank 1's
// directory is untouched.
TEST(SaveOwnership, RanksThatSeeDifferentDirectoriesFailBeforeWriting) {
  TempDir tmp;
  auto dir_of = [&](int r) { return tmp.Sub("n" + std::to_string(r)) + "/ckpt"; };
  OneTensor previous(64, 9.0f);
  ASSERT_TRUE(checkpoint::Save(previous.sd, dir_of(1), {}, storage::PosixFileSystem()).ok());
  const auto before = testing::ListFiles(dir_of(1));
  std::vector<Status> errors(2);
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& comm) {
    const int r = comm->rank();
    std::vector<float> data(32, 1.0f);
    StateDict sd;
    sd.add("w", TensorView(data.data(), DType::kF32, Shape{32}), Chunk{Shape{64}, {32 * r}});
    errors[r] =
        checkpoint::Save(sd, dir_of(r), {.comm = comm}, storage::PosixFileSystem()).status();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(errors[r].ok()) << "rank " << r << " saved into a directory rank 0 cannot see";
    EXPECT_EQ(errors[r].message(), errors[0].message()) << "ranks disagree on the error";
  }
  const std::string msg = errors[0].message();
  EXPECT_NE(msg.find("rank(s) 1 "), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir_of(1) + "/dcp.lock"), std::string::npos) << msg;
  EXPECT_EQ(testing::ListFiles(dir_of(1)), before) << "rank 1's directory was changed";
  EXPECT_TRUE(DataFiles(dir_of(0)).empty()) << "rank 0 wrote data";
  EXPECT_FALSE(std::filesystem::exists(LockPath(dir_of(0))));
  auto v = LoadValue(dir_of(1), 64);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 9.0f);
}

// A small disk: writes fail with ENOSPC once `capacity` bytes are held by files written
// through it; removing a file frees its bytes. Removes can be made to fail (a save that
// crashed before it could clean up).
class SmallDisk final : public testfs::ForwardingFileSystem {
 public:
  explicit SmallDisk(uint64_t capacity) : capacity_(capacity) {}
  class File final : public storage::WritableFile {
   public:
    File(SmallDisk& d, std::unique_ptr<storage::WritableFile> b) : d_(d), b_(std::move(b)) {}
    Status Append(std::span<const std::byte> data) override {
      {
        std::lock_guard lock(d_.mu_);
        if (d_.used_ + data.size() > d_.capacity_) {
          return ErrnoStatus("write", path(), ENOSPC);
        }
        d_.used_ += data.size();
        d_.sizes_[path()] += data.size();
      }
      return b_->Append(data);
    }
    Status Sync() override { return b_->Sync(); }
    Status Close() override { return b_->Close(); }
    const std::string& path() const override { return b_->path(); }

   private:
    SmallDisk& d_;
    std::unique_ptr<storage::WritableFile> b_;
  };
  Result<std::unique_ptr<storage::WritableFile>> NewWritableFile(const std::string& p) override {
    Forget(p);
    DCP_ASSIGN_OR_RETURN(auto f, base().NewWritableFile(p));
    return std::unique_ptr<storage::WritableFile>(new File(*this, std::move(f)));
  }
  Result<std::unique_ptr<storage::WritableFile>> NewExclusiveFile(const std::string& p) override {
    DCP_ASSIGN_OR_RETURN(auto f, base().NewExclusiveFile(p));
    return std::unique_ptr<storage::WritableFile>(new File(*this, std::move(f)));
  }
  Status Rename(const std::string& a, const std::string& b) override {
    DCP_RETURN_IF_ERROR(base().Rename(a, b));
    std::lock_guard lock(mu_);
    if (auto it = sizes_.find(b); it != sizes_.end()) used_ -= it->second, sizes_.erase(it);
    if (auto it = sizes_.find(a); it != sizes_.end()) {
      sizes_[b] = it->second;
      sizes_.erase(it);
    }
    return OkStatus();
  }
  Status Remove(const std::string& p) override {
    if (fail_removes) return Unavailable("injected: remove " + p);
    DCP_RETURN_IF_ERROR(base().Remove(p));
    Forget(p);
    return OkStatus();
  }

  bool fail_removes = false;

 private:
  void Forget(const std::string& p) {
    std::lock_guard lock(mu_);
    if (auto it = sizes_.find(p); it != sizes_.end()) used_ -= it->second, sizes_.erase(it);
  }
  std::mutex mu_;
  uint64_t capacity_, used_ = 0;
  std::map<std::string, uint64_t> sizes_;
};

// Issue 11 item 5, scaled from a 64 MiB tmpfs: a 24 MiB save fits, a 48 MiB save fails, and
// a later 24 MiB save must fit again, whether the failed save removed its partial files
// itself or (it could not) the next save removes them.
void FullDiskDoesNotWedge(bool failed_save_can_clean_up) {
  constexpr uint64_t kMiB = 1 << 20;
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  SmallDisk disk(64 * kMiB);
  const size_t small = 24 * kMiB / 4, big = 48 * kMiB / 4;
  {
    OneTensor t(small, 1.0f);
    auto r = checkpoint::Save(t.sd, dir, {}, disk);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  {
    OneTensor t(big, 2.0f);
    disk.fail_removes = !failed_save_can_clean_up;
    auto r = checkpoint::Save(t.sd, dir, {}, disk);
    disk.fail_removes = false;
    ASSERT_FALSE(r.ok()) << "48 MiB fit on a 64 MiB disk holding 24 MiB";
    EXPECT_NE(r.status().message().find("no space left"), std::string::npos)
        << r.status().ToString();
    if (failed_save_can_clean_up) {
      EXPECT_EQ(DataFiles(dir).size(), 1u) << "the failed save left its partial files";
    }
    auto v = LoadValue(dir, small);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, 1.0f) << "the failed save damaged the previous checkpoint";
  }
  {
    OneTensor t(small, 3.0f);
    auto r = checkpoint::Save(t.sd, dir, {}, disk);
    ASSERT_TRUE(r.ok()) << "a save that fits failed after a failed save: " << r.status().ToString();
    auto v = LoadValue(dir, small);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, 3.0f);
    EXPECT_EQ(DataFiles(dir).size(), 1u);
  }
}

TEST(SaveOwnership, FullDiskFailedSaveRemovesItsFiles) { FullDiskDoesNotWedge(true); }
TEST(SaveOwnership, FullDiskNextSaveRemovesFilesOfFailedSave) { FullDiskDoesNotWedge(false); }

// A caller's check before the commit (SaveHooks::before_commit, what `dcp convert` uses): its
// error fails the save, nothing is committed, the earlier checkpoint loads as it was, and the
// failed save's data files are gone; with and without collectives.
TEST(SaveOwnership, ABeforeCommitHookErrorCommitsNothing) {
  for (bool collectives : {true, false}) {
    SCOPED_TRACE(collectives ? "collectives" : "independent");
    TempDir tmp;
    const std::string dir = tmp.Sub("ckpt");
    auto& fs = storage::PosixFileSystem();
    OneTensor first(1024, 1.0f), second(1024, 2.0f);
    ASSERT_TRUE(
        checkpoint::Save(first.sd, dir, {.use_collectives = collectives, .step = 1}, fs).ok());
    const auto files_before = DataFiles(dir);
    int calls = 0;
    checkpoint::SaveHooks hooks;
    hooks.before_commit = [&] {
      ++calls;
      return FailedPrecondition("the source moved");
    };
    auto r =
        checkpoint::Save(second.sd, dir, {.use_collectives = collectives, .step = 2}, fs, &hooks);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(calls, 1);
    EXPECT_NE(r.status().message().find("the source moved"), std::string::npos)
        << r.status().ToString();
    auto v = LoadValue(dir, 1024);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, 1.0f);
    if (collectives) {
      EXPECT_EQ(DataFiles(dir), files_before);  // the failed save's removed
    }
    // A hook that passes lets the save commit.
    hooks.before_commit = [] { return OkStatus(); };
    ASSERT_TRUE(
        checkpoint::Save(second.sd, dir, {.use_collectives = collectives, .step = 3}, fs, &hooks)
            .ok());
    v = LoadValue(dir, 1024);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, 2.0f);
  }
}

// Issue 11 item 12: a directory that does not exist is not "a save that did not finish".
TEST(SaveOwnership, MissingDirectoryIsReportedAsMissing) {
  TempDir tmp;
  auto missing = checkpoint::ReadMetadata(storage::PosixFileSystem(), tmp.Sub("nope"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "checkpoint directory " + tmp.Sub("nope") + " does not exist");
  std::filesystem::create_directories(tmp.Sub("empty"));
  auto empty = checkpoint::ReadMetadata(storage::PosixFileSystem(), tmp.Sub("empty"));
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(empty.status().message().find("no committed metadata"), std::string::npos);
}

}  // namespace
}  // namespace dcp
