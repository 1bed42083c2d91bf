// The lock with leases: its file format, the heartbeat, and holders on emulated hosts
// (DCP_HOST_ID) in real processes, on a file system and on a store without flock.
#include "storage/lease_lock.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "test_util.h"
#include "testfs/forwarding_file_system.h"

namespace dcp::storage {
namespace {

using namespace std::chrono_literals;

// The real file system seen as an object store: no flock, so holders are judged by their
// lock's content and heartbeat alone (as on S3, or a shared file system whose locks do not
// reach other hosts).
class NoFlockFileSystem final : public testfs::ForwardingFileSystem {
 public:
  bool IsObjectStore() const override { return true; }
};

// A POSIX file system whose flock does not work (ENOLCK on some NFS, FUSE): the lock file is
// opened as on any file system, and every change of it is a compare-and-swap.
class FlocklessFileSystem final : public testfs::ForwardingFileSystem {
 public:
  bool Flocks() const override { return false; }
};

// A process on host `host` that takes the lock at `path` with `lease` seconds and holds it,
// renewing, until killed. Returns once it holds the lock.
// `env`: one more variable for it ("NAME=value").
pid_t HolderOnHost(const std::string& host, const std::string& path, double lease, bool no_flock,
                   const char* env = nullptr) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  pid_t child = ::fork();
  if (child == 0) {
    ::setenv("DCP_HOST_ID", host.c_str(), 1);
    if (env) ::putenv(const_cast<char*>(env));
    NoFlockFileSystem no_flock_fs;
    FileSystem& fs = no_flock ? static_cast<FileSystem&>(no_flock_fs) : PosixFileSystem();
    LeaseLock lock;
    if (!lock.Acquire(fs, path, "the test root", "manager", "c0ffee", {.lease_seconds = lease})
             .ok()) {
      ::_exit(1);
    }
    char c = 1;
    (void)!::write(ready[1], &c, 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);  // a holder that could not take the lock ends the read
  char c = 0;
  const bool ok = ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  if (!ok) ::waitpid(child, nullptr, 0);
  return ok ? child : -1;
}

void Kill(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

// Sets DCP_HOST_ID for one test.
struct AsHost {
  explicit AsHost(const char* host) { ::setenv("DCP_HOST_ID", host, 1); }
  ~AsHost() { ::unsetenv("DCP_HOST_ID"); }
};

TEST(LeaseLock, HolderRoundTripsWithFixedWidthTimes) {
  LockHolder h{"save", "1a2b", "node-7", 42, 1700000000123, 1700000000456};
  const std::string text = EncodeLockHolder(h);
  auto back = DecodeLockHolder(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->kind, "save");
  EXPECT_EQ(back->id, "1a2b");
  EXPECT_EQ(back->host, "node-7");
  EXPECT_EQ(back->pid, 42);
  EXPECT_EQ(back->started_unix_ms, 1700000000123);
  EXPECT_EQ(back->heartbeat_unix_ms, 1700000000456);
  h.heartbeat_unix_ms = 1;  // a renewal rewrites the file in place: same length
  EXPECT_EQ(EncodeLockHolder(h).size(), text.size());
  EXPECT_TRUE(back->flock);
  h.flock = false;  // a holder without flock says so; earlier decoders skip the line
  auto no_flock = DecodeLockHolder(EncodeLockHolder(h));
  ASSERT_TRUE(no_flock.ok());
  EXPECT_FALSE(no_flock->flock);
  EXPECT_FALSE(DecodeLockHolder("dcp lock\nkind save\n").ok());
  EXPECT_FALSE(DecodeLockHolder("host pid\n").ok());
  EXPECT_FALSE(DecodeLockHolder(std::string(5000, 'x')).ok());
}

TEST(LeaseLock, TheHolderRenewsItsHeartbeat) {
  testing::TempDir d;
  const std::string path = d.Sub("lock");
  LeaseLock lock;
  ASSERT_TRUE(lock.Acquire(PosixFileSystem(), path, "t", "save", "1", {.lease_seconds = 0.2}).ok());
  auto first = ReadLockHolder(PosixFileSystem(), path);
  ASSERT_TRUE(first.ok());
  bool renewed = false;
  for (auto until = std::chrono::steady_clock::now() + 30s;
       !renewed && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(20ms);
    auto now = ReadLockHolder(PosixFileSystem(), path);
    ASSERT_TRUE(now.ok()) << "a renewal left the lock unreadable: " << now.status().ToString();
    renewed = now->heartbeat_unix_ms > first->heartbeat_unix_ms;
  }
  EXPECT_TRUE(renewed);
  EXPECT_TRUE(lock.Check().ok());
  lock.Release();
  EXPECT_FALSE(std::filesystem::exists(path));
}

// Emulated hosts on a file system with flock: a live holder of another host is refused at
// once (the kernel shows it alive); once it is killed its lease still runs, then the next
// taker breaks it and names it.
TEST(LeaseLock, ADeadHolderOfAnotherHostIsBrokenAfterItsLease) {
  testing::TempDir d;
  const std::string path = d.Sub("lock");
  pid_t holder = HolderOnHost("host-a", path, /*lease=*/2, /*no_flock=*/false);
  ASSERT_GT(holder, 0);
  AsHost b("host-b");
  LeaseLock lock;
  Status refused =
      lock.Acquire(PosixFileSystem(), path, "the test root", "manager", "b", {.lease_seconds = 2});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("on host host-a"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("is alive"), std::string::npos) << refused.message();
  Kill(holder);
  Status st;
  for (auto until = std::chrono::steady_clock::now() + 60s;
       std::chrono::steady_clock::now() < until;) {
    st = lock.Acquire(PosixFileSystem(), path, "the test root", "manager", "b",
                      {.lease_seconds = 2});
    if (st.ok()) break;
    EXPECT_NE(st.message().find("on host host-a"), std::string::npos) << st.message();
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(lock.broke().find("process " + std::to_string(holder) + " on host host-a"),
            std::string::npos)
      << lock.broke();
  EXPECT_NE(lock.broke().find("lease of 2 s expired"), std::string::npos) << lock.broke();
}

// Without flock (an object store, a shared file system whose locks stay on one host) the
// heartbeat alone keeps a live holder's lock: it is never broken while renewed, and broken
// once its holder is gone and the lease ran out.
TEST(LeaseLock, WithoutFlockARenewedLeaseIsNeverBroken) {
  testing::TempDir d;
  const std::string path = d.Sub("lock");
  NoFlockFileSystem fs;
  const double lease = 6;  // renewed every 1.5 s
  pid_t holder = HolderOnHost("host-a", path, lease, /*no_flock=*/true);
  ASSERT_GT(holder, 0);
  AsHost b("host-b");
  LeaseLock lock;
  for (auto until = std::chrono::steady_clock::now() + 7s;
       std::chrono::steady_clock::now() < until;) {
    Status st = lock.Acquire(fs, path, "the test root", "manager", "b", {.lease_seconds = lease});
    ASSERT_FALSE(st.ok()) << "a live holder renewing its lease lost it";
    EXPECT_NE(st.message().find("renews it every 1 s"), std::string::npos) << st.message();
    std::this_thread::sleep_for(200ms);
  }
  Kill(holder);
  Status st;
  for (auto until = std::chrono::steady_clock::now() + 60s;
       std::chrono::steady_clock::now() < until;) {
    st = lock.Acquire(fs, path, "the test root", "manager", "b", {.lease_seconds = lease});
    if (st.ok()) break;
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(lock.broke().find("on host host-a"), std::string::npos) << lock.broke();
  EXPECT_TRUE(lock.Check().ok());
  auto mine = ReadLockHolder(fs, path);
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->host, "host-b");
}

// On a store without flock the same host's dead process is seen by its pid.
TEST(LeaseLock, WithoutFlockADeadProcessOfThisHostIsSeenAtOnce) {
  testing::TempDir d;
  const std::string path = d.Sub("lock");
  NoFlockFileSystem fs;
  pid_t holder = HolderOnHost("host-a", path, /*lease=*/300, /*no_flock=*/true);
  ASSERT_GT(holder, 0);
  Kill(holder);
  AsHost a("host-a");
  LeaseLock lock;
  Status st = lock.Acquire(fs, path, "the test root", "manager", "b", {.lease_seconds = 300});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(lock.broke().find("is gone"), std::string::npos) << lock.broke();
}

// Writes a lock held by `h` at `path`.
void Plant(const std::string& path, const LockHolder& h) {
  std::ofstream(path, std::ios::binary) << EncodeLockHolder(h);
}

// On the holder's host, its process is told by boot id, pid namespace and start time: a live
// process that reused the pid holds nothing; a holder whose process this one cannot see (other
// pid namespace or kernel, same host name) is judged by its lease.
TEST(LeaseLock, AHolderIsItsProcessNotItsPid) {
  testing::TempDir d;
  const std::string path = d.Sub("lock");
  NoFlockFileSystem fs;
  AsHost a("host-a");
  const std::string mine = ProcessIdentity(::getpid());
  ASSERT_FALSE(mine.empty());
  LockHolder h{"save", "old", "host-a", ::getpid(), NowUnixMs(), NowUnixMs(), mine};
  auto back = DecodeLockHolder(EncodeLockHolder(h));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->process, mine);

  // This very process (alive, same start time): held.
  Plant(path, h);
  LeaseLock lock;
  Status st = lock.Acquire(fs, path, "the test root", "save", "b", {.lease_seconds = 300});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();

  // The same pid, another start time: a process that reused the pid.
  h.process = mine.substr(0, mine.rfind(' ')) + " 1";
  Plant(path, h);
  st = lock.Acquire(fs, path, "the test root", "save", "b", {.lease_seconds = 300});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(lock.broke().find("the pid is another process's now"), std::string::npos)
      << lock.broke();
  lock.Release();

  // Another pid namespace: its pid means nothing here; a fresh lease holds, an old one not.
  h.process = mine.substr(0, mine.find(' ')) + " pid:[1] 1";
  h.pid = 999999;  // no such process here, which must not matter
  Plant(path, h);
  st = lock.Acquire(fs, path, "the test root", "save", "b", {.lease_seconds = 300});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  // An old heartbeat is the holder's clock: broken only once the lock went unchanged for a
  // lease watched from here.
  h.heartbeat_unix_ms = NowUnixMs() - 600 * 1000;
  Plant(path, h);
  st = lock.Acquire(fs, path, "the test root", "save", "b", {.lease_seconds = 1});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(lock.broke().find("unchanged for 1 s as watched from host"), std::string::npos)
      << lock.broke();
}

// Checks `lock` until it is no longer held (or 30 s passed): why it was lost.
Status CheckUntilLost(LeaseLock& lock) {
  Status st;
  for (auto until = std::chrono::steady_clock::now() + 30s;
       st.ok() && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(50ms);
    st = lock.Check();
  }
  return st;
}

// Without flock every change of the lock is a compare-and-swap on the version its holder saw:
// a renewal never writes over a lock another job took meanwhile, and the holder finds out.
TEST(LeaseLock, ARenewalNeverOverwritesALockTakenMeanwhile) {
  testing::TempDir d;
  const std::string path = d.Sub("lock");
  NoFlockFileSystem fs;
  LeaseLock lock;
  ASSERT_TRUE(lock.Acquire(fs, path, "the test root", "save", "a", {.lease_seconds = 0.4}).ok());
  LockHolder other{"save", "taker", "host-z", 7, NowUnixMs(), NowUnixMs()};
  Plant(path, other);
  Status st = CheckUntilLost(lock);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("taken by save taker of process 7 on host host-z"), std::string::npos)
      << st.message();
  std::this_thread::sleep_for(300ms);  // more beats: none may write
  auto now = ReadLockHolder(fs, path);
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->id, "taker");
  lock.Release();  // not ours: left to its holder
  EXPECT_TRUE(std::filesystem::exists(path));
}

// A holder whose lock cannot be written (a store outage) past its lease no longer counts it as
// its own: a taker may have found it expired meanwhile.
class FailingWritesFileSystem final : public testfs::ForwardingFileSystem {
 public:
  bool IsObjectStore() const override { return true; }
  Result<std::string> WriteIfVersion(const std::string& p, std::string_view data,
                                     const std::string& version) override {
    if (failing) return Unavailable("the store is down");
    return ForwardingFileSystem::WriteIfVersion(p, data, version);
  }
  std::atomic<bool> failing{false};
};

TEST(LeaseLock, ALockNotRenewedForItsLeaseIsNoLongerHeld) {
  testing::TempDir d;
  const std::string path = d.Sub("lock");
  FailingWritesFileSystem fs;
  LeaseLock lock;
  ASSERT_TRUE(lock.Acquire(fs, path, "the test root", "save", "a", {.lease_seconds = 0.4}).ok());
  ::testing::internal::CaptureStderr();
  fs.failing = true;
  Status st = CheckUntilLost(lock);
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("could not be renewed for"), std::string::npos) << st.message();
  EXPECT_NE(said.find("could not renew"), std::string::npos) << said;
}

