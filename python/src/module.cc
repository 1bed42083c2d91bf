// hyperdcp._dcp: the engine's entry points for the Python package (python/hyperdcp/). It converts,
// it does not decide: every planning, I/O and communication decision stays in the library.
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "dcp/status.h"

namespace py = pybind11;

PYBIND11_MODULE(_dcp, m) {
  m.doc() = "dcp engine bindings; use the `hyperdcp` package instead.";
  m.attr("__version__") = DCP_VERSION_STRING;  // the file VERSION, through CMake

  // One exception type for every engine error, carrying the engine's message and its code
  // ("INVALID_ARGUMENT", "DATA_LOSS", ...) as `.code`.
  static py::handle error_type = PyErr_NewExceptionWithDoc(
      "hyperdcp.DcpError", "An error of the dcp engine: one sentence naming what failed.",
      PyExc_Exception, nullptr);
  m.add_object("DcpError", error_type);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dcp::Error& e) {
      py::object err = py::reinterpret_borrow<py::object>(error_type)(e.what());
      err.attr("code") = std::string(dcp::StatusCodeName(e.code()));
      PyErr_SetObject(error_type.ptr(), err.ptr());
    }
  });

  dcp::python::BindComm(m);
  dcp::python::BindCheckpoint(m);
  dcp::python::BindMetadata(m);
  dcp::python::BindManager(m);
  dcp::python::BindReuse(m);
}
