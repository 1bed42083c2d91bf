// A world of one: every collective returns the caller's own contribution.
#include "comm/comm_util.h"
#include "dcp/comm.h"

namespace dcp {
namespace {

using comm_internal::CheckGroupRanks;
using comm_internal::CheckRoot;

class LocalCommImpl final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "local"; }
  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    return std::vector<std::string>{std::string(mine)};
  }
  Result<std::vector<std::string>> Gather(std::string_view mine, int root) override {
    DCP_RETURN_IF_ERROR(CheckRoot("gather", root, 1));
    return std::vector<std::string>{std::string(mine)};
  }
  Status Broadcast(std::string&, int root) override { return CheckRoot("broadcast", root, 1); }
  Status Barrier() override { return OkStatus(); }
  Result<std::unique_ptr<CommRequest>> IBroadcast(std::span<std::byte>, int root) override {
    DCP_RETURN_IF_ERROR(CheckRoot("ibroadcast", root, 1));
    return comm_internal::CompletedRequest(OkStatus());
  }
  Result<std::shared_ptr<Comm>> CreateGroup(const std::vector<int>& ranks) override {
    DCP_RETURN_IF_ERROR(CheckGroupRanks(ranks, 0, 1));
    auto group = std::make_shared<LocalCommImpl>();
    group->set_timeout(timeout());
    return std::shared_ptr<Comm>(std::move(group));
  }
};

}  // namespace

std::shared_ptr<Comm> LocalComm() { return std::make_shared<LocalCommImpl>(); }

}  // namespace dcp