// A real holder in a pid namespace of its own (unshare): it is pid 1 there, and pid 1 here is
// init, alive. Its lock is judged by its lease, not by that pid: held while it renews, broken
// once it died and the lease ran out (never "alive" forever).
TEST(LeaseLock, AHolderInAnotherPidNamespaceIsJudgedByItsLease) {
  testing::TempDir d;
  const std::string path = d.Sub("lock");
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  pid_t child = ::fork();
  if (child == 0) {
    int64_t holder = 0;
    if (::unshare(CLONE_NEWPID) == 0) {
      holder = ::fork();
      if (holder == 0) {  // pid 1 of the new namespace
        ::setenv("DCP_HOST_ID", "host-a", 1);
        NoFlockFileSystem fs;
        LeaseLock lock;
        if (!lock.Acquire(fs, path, "the test root", "save", "ns", {.lease_seconds = 2}).ok()) {
          ::_exit(1);
        }
        char c = 1;
        (void)!::write(pipe_fds[1], &c, 1);
        for (;;) ::pause();
      }
    }
    (void)!::write(pipe_fds[1], &holder, sizeof(holder));  // 0: no pid namespaces here
    ::_exit(0);
  }
  int64_t holder = 0;
  ASSERT_EQ(::read(pipe_fds[0], &holder, sizeof(holder)), static_cast<ssize_t>(sizeof(holder)));
  ::waitpid(child, nullptr, 0);
  if (holder <= 0) GTEST_SKIP() << "cannot create a pid namespace here (unshare needs root)";
  char c = 0;
  ASSERT_EQ(::read(pipe_fds[0], &c, 1), 1) << "the holder could not take the lock";
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  auto written = ReadLockHolder(PosixFileSystem(), path);
  ASSERT_TRUE(written.ok());
  EXPECT_EQ(written->pid, 1);

  AsHost a("host-a");
  NoFlockFileSystem fs;
  LeaseLock lock;
  Status st = lock.Acquire(fs, path, "the test root", "save", "b", {.lease_seconds = 2});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("process 1 on host host-a"), std::string::npos) << st.message();
  Kill(static_cast<pid_t>(holder));
  for (auto until = std::chrono::steady_clock::now() + 60s;
       std::chrono::steady_clock::now() < until;) {
    st = lock.Acquire(fs, path, "the test root", "save", "b", {.lease_seconds = 2});
    if (st.ok()) break;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(lock.broke().find("lease of 2 s expired"), std::string::npos) << lock.broke();
}

