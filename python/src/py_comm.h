// A dcp::Comm whose collectives are carried out by a Python object (dcp/_comm.py: a gloo
// group of torch.distributed). The engine calls it with the GIL released; each call takes the
// GIL only for its own duration, so the engine's threads (the async saver's persisting
// thread included) never hold it across I/O.
//
// A plain C++ class holding the Python object, rather than a pybind11 trampoline: the engine
// keeps communicators in shared_ptrs beyond any Python reference (group and derived-comm
// caches), and a trampoline's Python half would die with its last Python reference.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "dcp/comm.h"

namespace dcp::python {

class PyComm final : public Comm {
 public:
  // `impl` provides: all_gather(data, timeout_s) -> list[bytes]; gather(data, root,
  // timeout_s) -> list[bytes]; broadcast(data, root, timeout_s) -> bytes;
  // broadcast_into(buffer, root, timeout_s); barrier(timeout_s); create_group(ranks) ->
  // (impl, rank, size). Ranks are this communicator's. A Python exception becomes a Status:
  // kDeadlineExceeded when it reports a timeout, kUnavailable otherwise.
  PyComm(pybind11::object impl, int rank, int size);
  ~PyComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "torch"; }

  Result<std::vector<std::string>> AllGather(std::string_view mine) override;
  Result<std::vector<std::string>> Gather(std::string_view mine, int root) override;
  Status Broadcast(std::string& data, int root) override;
  Status Barrier() override;
  // Completes before returning (gloo collectives are synchronous here).
  Result<std::unique_ptr<CommRequest>> IBroadcast(std::span<std::byte> buf, int root) override;
  Result<std::shared_ptr<Comm>> CreateGroup(const std::vector<int>& ranks) override;

 private:
  double TimeoutSeconds() const;
  Status CheckRoot(std::string_view op, int root) const;

  pybind11::object impl_;
  int rank_;
  int size_;
};

}  // namespace dcp::python
