#include "comm/exchange.h"

namespace dcp {
namespace {

// The code byte's high bit says the status was already agreed by every rank (and prefixed
// with its rank), so agreeing on it again adds no second "rank R: ".
constexpr uint8_t kAgreedBit = 0x80;

std::string Encode(const Status& s) {
  std::string out(
      1, static_cast<char>(static_cast<uint8_t>(s.code()) | (s.agreed() ? kAgreedBit : 0)));
  out += s.message();
  return out;
}

bool IsAgreed(std::string_view m) { return (static_cast<uint8_t>(m[0]) & kAgreedBit) != 0; }

Status Decode(std::string_view m) {
  auto code = static_cast<StatusCode>(static_cast<uint8_t>(m[0]) & ~kAgreedBit);
  return Status(code == StatusCode::kOk ? StatusCode::kInternal : code, std::string(m.substr(1)));
}

}  // namespace

std::string TagOk(std::string_view payload) {
  std::string out(1, static_cast<char>(StatusCode::kOk));
  out += payload;
  return out;
}

std::string TagError(const Status& s) { return Encode(s); }

Result<std::vector<std::string_view>> UntagAll(const std::vector<std::string>& gathered) {
  std::vector<std::string_view> out;
  out.reserve(gathered.size());
  for (size_t r = 0; r < gathered.size(); ++r) {
    std::string_view m = gathered[r];
    if (m.empty()) return Internal("empty message from rank " + std::to_string(r));
    if (static_cast<StatusCode>(static_cast<uint8_t>(m[0])) != StatusCode::kOk) {
      Status s = Decode(m);
      if (gathered.size() == 1 || IsAgreed(m)) return s.MarkAgreed();
      return s.Annotate("rank " + std::to_string(r) + ": ").MarkAgreed();
    }
    out.push_back(m.substr(1));
  }
  return out;
}

Result<std::vector<std::string>> AllGatherOrFail(Comm& comm, const Status& mine_status,
                                                 std::string_view mine) {
  auto all = comm.AllGather(mine_status.ok() ? TagOk(mine) : TagError(mine_status));
  if (!all.ok()) return all.status();
  auto payloads = UntagAll(*all);
  if (!payloads.ok()) return payloads.status();
  for (std::string& m : *all) m.erase(0, 1);
  return all;
}

Status AgreeOnStatus(Comm& comm, const Status& mine) {
  return AllGatherOrFail(comm, mine, {}).status();
}

Result<std::string> BroadcastOrFail(Comm& comm, int root, const Status& root_status,
                                    std::string_view payload) {
  std::string m;
  if (comm.rank() == root) m = root_status.ok() ? TagOk(payload) : Encode(root_status);
  DCP_RETURN_IF_ERROR(comm.Broadcast(m, root));
  if (m.empty()) return Internal("empty message broadcast by rank " + std::to_string(root));
  if (static_cast<StatusCode>(static_cast<uint8_t>(m[0])) != StatusCode::kOk) {
    return Decode(m).MarkAgreed();
  }
  m.erase(0, 1);
  return m;
}

Status BroadcastStatus(Comm& comm, int root, const Status& s) {
  return BroadcastOrFail(comm, root, s, {}).status();
}

}  // namespace dcp
