#include "storage/lock_holder.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/host_name.h"

namespace dcp::storage {
namespace {

// For holders whose kernel lock cannot be seen (no flock here): is `pid` of this host alive?
// A zombie (killed, not yet reaped) holds nothing.
bool ProcessAlive(int64_t pid) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');  // "pid (comm) S ...": comm may hold ')'
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  return line[close + 2] != 'Z' && line[close + 2] != 'X';
}

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The start time of `pid` (clock ticks since boot, /proc/<pid>/stat's 22nd field), "" if gone.
std::string StartTime(int64_t pid) {
  const std::string line = FirstLine("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = line.rfind(')');  // "pid (comm) S ...": comm may hold ')'
  if (close == std::string::npos) return "";
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) return field;
  }
  return "";
}

// The pid namespace this process sees pids in ("pid:[4026531836]"), "" where /proc cannot say.
std::string PidNamespace() {
  char buf[64];
  const ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// The holder's boot id, pid namespace and start time, split; empty fields for older locks.
struct Identity {
  std::string boot, ns, start;
};
Identity SplitIdentity(const std::string& process) {
  Identity id;
  std::istringstream parts(process);
  parts >> id.boot >> id.ns >> id.start;
  return id;
}

}  // namespace

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string ProcessIdentity(int64_t pid) {
  const std::string start = StartTime(pid);
  std::string boot = FirstLine("/proc/sys/kernel/random/boot_id");
  std::string ns = PidNamespace();
  if (start.empty() || boot.empty() || ns.empty()) return "";
  for (std::string* s : {&boot, &ns}) {
    for (char& c : *s) {
      if (c == ' ' || c == '\n') c = '_';
    }
  }
  return boot + " " + ns + " " + start;
}

std::string EncodeLockHolder(const LockHolder& h) {
  // Fixed-width times: a renewal rewrites the file in place, never shorter or longer.
  char times[64];
  std::snprintf(times, sizeof(times), "started %015lld\nrenewed %015lld\n",
                static_cast<long long>(h.started_unix_ms),
                static_cast<long long>(h.heartbeat_unix_ms));
  return "dcp lock\nkind " + h.kind + "\nid " + h.id + "\nhost " + h.host + "\npid " +
         std::to_string(h.pid) + "\n" + times +
         (h.process.empty() ? "" : "process " + h.process + "\n") + (h.flock ? "" : "flock no\n");
}

Result<LockHolder> DecodeLockHolder(std::string_view text) {
  if (text.size() > kMaxLockBytes || text.substr(0, 9) != "dcp lock\n") {
    return DataLoss("not a dcp lock");
  }
  LockHolder h;
  int fields = 0;
  size_t pos = 9;
  while (pos < text.size()) {
    size_t end = std::min(text.find('\n', pos), text.size());
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) continue;
    const std::string key(line.substr(0, sp)), value(line.substr(sp + 1));
    const long long n = std::strtoll(value.c_str(), nullptr, 10);
    if (key == "kind") h.kind = value, ++fields;
    if (key == "id") h.id = value, ++fields;
    if (key == "host") h.host = value, ++fields;
    if (key == "pid") h.pid = n, ++fields;
    if (key == "started") h.started_unix_ms = n, ++fields;
    if (key == "renewed") h.heartbeat_unix_ms = n, ++fields;
    if (key == "process") h.process = value;  // optional: earlier versions wrote none
    if (key == "flock") h.flock = value != "no";
  }
  if (fields != 6) return DataLoss("incomplete dcp lock");
  return h;
}

std::string DescribeLockHolder(const LockHolder& h) {
  const int64_t now = NowUnixMs();
  if (h.host.empty()) {
    return "an " + h.kind + " (written " + Seconds(now - h.heartbeat_unix_ms) + " s ago)";
  }
  return h.kind + " " + h.id + " of process " + std::to_string(h.pid) + " on host " + h.host +
         " (started " + Seconds(now - h.started_unix_ms) + " s ago, renewed " +
         Seconds(now - h.heartbeat_unix_ms) + " s ago)";
}

bool JudgedHere(const LockHolder& h) {
  // Same host name: its process can be judged here -- unless it ran under another kernel
  // (a restarted container or machine keeping its name) or in a pid namespace this process
  // cannot see: then its lease decides, as for another host.
  if (h.host.empty() || h.host != HostName()) return false;
  if (h.process.empty()) return true;
  const Identity id = SplitIdentity(h.process);
  return ProcessIdentity(::getpid()).rfind(id.boot + " " + id.ns + " ", 0) == 0;
}

std::string GoneHere(const LockHolder& h, bool kernel_lock) {
  const std::string start = SplitIdentity(h.process).start;
  // The kernel lock was free: a holder that takes it is gone (whatever its pid names now).
  if (kernel_lock && h.flock) return "its process is gone (the kernel released its lock)";
  if (!ProcessAlive(h.pid)) return "process " + std::to_string(h.pid) + " is gone";
  if (!start.empty() && StartTime(h.pid) != start) {
    return "process " + std::to_string(h.pid) + " is gone (the pid is another process's now)";
  }
  return "";
}

}  // namespace dcp::storage
