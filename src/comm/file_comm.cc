// A coordinator over a shared filesystem: no communication group needed, only a directory
// every rank can see.
//
// Protocol. A communicator's messages live in its own directory, `{dir}/.dcp-comm/c{k}` for
// the k-th FileComm over `dir` and `group{n}-{members}` below that for groups. Call number
// `seq` of operation `op` by rank `r` publishes its contribution as `{seq}-{op}-r{r}` there:
// written to a hidden tmp name, then renamed, so a reader sees either nothing or the whole file.
// The file ends in a fixed footer (payload length, XXH3-64 of the payload, magic) so that a
// filesystem that shows a partial file after a rename (some network filesystems with loose
// consistency) is still detected: such a file counts as not there yet. Readers poll, sleeping 1 ms
// growing to 50 ms, until every expected file is complete or the timeout passes. No fsync: these
// files coordinate live processes, they need not survive a crash.
//
// Runs. A job restarted over the same directory must never read the files of an earlier run
// (its names start at call 0 again), so the first call of a communicator agrees on a run
// nonce: every rank publishes `hello-r{r}` (a fresh random nonce), rank 0 publishes `run` (its
// own nonce, every rank's hello as it read it, who acknowledged) and rewrites it whenever that
// changes, a rank trusts `run` only once it holds its own fresh nonce and answers `ack-r{r}`
// with rank 0's nonce, and every rank goes on once `run` says all acknowledged. The run's messages
// then live in `s{nonce}` below: stale hellos, runs and acks are told apart by the nonces, stale
// messages sit in another run's directory. Groups live inside the run's directory.
//
// Clean-up. A writer may delete its file of call s only when every reader is done with it.
// A rank knows that once it read the contributions of *all* ranks for some later call t
// (AllGather, Barrier, Gather at the root): a rank that wrote t has returned from every call
// before t. One-sided calls (Broadcast, Gather at non-roots) prove nothing about readers, so
// their files wait for the next all-to-all call or stay until the directory is removed.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <tuple>

#include "comm/comm_util.h"
#include "dcp/comm.h"

namespace dcp {
namespace {

namespace fs = std::filesystem;
using comm_internal::Clock;

constexpr uint64_t kFooterMagic = 0x314d4d4f43504344;  // "DCPCOMM1" little-endian
constexpr size_t kFooterSize = 3 * sizeof(uint64_t);   // length, xxh3-64, magic

// Writes all of `data` to `fd`.
Status WriteAll(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return ErrnoStatus("write", path, errno);
    data += w;
    n -= static_cast<size_t>(w);
  }
  return OkStatus();
}

enum class ReadState { kMissing, kIncomplete, kReady };

// Reads a published file: kMissing if absent, kIncomplete if its footer does not check out.
Result<ReadState> ReadMessage(const std::string& path, std::string* payload) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return ReadState::kMissing;
    return ErrnoStatus("open", path, errno);
  }
  std::string buf;
  struct stat st;
  Status status;
  if (::fstat(fd, &st) != 0) {
    status = ErrnoStatus("stat", path, errno);
  } else {
    buf.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < buf.size()) {
      ssize_t r = ::read(fd, buf.data() + done, buf.size() - done);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        status = ErrnoStatus("read", path, errno);
        break;
      }
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    buf.resize(done);
  }
  ::close(fd);
  DCP_RETURN_IF_ERROR(status);
  if (buf.size() < kFooterSize) return ReadState::kIncomplete;
  uint64_t footer[3];
  std::memcpy(footer, buf.data() + buf.size() - kFooterSize, kFooterSize);
  size_t len = buf.size() - kFooterSize;
  if (footer[2] != kFooterMagic || footer[0] != len || footer[1] != XXH3_64bits(buf.data(), len)) {
    return ReadState::kIncomplete;
  }
  buf.resize(len);
  *payload = std::move(buf);
  return ReadState::kReady;
}

// Publishes `payload` at `path` whole (a hidden tmp name, then rename), with the footer.
Status PublishFile(const std::string& path, const std::string& tmp, std::string_view payload) {
  uint64_t footer[3] = {payload.size(), XXH3_64bits(payload.data(), payload.size()), kFooterMagic};
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0 && errno == ENOENT) {
    // A rank that left removed the directory while it was empty; recreate it.
    std::error_code ec;
    fs::create_directories(fs::path(tmp).parent_path(), ec);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  }
  if (fd < 0) return ErrnoStatus("create", tmp, errno);
  Status s = WriteAll(fd, payload.data(), payload.size(), tmp);
  if (s.ok()) s = WriteAll(fd, reinterpret_cast<const char*>(footer), kFooterSize, tmp);
  if (::close(fd) != 0 && s.ok()) s = ErrnoStatus("close", tmp, errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoStatus("rename", tmp, errno);
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

uint64_t FreshNonce() {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}() ^
                             static_cast<uint64_t>(Clock::now().time_since_epoch().count())};
  std::lock_guard<std::mutex> lock(mu);
  uint64_t n;
  do n = gen();
  while (n == 0);
  return n;
}