// Without flock on a file system, takers that judged one stale lock at the same moment race
// to replace it: exactly one holds it after, the others are refused naming that one, and the
// lock file is the winner's (a write followed by a read-back let two hold it).
TEST(LeaseLock, WithoutFlockOnAFileSystemOfTakersOfAStaleLockExactlyOneWins) {
  testing::TempDir d;
  const std::string path = d.Sub("lock");
  FlocklessFileSystem fs;
  AsHost b("host-b");
  for (int round = 0; round < 3; ++round) {
    LockHolder gone{
        "save", "gone", "host-z", 7, NowUnixMs() - 3600 * 1000, NowUnixMs() - 3600 * 1000};
    Plant(path, gone);
    constexpr int kTakers = 4;
    std::vector<LeaseLock> locks(kTakers);
    std::vector<Status> got(kTakers);
    std::vector<std::thread> takers;
    for (int i = 0; i < kTakers; ++i) {
      takers.emplace_back([&, i] {
        got[i] = locks[i].Acquire(fs, path, "the test root", "save", "taker" + std::to_string(i),
                                  {.lease_seconds = 2});
      });
    }
    for (auto& t : takers) t.join();
    int winner = -1, wins = 0;
    for (int i = 0; i < kTakers; ++i) {
      if (got[i].ok()) {
        ++wins;
        winner = i;
      } else {
        EXPECT_EQ(got[i].code(), StatusCode::kFailedPrecondition) << got[i].ToString();
      }
    }
    ASSERT_EQ(wins, 1) << "round " << round;
    EXPECT_NE(locks[winner].broke().find("on host host-z"), std::string::npos);
    auto held = ReadLockHolder(fs, path);
    ASSERT_TRUE(held.ok());
    EXPECT_EQ(held->id, "taker" + std::to_string(winner));
    EXPECT_TRUE(locks[winner].Check().ok());
    for (auto& l : locks) l.Release();
    EXPECT_FALSE(std::filesystem::exists(path));  // released by its holder, as seen
  }
}

