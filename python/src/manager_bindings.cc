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
  // The load and async-saver options are the ones load() and set_async_options() take.
  Manager(const std::string& root, std::optional<int64_t> keep_last,
          std::optional<int64_t> keep_every, std::shared_ptr<Comm> comm, bool recycle_files,
          LoadOptions load, AsyncSaverOptions async, std::optional<MemoryTierOptions> tier,
          double lock_lease_seconds, bool break_lock, bool incremental, int64_t full_every)
      : persist_at_close_(tier && tier->persist_at_exit) {
    ManagerOptions o{.policy = {.keep_last = keep_last, .keep_every = keep_every},
                     .comm = std::move(comm),
                     .recycle_files = recycle_files,
                     .load = load,
                     .async = async,
                     .memory_tier = std::move(tier),
                     .incremental = incremental,
                     .full_every = full_every,
                     .lock_lease_seconds = lock_lease_seconds,
                     .break_lock = break_lock};
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
      // Here rather than in the destructor, so that its error is raised.
      if (persist_at_close_) m->Persist();
    } catch (...) {
      m.reset();
      throw;
    }
  }

 private:
  std::unique_ptr<CheckpointManager> mgr_;
  bool persist_at_close_ = false;
};

}  // namespace

void BindManager(py::module_& m) {
  py::class_<MemoryTierOptions>(m, "MemoryTierOptions")
      .def(py::init<>())
      .def_readwrite("dir", &MemoryTierOptions::dir)
      .def_readwrite("replicas", &MemoryTierOptions::replicas)
      .def_readwrite("keep_last", &MemoryTierOptions::keep_last)
      .def_readwrite("max_bytes", &MemoryTierOptions::max_bytes)
      .def_readwrite("persist_every", &MemoryTierOptions::persist_every)
      .def_readwrite("persist_at_exit", &MemoryTierOptions::persist_at_exit)
      .def_readwrite("replication_bytes_per_second",
                     &MemoryTierOptions::replication_bytes_per_second);

  py::class_<Manager>(m, "CheckpointManager")
      .def(py::init([](const std::string& root, std::optional<int64_t> keep_last,
                       std::optional<int64_t> keep_every, std::shared_ptr<Comm> comm,
                       bool recycle_files, bool allow_partial, bool verify_checksums,
                       int max_open_files, uint64_t max_staging_bytes, int staging_threads,
                       int persist_nice, std::optional<MemoryTierOptions> tier,
                       double lock_lease_seconds, bool break_lock, bool incremental,
                       int64_t full_every) {
             LoadOptions load;
             load.allow_partial = allow_partial;
             load.verify_checksums = verify_checksums;
             load.max_open_files = max_open_files;
             return std::make_unique<Manager>(
                 root, keep_last, keep_every, std::move(comm), recycle_files, load,
                 AsyncSaverOptions{.max_staging_bytes = max_staging_bytes,
                                   .staging_threads = staging_threads,
                                   .persist_nice = persist_nice},
                 std::move(tier), lock_lease_seconds, break_lock, incremental, full_every);
           }),
           py::arg("root"), py::arg("keep_last"), py::arg("keep_every"), py::arg("comm"),
           py::arg("recycle_files"), py::arg("allow_partial"), py::arg("verify_checksums"),
           py::arg("max_open_files"), py::arg("max_staging_bytes"), py::arg("staging_threads"),
           py::arg("persist_nice"), py::arg("memory_tier"), py::arg("lock_lease_seconds"),
           py::arg("break_lock"), py::arg("incremental") = false, py::arg("full_every") = 10)
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
      .def("memory_steps", [](Manager& self) { return self.get().memory_steps(); })
      .def("persist",
           [](Manager& self) {
             py::gil_scoped_release release;
             self.get().Persist();
           })
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
      .def(
          "step_dir", [](Manager& self, int64_t step) { return self.get().step_dir(step); },
          py::arg("step"))
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
  m.def(
      "unlock",
      [](const std::string& path) {
        py::gil_scoped_release release;
        return unlock(path);
      },
      py::arg("path"));
}

}  // namespace dcp::python