std::string Hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof(b), "%016llx", static_cast<unsigned long long>(v));
  return b;
}

class FileCommImpl final : public Comm {
 public:
  // A top-level communicator: `base_dir` holds the handshake files and one directory per run
  // (agreed on first use). A group (`in_run`): `base_dir` is its own message directory inside
  // its parent's run.
  FileCommImpl(fs::path base_dir, int rank, int size, bool in_run)
      : base_dir_(std::move(base_dir)), rank_(rank), size_(size), in_run_(in_run) {
    if (in_run_) comm_dir_ = base_dir_;
  }

  ~FileCommImpl() override {
    // Best effort: only files every reader is known to be done with; then the directory if it
    // is empty (the last rank to leave removes it). The handshake files stay: a rank that
    // leaves early must not take its ack from under rank 0.
    RemoveOwnFilesBefore(read_by_all_before_);
    std::error_code ec;
    if (!comm_dir_.empty() && fs::remove(comm_dir_, ec) && in_run_) {
      fs::remove(comm_dir_.parent_path(), ec);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "file"; }
  bool moves_tensor_data() const override { return false; }

  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    uint64_t seq = seq_++;
    DCP_RETURN_IF_ERROR(Publish(seq, "AllGather", mine));
    std::vector<std::string> out(size_);
    DCP_RETURN_IF_ERROR(AwaitAll(seq, "AllGather", &out));
    return out;
  }

  Result<std::vector<std::string>> Gather(std::string_view mine, int root) override {
    DCP_RETURN_IF_ERROR(comm_internal::CheckRoot("Gather", root, size_));
    uint64_t seq = seq_++;
    DCP_RETURN_IF_ERROR(Publish(seq, "Gather", mine));
    std::vector<std::string> out;
    if (rank_ != root) return out;
    out.resize(size_);
    DCP_RETURN_IF_ERROR(AwaitAll(seq, "Gather", &out));
    return out;
  }

  Status Broadcast(std::string& data, int root) override {
    DCP_RETURN_IF_ERROR(comm_internal::CheckRoot("Broadcast", root, size_));
    uint64_t seq = seq_++;
    if (rank_ == root) return Publish(seq, "Broadcast", data);
    std::vector<std::string> out(size_);
    DCP_RETURN_IF_ERROR(Await(seq, "Broadcast", {root}, &out));
    data = std::move(out[root]);
    return OkStatus();
  }

  Status Barrier() override {
    uint64_t seq = seq_++;
    DCP_RETURN_IF_ERROR(Publish(seq, "Barrier", {}));
    std::vector<std::string> out(size_);
    return AwaitAll(seq, "Barrier", &out);
  }

  // Completes before returning: this backend carries plans, not tensor data.
  Result<std::unique_ptr<CommRequest>> IBroadcast(std::span<std::byte> buf, int root) override {
    std::string data;
    if (rank_ == root) data.assign(reinterpret_cast<const char*>(buf.data()), buf.size());
    DCP_RETURN_IF_ERROR(Broadcast(data, root));
    if (data.size() != buf.size()) {
      return InvalidArgument("IBroadcast buffer sizes differ: root " + std::to_string(root) +
                             " sent " + std::to_string(data.size()) + " bytes, rank " +
                             std::to_string(rank_) + " expects " + std::to_string(buf.size()));
    }
    if (!data.empty()) std::memcpy(buf.data(), data.data(), data.size());
    return comm_internal::CompletedRequest(OkStatus());
  }

