#include "tier/file_transfer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

namespace dcp::tier {

Status PairGroups::Ensure(const std::vector<Transfer>& transfers) {
  const int me = world_->rank();
  std::set<std::pair<int, int>> pairs;
  for (const Transfer& t : transfers) {
    if (t.from == kFromStorage || t.from == t.to) continue;
    pairs.insert({std::min(t.from, t.to), std::max(t.from, t.to)});
  }
  // In ascending order on every rank: creation is collective over the two members, and a
  // global order keeps any rank from waiting on a member busy creating a later pair.
  for (const auto& p : pairs) {
    if ((p.first != me && p.second != me) || groups_.count(p)) continue;
    DCP_ASSIGN_OR_RETURN(auto g, world_->CreateGroup({p.first, p.second}));
    groups_[p] = std::move(g);
  }
  return OkStatus();
}

Comm& PairGroups::Of(int a, int b) { return *groups_.at({std::min(a, b), std::max(a, b)}); }

Status CopyFile(storage::FileSystem& from_fs, const std::string& from, storage::FileSystem& to_fs,
                const std::string& to, uint64_t piece_bytes, storage::StreamVerifier* verify) {
  DCP_ASSIGN_OR_RETURN(auto in, from_fs.OpenReadable(from));
  DCP_ASSIGN_OR_RETURN(auto out, to_fs.NewWritableFile(to));
  out->WillWrite(in->size());
  std::vector<std::byte> buf(std::min<uint64_t>(piece_bytes, std::max<uint64_t>(in->size(), 1)));
  // An object store fetches ahead; a file system's read-ahead follows these sequential reads.
  if (from_fs.IsObjectStore()) in->WillRead(std::vector<storage::ByteRange>{{0, in->size()}});
  for (uint64_t at = 0; at < in->size();) {
    const uint64_t n = std::min<uint64_t>(buf.size(), in->size() - at);
    DCP_RETURN_IF_ERROR(in->ReadAt(at, std::span(buf.data(), n)));
    if (verify) DCP_RETURN_IF_ERROR(verify->Add(at, std::span(buf.data(), n)));
    DCP_RETURN_IF_ERROR(out->Append(std::span(buf.data(), n)));
    at += n;
  }
  if (verify) DCP_RETURN_IF_ERROR(verify->Finish());
  DCP_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

namespace {

// One piece of one transfer, as this rank sees it.
struct Piece {
  const Transfer* t;
  uint64_t offset;
  uint64_t length;
  bool send;   // this rank sends it (else receives)
  bool first;  // of its transfer
  bool last;
};

// The transfers' pieces this rank takes part in, in the global order: by piece number, then
// by transfer, so every link carries its first pieces at once (ordered by transfer alone, a
// rank would receive all of one file before sending its own: a chain of links one after the
// other). Any order every rank shares keeps the oldest unfinished piece posted at both ends.
std::vector<Piece> PiecesOf(const std::vector<Transfer>& transfers, int me, uint64_t piece) {
  struct Keyed {
    size_t k, transfer;
    Piece p;
  };
  std::vector<Keyed> out;
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    if (t.from == kFromStorage || (t.from != me && t.to != me)) continue;
    const std::vector<Span> whole{{0, t.size}};
    const size_t begin = out.size();
    size_t k = 0;
    for (const Span& s : t.spans.empty() ? whole : t.spans) {
      for (uint64_t at = s.offset; at < s.offset + s.length; at += piece) {
        out.push_back(
            {k++,
             i,
             {&t, at, std::min(piece, s.offset + s.length - at), t.from == me, false, false}});
      }
    }
    if (out.size() > begin) {
      out[begin].p.first = true;
      out.back().p.last = true;
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Keyed& a, const Keyed& b) {
    return std::tie(a.k, a.transfer) < std::tie(b.k, b.transfer);
  });
  std::vector<Piece> pieces;
  for (const Keyed& x : out) pieces.push_back(x.p);
  return pieces;
}

// A received file on the local (POSIX: the tier is tmpfs) directory, written at offsets: a
// sparse copy of `size` bytes when only some spans come.
class LocalWriter {
 public:
  ~LocalWriter() { Close(); }
  Status Open(const std::string& path, uint64_t size) {
    Close();
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_ < 0) return ErrnoStatus("create", path, errno);
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return ErrnoStatus("size", path, errno);
    return OkStatus();
  }
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) {
    while (!data.empty()) {
      const ssize_t n = ::pwrite(fd_, data.data(), data.size(), static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return ErrnoStatus("write", path_, n < 0 ? errno : EIO);
      data = data.subspan(static_cast<size_t>(n));
      offset += static_cast<uint64_t>(n);
    }
    return OkStatus();
  }
  Status Finish() {
    Status s = ::fdatasync(fd_) == 0 ? OkStatus() : ErrnoStatus("sync", path_, errno);
    if (::close(fd_) != 0 && s.ok()) s = ErrnoStatus("close", path_, errno);
    fd_ = -1;
    return s;
  }
  bool open() const { return fd_ >= 0; }

 private:
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  std::string path_;
  int fd_ = -1;
};

// Copies transfer `t`'s spans (all of the file when it has none) of `from` into a new local
// file `to` of t.size bytes, each piece checked by `verify` (when given) as it passes.
Status CopySpans(storage::FileSystem& from_fs, const std::string& from, const std::string& to,
                 const Transfer& t, uint64_t piece_bytes, storage::StreamVerifier* verify) {
  DCP_ASSIGN_OR_RETURN(auto in, from_fs.OpenReadable(from));
  if (in->size() != t.size) {
    return DataLoss(from + " is " + std::to_string(in->size()) + " bytes, expected " +
                    std::to_string(t.size));
  }
  const std::vector<Span> spans = t.spans.empty() ? std::vector<Span>{{0, t.size}} : t.spans;
  if (from_fs.IsObjectStore()) in->WillRead(spans);
  LocalWriter out;
  DCP_RETURN_IF_ERROR(out.Open(to, t.size));
  std::vector<std::byte> buf;
  for (const Span& s : spans) {
    for (uint64_t at = s.offset; at < s.offset + s.length;) {
      const uint64_t n = std::min(piece_bytes, s.offset + s.length - at);
      buf.resize(n);
      DCP_RETURN_IF_ERROR(in->ReadAt(at, buf));
      DCP_RETURN_IF_ERROR(out.WriteAt(at, buf));
      if (verify) DCP_RETURN_IF_ERROR(verify->Add(at, buf));
      at += n;
    }
  }
  DCP_RETURN_IF_ERROR(out.Finish());
  return verify ? verify->Finish() : OkStatus();
}

class Mover {
 public:
  Mover(PairGroups& groups, const TransferDirs& dirs, const TransferOptions& opts,
        const CheckReceived& check, TransferStats* stats)
      : groups_(groups), dirs_(dirs), opts_(opts), check_(check), stats_(stats) {}

