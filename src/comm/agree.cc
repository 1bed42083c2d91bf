// Failure agreement: a rank's error becomes every rank's error.
#include <cstdint>

#include "dcp/comm.h"

namespace dcp {

Status AgreeOnStatus(Comm& comm, const Status& mine) {
  std::string msg;
  if (!mine.ok()) {
    msg.push_back(static_cast<char>(mine.code()));
    msg += mine.message();
  }
  auto all = comm.AllGather(msg);
  if (!all.ok()) return all.status();
  for (size_t r = 0; r < all->size(); ++r) {
    const std::string& s = (*all)[r];
    if (s.empty()) continue;
    auto code = static_cast<StatusCode>(static_cast<uint8_t>(s[0]));
    if (code == StatusCode::kOk) code = StatusCode::kInternal;
    if (comm.size() == 1) return Status(code, s.substr(1));
    return Status(code, "rank " + std::to_string(r) + ": " + s.substr(1));
  }
  return OkStatus();
}

}  // namespace dcp
