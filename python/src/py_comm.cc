#include "py_comm.h"

#include <Python.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <utility>

namespace py = pybind11;

namespace dcp::python {
namespace {

bool IsFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

class CompletedRequest final : public CommRequest {
 public:
  Status Wait() override { return OkStatus(); }
  Result<bool> Test() override { return true; }
};

// Runs `f` (which uses Python) under the GIL; a Python exception becomes a Status naming `op`.
// Never once the interpreter is finalising: a thread taking the GIL then is ended by Python
// (pthread_exit through C++ frames: std::terminate). The save fails instead, and its
// checkpoint stays uncommitted; hyperdcp's atexit hook finishes saves before that point.
template <typename F>
auto WithGil(std::string_view op, F&& f) -> Result<decltype(f())> {
  if (!Py_IsInitialized() || IsFinalizing()) {
    return Unavailable("torch.distributed " + std::string(op) +
                       ": the Python interpreter is exiting");
  }
  py::gil_scoped_acquire gil;
  try {
    return f();
  } catch (py::error_already_set& e) {
    std::string what = e.what();
    const bool timed_out = e.matches(PyExc_TimeoutError) ||
                           what.find("imed out") != std::string::npos ||
                           what.find("imeout") != std::string::npos;
    // The exception itself is kept by the Python side (hyperdcp/_gloo.py) and re-raised
    // to the caller; the Status carries its text for the engine's own error.
    std::string msg = "torch.distributed " + std::string(op) + ": " + what;
    return timed_out ? DeadlineExceeded(std::move(msg)) : Unavailable(std::move(msg));
  } catch (const std::exception& e) {  // a failed conversion (py::cast_error)
    PyErr_Clear();
    return Unavailable("torch.distributed " + std::string(op) + ": " + e.what());
  }
}

std::vector<std::string> ToStrings(const py::handle& list) {
  std::vector<std::string> out;
  for (py::handle b : list) out.push_back(b.cast<std::string>());
  return out;
}

}  // namespace

PyComm::PyComm(py::object impl, int rank, int size)
    : impl_(std::move(impl)), rank_(rank), size_(size) {}

PyComm::~PyComm() {
  // Caches in the library may outlive the interpreter (static destructors run after
  // Py_Finalize): then the Python object is leaked, not touched.
  if (!Py_IsInitialized()) {
    impl_.release();
    return;
  }
  py::gil_scoped_acquire gil;
  impl_ = py::object();
}

double PyComm::TimeoutSeconds() const { return std::chrono::duration<double>(timeout()).count(); }

Status PyComm::CheckRoot(std::string_view op, int root) const {
  if (root >= 0 && root < size_) return OkStatus();
  return InvalidArgument(std::string(op) + " root " + std::to_string(root) +
                         " is outside a group of " + std::to_string(size_));
}

Result<std::vector<std::string>> PyComm::AllGather(std::string_view mine) {
  return WithGil("all_gather", [&] {
    return ToStrings(
        impl_.attr("all_gather")(py::bytes(mine.data(), mine.size()), TimeoutSeconds()));
  });
}

Result<std::vector<std::string>> PyComm::Gather(std::string_view mine, int root) {
  DCP_RETURN_IF_ERROR(CheckRoot("gather", root));
  return WithGil("gather", [&] {
    return ToStrings(
        impl_.attr("gather")(py::bytes(mine.data(), mine.size()), root, TimeoutSeconds()));
  });
}

Status PyComm::Broadcast(std::string& data, int root) {
  DCP_RETURN_IF_ERROR(CheckRoot("broadcast", root));
  auto r = WithGil("broadcast", [&] {
    return impl_.attr("broadcast")(py::bytes(data), root, TimeoutSeconds()).cast<std::string>();
  });
  if (!r.ok()) return r.status();
  data = std::move(r).value();
  return OkStatus();
}

Status PyComm::Barrier() {
  return WithGil("barrier",
                 [&] {
                   impl_.attr("barrier")(TimeoutSeconds());
                   return true;
                 })
      .status();
}

Result<std::unique_ptr<CommRequest>> PyComm::IBroadcast(std::span<std::byte> buf, int root) {
  DCP_RETURN_IF_ERROR(CheckRoot("ibroadcast", root));
  auto r = WithGil("ibroadcast", [&] {
    // The buffer is the engine's; the view must not outlive this call.
    py::memoryview view = py::memoryview::from_memory(buf.data(), buf.size(), false);
    impl_.attr("broadcast_into")(view, root, TimeoutSeconds());
    view.attr("release")();
    return true;
  });
  if (!r.ok()) return r.status();
  return std::unique_ptr<CommRequest>(std::make_unique<CompletedRequest>());
}

Result<std::shared_ptr<Comm>> PyComm::CreateGroup(const std::vector<int>& ranks) {
  const bool valid = std::is_sorted(ranks.begin(), ranks.end()) &&
                     std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end() &&
                     !ranks.empty() && ranks.front() >= 0 && ranks.back() < size_ &&
                     std::binary_search(ranks.begin(), ranks.end(), rank_);
  if (!valid) {
    return InvalidArgument("CreateGroup: ranks must be sorted, unique, within a group of " +
                           std::to_string(size_) + " and include rank " + std::to_string(rank_));
  }
  auto r = WithGil("create_group", [&] {
    py::tuple t = impl_.attr("create_group")(ranks);
    auto group = std::make_shared<PyComm>(t[0], t[1].cast<int>(), t[2].cast<int>());
    return std::shared_ptr<Comm>(std::move(group));
  });
  if (r.ok()) (*r)->set_timeout(timeout());
  return r;
}

}  // namespace dcp::python