  Status Run(const std::vector<Transfer>& transfers) {
    const int me = groups_.world().rank();
    // Copies from storage first: no peer waits on them.
    for (const Transfer& t : transfers) {
      if (t.to != me) continue;
      if (t.from == kFromStorage) {
        Keep(Receive(t, [&](const std::string& part) -> Status {
          if (!dirs_.storage_fs || dirs_.storage_dir.empty()) {
            return FailedPrecondition("no durable copy of the step to copy from");
          }
          std::optional<storage::StreamVerifier> verify;
          if (check_) {
            DCP_ASSIGN_OR_RETURN(auto v, check_(t));
            verify.emplace(std::move(v));
          }
          return CopySpans(*dirs_.storage_fs, storage::JoinPath(dirs_.storage_dir, t.file), part, t,
                           piece_bytes(), verify ? &*verify : nullptr);
        }));
      } else if (t.bytes() == 0) {
        Keep(Receive(t, [&](const std::string& part) {
          LocalWriter w;
          DCP_RETURN_IF_ERROR(w.Open(part, t.size));
          return w.Finish();
        }));
      }
    }
    const auto start = std::chrono::steady_clock::now();
    const auto pieces = PiecesOf(transfers, me, piece_bytes());
    for (const Piece& p : pieces) {
      while (in_flight_.size() >= static_cast<size_t>(std::max(opts_.window, 1))) {
        DCP_RETURN_IF_ERROR(CompleteOldest());
      }
      Op op{p, TakeBuffer(), nullptr};
      const std::span<std::byte> buf(op.buf.get(), p.length);
      if (p.send) {
        // A transfer whose file could not be read sends zeros for the rest (never a reused
        // buffer's bytes): its receiver rejects it by the checksums, and it is a failure here.
        if (!unreadable_.count(p.t)) {
          if (Status s = ReadPiece(p, buf); !s.ok()) {
            unreadable_.insert(p.t);
            stats_->failed.push_back({*p.t, /*damaged=*/true});
            Keep(s);
          }
        }
        if (unreadable_.count(p.t)) std::memset(buf.data(), 0, buf.size());
      }
      const int root = p.t->from < p.t->to ? 0 : 1;
      DCP_ASSIGN_OR_RETURN(op.request, groups_.Of(p.t->from, p.t->to).IBroadcast(buf, root));
      in_flight_.push_back(std::move(op));
      if (p.send) {
        stats_->bytes_sent += p.length;
        if (opts_.max_bytes_per_second > 0) {  // paced: never ahead of the allowed rate
          std::this_thread::sleep_until(
              start +
              std::chrono::duration<double>(static_cast<double>(stats_->bytes_sent) /
                                            static_cast<double>(opts_.max_bytes_per_second)));
        }
      }
    }
    while (!in_flight_.empty()) DCP_RETURN_IF_ERROR(CompleteOldest());
    stats_->local_failure = failed_;
    return OkStatus();
  }

