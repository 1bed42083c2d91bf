// Communicator handles for Python: opaque dcp::Comm objects passed back into save/load.
#include <dlfcn.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "bindings.h"
#include "dcp/comm.h"
#include "mpi_plugin.h"
#include "py_comm.h"

namespace py = pybind11;

namespace dcp::python {
namespace {

// Loads the MPI plugin once (never unloaded: the communicators it makes run its code).
HyperdcpMpiCommFn MpiPluginEntry(const std::string& path) {
  static std::mutex mu;
  static HyperdcpMpiCommFn entry = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (entry) return entry;
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    throw Error(FailedPrecondition(
        "cannot load the MPI backend " + path + " (" + dlerror() +
        "): install Open MPI (Debian: openmpi-bin libopenmpi3) or use torch.distributed"));
  }
  entry = reinterpret_cast<HyperdcpMpiCommFn>(dlsym(lib, HYPERDCP_MPI_PLUGIN_ENTRY));
  if (!entry) throw Error(Internal(path + " has no entry point " HYPERDCP_MPI_PLUGIN_ENTRY));
  return entry;
}

std::shared_ptr<Comm> MpiCommFromPlugin(int64_t fortran_handle, const std::string& path) {
  HyperdcpMpiCommFn entry = MpiPluginEntry(path);
  void* out = nullptr;
  char error[1024] = {0};
  const int code = entry(fortran_handle, &out, error, sizeof error);
  if (code != 0) throw Error(Status(static_cast<StatusCode>(code), error));
  auto* holder = static_cast<std::shared_ptr<Comm>*>(out);
  std::shared_ptr<Comm> comm = std::move(*holder);
  delete holder;
  return comm;
}

}  // namespace

void BindComm(py::module_& m) {
  py::class_<Comm, std::shared_ptr<Comm>>(m, "Comm", "A communicator of the engine.")
      .def_property_readonly("rank", &Comm::rank)
      .def_property_readonly("size", &Comm::size)
      .def_property_readonly("backend", [](const Comm& c) { return std::string(c.backend()); })
      .def_property(
          "timeout_seconds",
          [](const Comm& c) { return std::chrono::duration<double>(c.timeout()).count(); },
          [](Comm& c, double s) {
            c.set_timeout(std::chrono::milliseconds(static_cast<int64_t>(s * 1000)));
          },
          "Every blocking call fails after this long (groups created later inherit it).");

  m.def("local_comm", &LocalComm, "A world of one process.");
  m.def(
      "python_comm",
      [](py::object impl, int rank, int size) -> std::shared_ptr<Comm> {
        return std::make_shared<PyComm>(std::move(impl), rank, size);
      },
      py::arg("impl"), py::arg("rank"), py::arg("size"),
      "A communicator whose collectives `impl` carries out (see dcp/_comm.py).");
  m.def(
      "mpi_comm",
      [](int64_t fortran_handle, const std::string& plugin_path) -> std::shared_ptr<Comm> {
        return MpiCommFromPlugin(fortran_handle, plugin_path);
      },
      py::arg("fortran_handle"), py::arg("plugin_path"),
      "The MPI backend over a duplicate of the communicator whose Fortran handle is given "
      "(mpi4py: comm.py2f()), from the plugin at `plugin_path` (loaded once); MPI must be "
      "initialized by the caller (mpi4py does).");
  m.def(
      "all_gather",
      [](const std::shared_ptr<Comm>& comm, const py::bytes& mine) {
        std::string data(mine);
        Result<std::vector<std::string>> all = [&] {
          py::gil_scoped_release release;
          return comm->AllGather(data);
        }();
        ThrowIfError(all.status());
        py::list out;
        for (const std::string& b : *all) out.append(py::bytes(b));
        return out;
      },
      py::arg("comm"), py::arg("mine"),
      "Every rank's bytes, in rank order (a collective of the communicator).");
}

}  // namespace dcp::python
