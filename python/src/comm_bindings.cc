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
#ifdef DCP_WITH_MPI
#include "dcp/mpi_comm.h"
#endif

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
#ifdef DCP_WITH_MPI
  m.def(
      "mpi_comm",
      [](int64_t fortran_handle) -> std::shared_ptr<Comm> {
        int initialized = 0;
        MPI_Initialized(&initialized);
        if (!initialized) {
          throw Error(FailedPrecondition(
              "mpi_comm: MPI is not initialized in this process (import mpi4py.MPI first)"));
        }
        return MpiComm(MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle)));
      },
      py::arg("fortran_handle"),
      "The MPI backend over a duplicate of the communicator whose Fortran handle is given "
      "(mpi4py: comm.py2f()); MPI must be initialized by the caller (mpi4py does).");
  m.attr("has_mpi") = true;
#else
  m.attr("has_mpi") = false;
#endif
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