 private:
  struct Op {
    Piece piece;
    std::unique_ptr<std::byte[]> buf;  // of piece_bytes; the piece's bytes first
    std::unique_ptr<CommRequest> request;
  };

  // Buffers of finished pieces are taken again: a fresh one would be faulted in (and, as a
  // vector, zeroed) for every piece.
  std::unique_ptr<std::byte[]> TakeBuffer() {
    if (free_.empty()) return std::make_unique_for_overwrite<std::byte[]>(piece_bytes());
    auto b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  uint64_t piece_bytes() const { return std::max<uint64_t>(opts_.piece_bytes, 1); }

  void Keep(const Status& s) {
    if (failed_.ok() && !s.ok()) failed_ = s;
  }

  // Writes `t.file` through `fill(part path)` (which also checks it) and gives it its name.
  // A sparse copy is marked first (SparseMarkerName), so that no inventory takes it for a copy
  // of the file.
  Status Receive(const Transfer& t, const std::function<Status(const std::string&)>& fill) {
    const std::string path = storage::JoinPath(dirs_.local_dir, t.file);
    const std::string part = path + ".part";
    Status s;
    if (!t.spans.empty()) {
      LocalWriter marker;
      s = marker.Open(storage::JoinPath(dirs_.local_dir, SparseMarkerName(t.file)), 0);
      if (s.ok()) s = marker.Finish();
      if (s.ok()) stats_->sparse_files.push_back(t.file);
    }
    if (s.ok()) s = fill(part);
    if (s.ok()) s = dirs_.local_fs->Rename(part, path);
    if (!s.ok()) {
      (void)dirs_.local_fs->Remove(part);
      stats_->failed.push_back({t, damage_});
      damage_ = false;
      return s.Annotate(
          "receiving " + t.file + " from " +
          (t.from == kFromStorage ? std::string("storage") : "rank " + std::to_string(t.from)) +
          ": ");
    }
    ++stats_->files_received;
    if (t.from == kFromStorage) {
      ++stats_->files_from_storage;
      stats_->bytes_copied_from_storage += t.size;
    }
    return OkStatus();
  }

  Status ReadPiece(const Piece& p, std::span<std::byte> buf) {
    auto& file = reading_[p.t];
    if (!file) {
      auto f = dirs_.local_fs->OpenReadable(storage::JoinPath(dirs_.local_dir, p.t->file));
      if (!f.ok()) return f.status().Annotate("sending to rank " + std::to_string(p.t->to) + ": ");
      file = std::move(f).value();
    }
    Status s = file->ReadAt(p.offset, buf);
    if (p.last) reading_.erase(p.t);
    return s.Annotate("sending to rank " + std::to_string(p.t->to) + ": ");
  }

  Status CompleteOldest() {
    Op op = std::move(in_flight_.front());
    in_flight_.pop_front();
    if (Status s = op.request->Wait(); !s.ok()) {
      // The backend may still write into the buffer (MPI cannot cancel): leave it allocated.
      (void)op.buf.release();
      return s.Annotate("file transfer with rank " +
                        std::to_string(op.piece.send ? op.piece.t->to : op.piece.t->from) + ": ");
    }
    const std::span<const std::byte> buf(op.buf.get(), op.piece.length);
    free_.push_back(std::move(op.buf));
    if (op.piece.send) return OkStatus();
    stats_->bytes_received += op.piece.length;
    const Transfer& t = *op.piece.t;
    const std::string part = storage::JoinPath(dirs_.local_dir, t.file) + ".part";
    Writing& w = writing_[&t];
    Status s;
    if (op.piece.first) {
      s = w.file.Open(part, t.size);
      if (s.ok() && check_) {
        auto v = check_(t);
        s = v.status();
        if (v.ok()) w.verify.emplace(std::move(v).value());
      }
    }
    bool damage = false;  // the bytes, not this rank's disk
    if (s.ok() && w.ok) {
      s = w.file.WriteAt(op.piece.offset, buf);
      if (s.ok() && w.verify) {
        s = w.verify->Add(op.piece.offset, buf);
        damage = !s.ok();
      }
    }
    if (!s.ok() && w.ok) {  // the rest of its pieces still come, and are dropped
      w.ok = false;
      (void)dirs_.local_fs->Remove(part);
      stats_->failed.push_back({t, damage});
      Keep(s.Annotate("receiving " + t.file + " from rank " + std::to_string(t.from) + ": "));
    }
    if (op.piece.last) {
      if (w.ok) {
        Keep(Receive(t, [&](const std::string&) {
          Status done = w.file.Finish();
          if (done.ok() && w.verify) {
            done = w.verify->Finish();
            damage_ = !done.ok();
          }
          return done;
        }));
      }
      writing_.erase(&t);
    }
    return OkStatus();
  }

  PairGroups& groups_;
  const TransferDirs& dirs_;
  const TransferOptions& opts_;
  const CheckReceived& check_;
  TransferStats* stats_;
  std::deque<Op> in_flight_;
  std::vector<std::unique_ptr<std::byte[]>> free_;
  // Open per transfer: pieces of several files interleave.
  std::map<const Transfer*, std::unique_ptr<storage::ReadableFile>> reading_;
  struct Writing {
    LocalWriter file;
    std::optional<storage::StreamVerifier> verify;
    bool ok = true;
  };
  std::map<const Transfer*, Writing> writing_;
  Status failed_;
  bool damage_ = false;  // the receive being finished failed its checksums (Receive)
  std::set<const Transfer*> unreadable_;  // sends whose file could not be read
};

}  // namespace

std::string SparseMarkerName(const std::string& file) { return file + ".sparse"; }

Status TransferFiles(PairGroups& groups, const std::vector<Transfer>& transfers,
                     const TransferDirs& dirs, const TransferOptions& opts,
                     const CheckReceived& check, TransferStats* stats) {
  DCP_RETURN_IF_ERROR(groups.Ensure(transfers));
  Mover mover(groups, dirs, opts, check, stats);
  return mover.Run(transfers);
}

}  // namespace dcp::tier
