// Comm::IAllGatherV's and Comm::IScatterV's defaults: the all-gather of scattered memory as
// broadcasts, one per sender's large range (in place) and one per pack of its small ranges;
// the scatter as one broadcast of all parts packed.
#include <cstring>
#include <deque>

#include "comm/comm_util.h"

namespace dcp {
namespace {

// The broadcasts of one IAllGatherV, completed in call order; packed receptions are unpacked
// into their ranges once everything arrived.
class BroadcastsRequest final : public CommRequest {
 public:
  struct Pack {
    std::vector<std::byte> buf;
    std::vector<std::span<std::byte>> into;  // receiver: where the packed ranges go
    uint64_t skip = 0;                       // receiver: packed bytes before the first of them
  };

  ~BroadcastsRequest() override {
    // A failed or abandoned broadcast may still write into its pack (MPI cannot cancel):
    // packs outlive this request unless everything completed.
    if (!done_) {
      for (Pack& p : packs_) new std::vector<std::byte>(std::move(p.buf));
    }
  }

  std::vector<std::unique_ptr<CommRequest>> requests;

  Pack& NewPack() { return packs_.emplace_back(); }

  Status Wait() override {
    if (done_ || !status_.ok()) return status_;  // Test() may have seen a failure already
    for (auto& r : requests) {
      if (Status s = r->Wait(); !s.ok()) return status_ = s;
    }
    Finish();
    return status_;
  }

  Result<bool> Test() override {
    if (done_) {
      if (!status_.ok()) return status_;
      return true;
    }
    if (!status_.ok()) return status_;
    bool all = true;
    for (auto& r : requests) {
      auto t = r->Test();
      if (!t.ok()) return status_ = t.status();
      all = all && *t;
    }
    if (all) Finish();
    return all;
  }

 private:
  void Finish() {
    for (Pack& p : packs_) {
      uint64_t off = p.skip;
      for (std::span<std::byte> r : p.into) {
        if (!r.empty()) std::memcpy(r.data(), p.buf.data() + off, r.size());
        off += r.size();
      }
    }
    done_ = true;
  }

  std::deque<Pack> packs_;  // stable addresses: broadcasts hold their buffers
  bool done_ = false;
  Status status_;
};

}  // namespace

Result<std::unique_ptr<CommRequest>> Comm::IAllGatherV(const Ranges& mine,
                                                       const std::vector<Ranges>& from) {
  const int me = rank();
  DCP_RETURN_IF_ERROR(comm_internal::CheckGatherLists(from.size(), size()));
  auto req = std::make_unique<BroadcastsRequest>();
  for (int s = 0; s < size(); ++s) {
    const Ranges& ranges = s == me ? mine : from[s];
    BroadcastsRequest::Pack* pack = nullptr;
    auto flush = [&]() -> Status {
      if (pack == nullptr) return OkStatus();
      DCP_ASSIGN_OR_RETURN(auto r, IBroadcast(std::span(pack->buf), s));
      req->requests.push_back(std::move(r));
      pack = nullptr;
      return OkStatus();
    };
    for (std::span<std::byte> r : ranges) {
      if (r.empty()) continue;
      if (r.size() >= kInPlaceBytes) {
        DCP_RETURN_IF_ERROR(flush());
        DCP_ASSIGN_OR_RETURN(auto b, IBroadcast(r, s));
        req->requests.push_back(std::move(b));
        continue;
      }
      if (pack != nullptr && pack->buf.size() + r.size() > kPackBytes) DCP_RETURN_IF_ERROR(flush());
      if (pack == nullptr) pack = &req->NewPack();
      const size_t at = pack->buf.size();
      pack->buf.resize(at + r.size());
      if (s == me) {
        std::memcpy(pack->buf.data() + at, r.data(), r.size());
      } else {
        pack->into.push_back(r);
      }
    }
    DCP_RETURN_IF_ERROR(flush());
  }
  return std::unique_ptr<CommRequest>(std::move(req));
}

Result<std::unique_ptr<CommRequest>> Comm::IScatterV(const std::vector<Ranges>& to,
                                                     const Ranges& into,
                                                     const std::vector<uint64_t>& part_bytes,
                                                     int root) {
  const int me = rank();
  DCP_ASSIGN_OR_RETURN(const std::vector<uint64_t> offsets,
                       comm_internal::CheckScatterLists(to, into, part_bytes, root, me, size()));
  auto req = std::make_unique<BroadcastsRequest>();
  if (offsets.back() == 0) return std::unique_ptr<CommRequest>(std::move(req));
  BroadcastsRequest::Pack& pack = req->NewPack();
  pack.buf.resize(offsets.back());
  if (me == root) {
    comm_internal::PackParts(to, offsets, root, pack.buf.data());
  } else {
    pack.into = into;
    pack.skip = offsets[me];
  }
  DCP_ASSIGN_OR_RETURN(auto b, IBroadcast(std::span(pack.buf), root));
  req->requests.push_back(std::move(b));
  return std::unique_ptr<CommRequest>(std::move(req));
}

}  // namespace dcp
