// dcp.CheckpointManager for Python: the C++ manager (dcp/manager.h), every call with the GIL
// released (its collectives and the async saver's thread take it to reach Python groups).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "dcp/manager.h"

namespace py = pybind11;

namespace dcp::python {
namespace {

class Manager {
 public:
  Manager(const std::string& root, std::optional<int64_t> keep_last,
          std::optional<int64_t> keep_every, std::shared_ptr<Comm> comm, bool recycle_files,
          const py::dict& load, const py::dict& async) {
    ManagerOptions o{.policy = {.keep_last = keep_last, .keep_every = keep_every},
                     .comm = std::move(comm),
                     .recycle_files = recycle_files};
    // Options of the manager's loads and async saves, as the functions of the same names take.
    for (auto [key, value] : load) {
      const std::string k = key.cast<std::string>();
      if (k == "allow_partial")
        o.load.allow_partial = value.cast<bool>();
      else if (k == "verify_checksums")
        o.load.verify_checksums = value.cast<bool>();
      else if (k == "max_open_files")
        o.load.max_open_files = value.cast<int>();
      else if (k == "broadcast")
        o.load.broadcast = value.cast<bool>();
      else
        throw Error(InvalidArgument("unknown load option " + k));
    }
    for (auto [key, value] : async) {
      const std::string k = key.cast<std::string>();
      if (k == "max_staging_bytes")
        o.async.max_staging_bytes = value.cast<uint64_t>();
      else if (k == "staging_threads")
        o.async.staging_threads = value.cast<int>();
      else if (k == "persist_nice")
        o.async.persist_nice = value.cast<int>();
      else
        throw Error(InvalidArgument("unknown async option " + k));
    }
    py::gil_scoped_release release;
    mgr_ = std::make_unique<CheckpointManager>(root, std::move(o));
  }
  // Never throws: ~CheckpointManager finishes a save in flight and reports its error on stderr
  // (close() or wait() raise it instead).
  ~Manager() {
    py::gil_scoped_release release;
    mgr_.reset();
  }

  CheckpointManager& get() {
    if (!mgr_) throw Error(FailedPrecondition("the checkpoint manager is closed"));
    return *mgr_;
  }
  // Finishes the save in flight (its error is raised) and releases the root.
  void Close() {
    if (!mgr_) return;
    py::gil_scoped_release release;
    std::unique_ptr<CheckpointManager> m = std::move(mgr_);
    try {
      m->Wait();
    } catch (...) {
      m.reset();
      throw;
    }
  }

 private:
  std::unique_ptr<CheckpointManager> mgr_;
};

}  // namespace

void BindManager(py::module_& m) {
  py::class_<Manager>(m, "CheckpointManager")
      .def(py::init<const std::string&, std::optional<int64_t>, std::optional<int64_t>,
                    std::shared_ptr<Comm>, bool, const py::dict&, const py::dict&>(),
           py::arg("root"), py::arg("keep_last"), py::arg("keep_every"), py::arg("comm"),
           py::arg("recycle_files") = true, py::arg("load") = py::dict(),
           py::arg("async_options") = py::dict())
      .def(
          "save",
          [](Manager& self, int64_t step, const StateDict& sd) {
            py::gil_scoped_release release;
            return self.get().Save(step, sd);
          },
          py::arg("step"), py::arg("state_dict"))
      .def(
          "async_save",
          [](Manager& self, int64_t step, const StateDict& sd) {
            py::gil_scoped_release release;
            self.get().AsyncSave(step, sd);
          },
          py::arg("step"), py::arg("state_dict"))
      .def(
          "prepare_async_save",
          [](Manager& self, const StateDict& sd) {
            py::gil_scoped_release release;
            self.get().PrepareAsyncSave(sd);
          },
          py::arg("state_dict"))
      .def("wait",
           [](Manager& self) {
             py::gil_scoped_release release;
             self.get().Wait();
           })
      .def("latest_step", [](Manager& self) { return self.get().latest_step(); })
      .def("steps", [](Manager& self) { return self.get().steps(); })
      .def(
          "load",
          [](Manager& self, StateDict& sd, std::optional<int64_t> step) {
            py::gil_scoped_release release;
            return self.get().Load(sd, step);
          },
          py::arg("state_dict"), py::arg("step"))
      .def(
          "keep", [](Manager& self, int64_t step) { self.get().Keep(step); }, py::arg("step"))
      .def(
          "prune",
          [](Manager& self, bool dry_run) {
            py::gil_scoped_release release;
            return self.get().Prune(dry_run);
          },
          py::arg("dry_run"))
      .def("step_dir", [](Manager& self, int64_t step) { return self.get().step_dir(step); })
      .def("close", &Manager::Close);

  m.def(
      "steps_to_remove",
      [](const std::vector<int64_t>& steps, std::optional<int64_t> latest,
         std::optional<int64_t> keep_last, std::optional<int64_t> keep_every,
         const std::vector<int64_t>& keeps) {
        return StepsToRemove(steps, latest, {.keep_last = keep_last, .keep_every = keep_every},
                             std::set<int64_t>(keeps.begin(), keeps.end()));
      },
      py::arg("steps"), py::arg("latest"), py::arg("keep_last"), py::arg("keep_every"),
      py::arg("keeps"));
}

}  // namespace dcp::python