// DCP_LOCKS_WITHOUT_FLOCK (flock that stays on one host, as Lustre's localflock): a holder
// takes no kernel lock, and a taker of its host that does take one (a process without the
// variable) still finds its process alive: refused, as `dcp unlock` is, until it is gone.
TEST(LeaseLock, LocksWithoutFlockWhenTold) {
  testing::TempDir d;
  const std::string path = d.Sub("lock");
  pid_t holder =
      HolderOnHost("host-a", path, /*lease=*/300, /*no_flock=*/false, "DCP_LOCKS_WITHOUT_FLOCK=1");
  ASSERT_GT(holder, 0) << "the holder could not take the lock";
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      if (pid > 0) Kill(pid);
    }
  } reaper{holder};
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0) << "the holder took a kernel lock";
  ::close(fd);
  AsHost a("host-a");
  LeaseLock lock;
  Status st =
      lock.Acquire(PosixFileSystem(), path, "the test root", "save", "b", {.lease_seconds = 300});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("manager c0ffee of process " + std::to_string(holder)),
            std::string::npos)
      << st.message();
  auto unlocked = BreakLock(PosixFileSystem(), path);
  EXPECT_FALSE(unlocked.ok());
  EXPECT_NE(unlocked.status().message().find("alive on this host"), std::string::npos)
      << unlocked.status().message();
  Kill(holder);
  reaper.pid = 0;
  st = lock.Acquire(PosixFileSystem(), path, "the test root", "save", "b", {.lease_seconds = 300});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(lock.broke().find("is gone"), std::string::npos) << lock.broke();
}

}  // namespace
}  // namespace dcp::storage
