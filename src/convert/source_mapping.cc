#include "convert/source_mapping.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>

namespace dcp::convert {
namespace {

// The mappings the handler may repair: read by a signal handler, so plain atomics in a fixed
// table (no allocation, no locks on its side).
struct Slot {
  std::atomic<uintptr_t> begin{0};  // 0: free
  std::atomic<uintptr_t> end{0};
  std::atomic<bool> faulted{false};
};
constexpr int kSlots = 4096;
Slot g_slots[kSlots];
struct sigaction g_previous;
uintptr_t g_page = 4096;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Slot& s : g_slots) {
    const uintptr_t begin = s.begin.load(std::memory_order_acquire);
    if (begin == 0 || addr < begin || addr >= s.end.load(std::memory_order_acquire)) continue;
    // Past the file's end: a zero page in its place, so the read completes; Check() reports it.
    void* at = reinterpret_cast<void*>(addr & ~(g_page - 1));
    if (::mmap(at, g_page, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) !=
        MAP_FAILED) {
      s.faulted.store(true, std::memory_order_release);
      return;
    }
    break;
  }
  // Not ours (or not repairable): what SIGBUS did before, from the faulting instruction again.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    return g_previous.sa_handler(sig);
  }
  ::signal(SIGBUS, SIG_DFL);
}

void InstallHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    struct sigaction sa = {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous);
  });
}

}  // namespace

Result<std::unique_ptr<SourceMapping>> SourceMapping::Open(const std::string& path, uint64_t size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open", path, errno);
  if (size == 0) return std::unique_ptr<SourceMapping>(new SourceMapping(path, fd, nullptr, 0, -1));
  InstallHandler();
  int slot = -1;
  for (int i = 0; i < kSlots && slot < 0; ++i) {
    uintptr_t free = 0;
    // Claimed with a marker first; the real range is published once mapped.
    if (g_slots[i].begin.compare_exchange_strong(free, 1)) slot = i;
  }
  if (slot < 0) {
    ::close(fd);
    return FailedPrecondition("cannot map " + path + ": more than " + std::to_string(kSlots) +
                              " source files mapped at once");
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    g_slots[slot].begin.store(0);
    ::close(fd);
    return ErrnoStatus("mmap", path, err);
  }
  // Read once, front to back: read ahead aggressively, and let pages go after use.
  ::madvise(p, size, MADV_SEQUENTIAL);
  g_slots[slot].faulted.store(false);
  g_slots[slot].end.store(reinterpret_cast<uintptr_t>(p) + size, std::memory_order_release);
  g_slots[slot].begin.store(reinterpret_cast<uintptr_t>(p), std::memory_order_release);
  return std::unique_ptr<SourceMapping>(
      new SourceMapping(path, fd, static_cast<std::byte*>(p), size, slot));
}

SourceMapping::~SourceMapping() {
  if (slot_ >= 0) {
    ::munmap(data_, size_);
    g_slots[slot_].end.store(0);
    g_slots[slot_].begin.store(0, std::memory_order_release);
  }
  ::close(fd_);
}

Status SourceMapping::Check() const {
  struct stat st;
  const bool faulted = slot_ >= 0 && g_slots[slot_].faulted.load(std::memory_order_acquire);
  if (::fstat(fd_, &st) != 0) return ErrnoStatus("stat", path_, errno);
  if (faulted || static_cast<uint64_t>(st.st_size) != size_) {
    return FailedPrecondition("source file " + path_ + " changed size during the conversion (" +
                              std::to_string(size_) + " bytes when opened, " +
                              std::to_string(st.st_size) + " now" +
                              (faulted ? "; bytes past its new end were read as zeros" : "") +
                              "); another job rewrote it? Convert again once it is complete");
  }
  return OkStatus();
}

}  // namespace dcp::convert
