// Communicator handles for Python: opaque dcp::Comm objects passed back into save/load.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "bindings.h"
#include "dcp/comm.h"
#include "py_comm.h"

namespace py = pybind11;

namespace dcp::python {

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
      "agree_on_status",
      [](const std::shared_ptr<Comm>& comm, const std::optional<std::string>& error) {
        const Status mine = error ? InvalidArgument(*error) : OkStatus();
        Status all;
        {
          py::gil_scoped_release release;
          all = AgreeOnStatus(*comm, mine);
        }
        ThrowIfError(all);
      },
      py::arg("comm"), py::arg("error"),
      "Every rank learns whether every rank succeeded; raises DcpError('rank R: ...') with the "
      "first failure, on every rank. `error` is this rank's failure message, or None.");
}

}  // namespace dcp::python
