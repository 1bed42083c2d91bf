#include "checkpoint/save_lock.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <unordered_set>

#include "checkpoint/names.h"

namespace dcp::checkpoint {
namespace {

// Saves of this process that are still running, by save id: a lock naming this pid and a
// save id not listed here was left by a save that failed without removing it.
std::mutex& LiveMu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::unordered_set<uint64_t>& LiveSaves() {
  static auto* s = new std::unordered_set<uint64_t>;
  return *s;
}
bool IsLiveHere(uint64_t save_id) {
  std::lock_guard lock(LiveMu());
  return LiveSaves().count(save_id) > 0;
}

int64_t NowUnix() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool ProcessAlive(int64_t pid) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  // It exists (EPERM: owned by someone else), unless it is a zombie: a killed process whose
  // parent has not reaped it yet (a SIGKILLed rank of a job whose launcher is gone) holds
  // nothing any more. /proc/<pid>/stat: "pid (comm) S ...", comm may hold spaces or ')'.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  const char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

// Why `info` is stale, or "" when its save may still be running (or cannot be checked).
std::string StaleReason(const LockInfo& info) {
  if (info.host != LockHostName()) return "";
  if (info.pid == ::getpid()) return IsLiveHere(info.save_id) ? "" : "its save has returned";
  if (!ProcessAlive(info.pid)) return "process " + std::to_string(info.pid) + " is gone";
  return "";
}

std::string Describe(const LockInfo& info) {
  return "save " + SaveIdHex(info.save_id) + " of process " + std::to_string(info.pid) +
         " on host " + info.host + ", started " +
         std::to_string(std::max<int64_t>(0, NowUnix() - info.created_unix_s)) + " s ago";
}

Status WriteLock(storage::FileSystem& fs, const std::string& path, const LockInfo& info) {
  DCP_ASSIGN_OR_RETURN(auto file, fs.NewExclusiveFile(path));
  const std::string text = EncodeLockInfo(info);
  Status s = file->Append(std::as_bytes(std::span(text.data(), text.size())));
  if (s.ok()) s = file->Sync();
  Status c = file->Close();
  if (s.ok()) s = c;
  // kFailedPrecondition: another lock won a conditional write (an object store settles
  // NewExclusiveFile when the object is completed): that lock is not ours to remove.
  if (!s.ok() && s.code() != StatusCode::kFailedPrecondition) (void)fs.Remove(path);
  return s;
}

}  // namespace

uint64_t RandomSaveId() {
  std::random_device rd;
  uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  id ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return id == 0 ? 1 : id;
}

std::string LockHostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "unknown-host";
  return buf;
}

std::string EncodeLockInfo(const LockInfo& info) {
  return "dcp save lock\nhost " + info.host + "\npid " + std::to_string(info.pid) + "\nsave_id " +
         SaveIdHex(info.save_id) + "\ncreated " + std::to_string(info.created_unix_s) + "\n";
}

Result<LockInfo> DecodeLockInfo(std::string_view text) {
  LockInfo info;
  int fields = 0;
  bool header = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line == "dcp save lock") {
      header = true;
      continue;
    }
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos) continue;
    std::string key(line.substr(0, sp)), value(line.substr(sp + 1));
    char* e = nullptr;
    if (key == "host") {
      info.host = value, ++fields;
    } else if (key == "pid") {
      info.pid = std::strtoll(value.c_str(), &e, 10), ++fields;
    } else if (key == "save_id") {
      info.save_id = std::strtoull(value.c_str(), &e, 16), ++fields;
    } else if (key == "created") {
      info.created_unix_s = std::strtoll(value.c_str(), &e, 10), ++fields;
    }
  }
  if (!header || fields != 4) return DataLoss("malformed save lock");
  return info;
}

Status SaveLock::Acquire(storage::FileSystem& fs, const std::string& dir, uint64_t save_id) {
  const std::string path = storage::JoinPath(dir, std::string(kLockName));
  LockInfo mine{LockHostName(), static_cast<int64_t>(::getpid()), save_id, NowUnix()};
  {
    std::lock_guard lock(LiveMu());
    LiveSaves().insert(save_id);
  }
  auto unregister = [&] {
    std::lock_guard lock(LiveMu());
    LiveSaves().erase(save_id);
  };
  for (int attempt = 0; attempt < 3; ++attempt) {
    Status s = WriteLock(fs, path, mine);
    if (s.ok()) {
      fs_ = &fs;
      path_ = path;
      save_id_ = save_id;
      return OkStatus();
    }
    if (s.code() != StatusCode::kFailedPrecondition) {
      unregister();
      return s.Annotate("cannot lock checkpoint directory " + dir + ": ");
    }
    // Someone holds it: stale or live?
    auto text = storage::ReadWholeFile(fs, path);
    if (!text.ok()) {
      if (text.status().code() == StatusCode::kNotFound) continue;  // just released
      unregister();
      return text.status().Annotate("cannot read the lock of checkpoint directory " + dir + ": ");
    }
    auto holder = DecodeLockInfo(*text);
    if (!holder.ok()) {
      unregister();
      return FailedPrecondition("checkpoint directory " + dir + " is locked by another save (" +
                                path + " is unreadable; remove it if no save is running)");
    }
    const std::string why = StaleReason(*holder);
    if (why.empty()) {
      unregister();
      return FailedPrecondition("checkpoint directory " + dir + " is in use by " +
                                Describe(*holder) + " (" + path +
                                "); two saves into one directory would destroy each other's "
                                "files. Remove the lock only if that save is not running.");
    }
    // Stale: move it aside under a name of our own, check it is still the one judged (not
    // a fresh lock of another save that took it over meanwhile), then try again.
    const std::string aside = path + ".stale-" + SaveIdHex(save_id);
    if (!fs.Rename(path, aside).ok()) continue;
    auto moved = storage::ReadWholeFile(fs, aside);
    if (moved.ok() && *moved != *text) {
      (void)fs.Rename(aside, path);  // someone else's live lock: put it back
      continue;
    }
    (void)fs.Remove(aside);
  }
  unregister();
  return FailedPrecondition("checkpoint directory " + dir +
                            " is contended: its lock was taken by another save");
}

void SaveLock::Release() {
  if (!fs_) return;
  // Remove it only if it is still ours (a takeover after we were judged dead is not).
  auto text = storage::ReadWholeFile(*fs_, path_);
  if (text.ok()) {
    auto info = DecodeLockInfo(*text);
    if (info.ok() && info->save_id == save_id_ && info->pid == ::getpid()) {
      (void)fs_->Remove(path_);
    }
  }
  {
    std::lock_guard lock(LiveMu());
    LiveSaves().erase(save_id_);
  }
  fs_ = nullptr;
}

Status CheckSeesLock(storage::FileSystem& fs, const std::string& dir, uint64_t save_id) {
  const std::string path = storage::JoinPath(dir, std::string(kLockName));
  auto text = storage::ReadWholeFile(fs, path);
  if (!text.ok()) {
    return FailedPrecondition(path + " is missing here (" + text.status().message() + ")");
  }
  auto info = DecodeLockInfo(*text);
  if (!info.ok()) return FailedPrecondition(path + " is unreadable here");
  if (info->save_id != save_id) {
    return FailedPrecondition(path + " here belongs to save " + SaveIdHex(info->save_id) +
                              ", not to this save " + SaveIdHex(save_id));
  }
  return OkStatus();
}

}  // namespace dcp::checkpoint