  Result<std::shared_ptr<Comm>> CreateGroup(const std::vector<int>& ranks) override {
    DCP_RETURN_IF_ERROR(comm_internal::CheckGroupRanks(ranks, rank_, size_));
    DCP_RETURN_IF_ERROR(JoinRun("CreateGroup"));
    // Members create groups in the same order, so (member list, nth creation of it) names the
    // same directory on each of them and never a directory of an earlier group.
    int nth = creations_[ranks]++;
    std::string members = comm_internal::JoinRanks(ranks);
    for (char& c : members) c = c == ',' ? '_' : c;
    members.erase(std::remove(members.begin(), members.end(), ' '), members.end());
    if (members.size() > 64) {
      // Keep the name short enough for any filesystem; collisions need equal size and hash.
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%016llx",
                    static_cast<unsigned long long>(XXH3_64bits(members.data(), members.size())));
      members = std::to_string(ranks.size()) + "of" + hex;
    }
    fs::path dir = comm_dir_ / ("group" + std::to_string(nth) + "-" + members);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return ErrnoStatus("create directory", dir.string(), ec.value());
    auto comm = std::make_shared<FileCommImpl>(dir, comm_internal::IndexOf(ranks, rank_),
                                               static_cast<int>(ranks.size()), /*in_run=*/true);
    comm->set_timeout(timeout());
    return std::shared_ptr<Comm>(std::move(comm));
  }

 private:
  std::string PathOf(uint64_t seq, std::string_view op, int rank) const {
    return (comm_dir_ / (std::to_string(seq) + "-" + std::string(op) + "-r" + std::to_string(rank)))
        .string();
  }

  Status Publish(uint64_t seq, std::string_view op, std::string_view payload) {
    DCP_RETURN_IF_ERROR(JoinRun(op));
    std::string path = PathOf(seq, op, rank_);
    std::string tmp = (comm_dir_ / (".tmp-" + std::to_string(seq) + "-" + std::string(op) + "-r" +
                                    std::to_string(rank_)))
                          .string();
    DCP_RETURN_IF_ERROR(PublishFile(path, tmp, payload));
    written_.emplace_back(seq, path);
    return OkStatus();
  }

  // The run handshake (see the top of this file), on the first call (`op`, named by a
  // timeout). `run` holds rank 0's nonce, every rank's hello as rank 0 read it, a byte per rank
  // (its ack carries rank 0's nonce) and a last byte: complete. Every rank returns once a
  // complete `run` holds its own nonce, so an absent rank keeps all of them here and each
  // names it.
  Status JoinRun(std::string_view op) {
    if (!comm_dir_.empty()) return OkStatus();
    const uint64_t mine = FreshNonce();
    auto file = [&](const std::string& name) { return (base_dir_ / name).string(); };
    auto publish = [&](const std::string& name, std::string_view payload) {
      return PublishFile(file(name), file(".tmp-" + name), payload);
    };
    auto read = [&](const std::string& name, std::string* out) -> Result<bool> {
      DCP_ASSIGN_OR_RETURN(ReadState st, ReadMessage(file(name), out));
      return st == ReadState::kReady;
    };
    auto u64 = [](const std::string& s, size_t i) {
      uint64_t v = 0;
      if (s.size() >= (i + 1) * 8) std::memcpy(&v, s.data() + i * 8, 8);
      return v;
    };
    auto bytes = [](uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); };
    const size_t n = static_cast<size_t>(size_);
    const size_t run_size = 8 * n + n + 1;
    DCP_RETURN_IF_ERROR(publish("hello-r" + std::to_string(rank_), bytes(mine)));
    const Clock::time_point deadline = Clock::now() + timeout();
    comm_internal::Backoff backoff(std::chrono::milliseconds(1), std::chrono::milliseconds(50));
    std::string written;  // rank 0: the `run` it published last
    bool acked = false;
    std::vector<int> missing;
    while (true) {
      std::string run;
      if (rank_ == 0) {
        run = bytes(mine);
        std::string hello, ack;
        for (int r = 1; r < size_; ++r) {
          DCP_ASSIGN_OR_RETURN(bool ok, read("hello-r" + std::to_string(r), &hello));
          run += ok && hello.size() == 8 ? hello : bytes(0);
        }
        bool all = true;
        run += '\1';
        for (int r = 1; r < size_; ++r) {
          DCP_ASSIGN_OR_RETURN(bool ok, read("ack-r" + std::to_string(r), &ack));
          const bool yes = ok && u64(ack, 0) == mine;
          run += yes ? '\1' : '\0';
          all = all && yes;
        }
        run += all ? '\1' : '\0';
        if (run != written) {
          DCP_RETURN_IF_ERROR(publish("run", run));
          written = run;
        }
      } else {
        DCP_ASSIGN_OR_RETURN(bool ok, read("run", &run));
        if (!ok || run.size() != run_size || u64(run, static_cast<size_t>(rank_)) != mine) {
          run.clear();  // none yet, or an earlier run's
        } else if (!acked) {
          DCP_RETURN_IF_ERROR(publish("ack-r" + std::to_string(rank_), bytes(u64(run, 0))));
          acked = true;
        }
      }
      if (!run.empty() && run.back() == '\1') {
        comm_dir_ = base_dir_ / ("s" + Hex(u64(run, 0)));
        break;
      }
      if (Clock::now() >= deadline) {
        missing.clear();
        for (int r = 0; r < size_; ++r) {
          if (run.empty() ? r == 0 : run[8 * n + static_cast<size_t>(r)] == '\0') {
            missing.push_back(r);
          }
        }
        return comm_internal::TimeoutStatus(
            "file", op, 0, timeout(), missing, size_,
            "at the run handshake of the first call; directory " + base_dir_.string());
      }
      backoff.Sleep(deadline);
    }
    std::error_code ec;
    fs::create_directories(comm_dir_, ec);
    if (ec) return ErrnoStatus("create directory", comm_dir_.string(), ec.value());
    return OkStatus();
  }

  // Reads every rank's file of call `seq`; then every rank has finished the calls before it.
  Status AwaitAll(uint64_t seq, std::string_view op, std::vector<std::string>* out) {
    std::vector<int> all(size_);
    for (int r = 0; r < size_; ++r) all[r] = r;
    DCP_RETURN_IF_ERROR(Await(seq, op, all, out));
    read_by_all_before_ = seq;
    RemoveOwnFilesBefore(seq);
    return OkStatus();
  }

  // Polls until the files of `ranks` for call `seq` are complete; (*out)[r] gets rank r's.
  Status Await(uint64_t seq, std::string_view op, std::vector<int> ranks,
               std::vector<std::string>* out) {
    DCP_RETURN_IF_ERROR(JoinRun(op));
    Clock::time_point deadline = Clock::now() + timeout();
    comm_internal::Backoff backoff(std::chrono::milliseconds(1), std::chrono::milliseconds(50));
    std::vector<int> incomplete;
    while (true) {
      std::vector<int> missing;
      incomplete.clear();
      for (int r : ranks) {
        std::string path = PathOf(seq, op, r);
        DCP_ASSIGN_OR_RETURN(ReadState state, ReadMessage(path, &(*out)[r]));
        if (state == ReadState::kReady) continue;
        missing.push_back(r);
        if (state == ReadState::kIncomplete) incomplete.push_back(r);
      }
      ranks = std::move(missing);
      if (ranks.empty()) return OkStatus();
      if (Clock::now() >= deadline) break;
      backoff.Sleep(deadline);
    }
    return comm_internal::TimeoutStatus("file", op, seq, timeout(), ranks, size_,
                                        Explain(seq, op, ranks, incomplete));
  }

  // Why the ranks in `missing` may be absent, for the timeout message: a different call at
  // the same sequence number (mismatched collectives) or a file that never became complete.
  std::string Explain(uint64_t seq, std::string_view op, const std::vector<int>& missing,
                      const std::vector<int>& incomplete) const {
    std::string detail = "directory " + comm_dir_.string();
    if (!incomplete.empty()) {
      detail += "; incomplete file from rank(s) " + comm_internal::JoinRanks(incomplete);
    }
    std::error_code ec;
    std::string prefix = std::to_string(seq) + "-";
    for (const auto& entry : fs::directory_iterator(comm_dir_, ec)) {
      std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      size_t dash = name.rfind("-r");
      if (dash == std::string::npos) continue;
      std::string other_op = name.substr(prefix.size(), dash - prefix.size());
      int r = std::atoi(name.c_str() + dash + 2);
      if (other_op != op && std::find(missing.begin(), missing.end(), r) != missing.end()) {
        detail += "; rank " + std::to_string(r) + " called " + other_op + " instead";
      }
    }
    return detail;
  }

  void RemoveOwnFilesBefore(uint64_t seq) {
    while (!written_.empty() && written_.front().first < seq) {
      ::unlink(written_.front().second.c_str());  // best effort: a leftover is harmless
      written_.pop_front();
    }
  }

  const fs::path base_dir_;
  fs::path comm_dir_;  // this run's messages; empty until the handshake
  const int rank_;
  const int size_;
  const bool in_run_;
  uint64_t seq_ = 0;
  uint64_t read_by_all_before_ = 0;  // every rank finished the calls below this number
  std::deque<std::pair<uint64_t, std::string>> written_;  // own files not yet removed
  std::map<std::vector<int>, int> creations_;             // CreateGroup calls per member list
};

}  // namespace

std::shared_ptr<Comm> FileComm(std::string dir, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(InvalidArgument("FileComm rank " + std::to_string(rank) + " of size " +
                                std::to_string(size) + " is out of range"));
  }
  // The k-th FileComm a rank opens over `dir` uses its own subdirectory, so a later one in the
  // same job never reads the files an earlier one left behind. Every rank opens them in the
  // same order, so k agrees; the key includes the rank because tests run ranks as threads.
  static std::mutex mu;
  static std::map<std::tuple<std::string, int, int>, int> opened;  // guarded by mu
  int k;
  {
    std::lock_guard<std::mutex> lock(mu);
    k = opened[{fs::absolute(dir).lexically_normal().string(), rank, size}]++;
  }
  fs::path comm_dir = fs::path(dir) / ".dcp-comm" / ("c" + std::to_string(k));
  std::error_code ec;
  fs::create_directories(comm_dir, ec);
  if (ec) throw Error(ErrnoStatus("create directory", comm_dir.string(), ec.value()));
  return std::make_shared<FileCommImpl>(std::move(comm_dir), rank, size, /*in_run=*/false);
}

}  // namespace dcp
