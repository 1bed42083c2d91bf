// TensorSignatures: a reused preparation's check of its tensor leaves (hyperdcp/_prepare.py,
// Signatures) in one pass over them. Through Python's map() the same check took each tensor
// once per field (class, spec, local tensor, nested, memory): after the caller's training
// step (or a memcpy) has evicted the caches, every pass paid the misses again; here each
// leaf is reached once. What torch's own guards check (dtype, sizes, strides, dispatch keys)
// stays with them, after this pass.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <vector>

#include "bindings.h"

namespace py = pybind11;

namespace dcp::python {
namespace {

// torch's `void* (PyObject*)` that returns a tensor's data pointer, the one inductor's
// generated C++ reads tensors through (torch._C._dynamo.guards.
// _torchinductor_pyobject_tensor_data_ptr holds its address). It throws (a C++ exception)
// for a tensor without storage.
using DataPtrFn = void* (*)(PyObject*);

class TensorSignatures {
 public:
  // kinds[i]: leaf i's class; specs[i]: its DTensor spec, or None for a plain tensor;
  // ptrs[i]: its local tensor's data pointer; data_ptr_fn: the address above.
  TensorSignatures(const py::list& kinds, const py::list& specs, std::vector<uintptr_t> ptrs,
                   uintptr_t data_ptr_fn)
      : ptrs_(std::move(ptrs)), data_ptr_(reinterpret_cast<DataPtrFn>(data_ptr_fn)) {
    if (kinds.size() != ptrs_.size() || specs.size() != ptrs_.size()) {
      throw py::value_error("kinds, specs and ptrs differ in length");
    }
    for (size_t i = 0; i < ptrs_.size(); ++i) {
      kinds_.push_back(kinds[i]);
      specs_.push_back(specs[i]);
    }
  }

  // The local tensors of `leaves` when every leaf has its class, its spec (the same object or
  // an equal one), a local tensor that is not nested, over the same memory; else None.
  py::object Match(const py::list& leaves) const {
    static PyObject* const spec_attr = PyUnicode_InternFromString("_spec");
    static PyObject* const local_attr = PyUnicode_InternFromString("_local_tensor");
    static PyObject* const nested_attr = PyUnicode_InternFromString("is_nested");
    const size_t n = ptrs_.size();
    if (leaves.size() != n) return py::none();
    py::list locals(n);  // NULL items until set: freed safely on an early return
    for (size_t i = 0; i < n; ++i) {
      // Held, and the length checked again: a spec's __eq__ runs Python code.
      if (static_cast<size_t>(PyList_GET_SIZE(leaves.ptr())) != n) return py::none();
      const py::object held = leaves[i];
      PyObject* leaf = held.ptr();
      if (reinterpret_cast<PyObject*>(Py_TYPE(leaf)) != kinds_[i].ptr()) return py::none();
      py::object local;
      if (specs_[i].is_none()) {
        local = py::reinterpret_borrow<py::object>(leaf);
      } else {
        py::object spec = Attr(leaf, spec_attr);
        if (spec.ptr() != specs_[i].ptr()) {
          const int equal = PyObject_RichCompareBool(spec.ptr(), specs_[i].ptr(), Py_EQ);
          if (equal < 0) throw py::error_already_set();
          if (equal == 0) return py::none();
        }
        local = Attr(leaf, local_attr);
      }
      // A nested tensor over the same memory has no sizes or strides (torch's guards abort
      // the process reading them), so it must not match.
      if (Attr(local.ptr(), nested_attr).ptr() != Py_False) return py::none();
      void* data = nullptr;
      try {
        data = data_ptr_(local.ptr());
      } catch (...) {  // no storage (a sparse tensor, ...): prepared anew, which says why
        return py::none();
      }
      if (reinterpret_cast<uintptr_t>(data) != ptrs_[i]) return py::none();
      PyList_SET_ITEM(locals.ptr(), static_cast<Py_ssize_t>(i), local.release().ptr());
    }
    return std::move(locals);
  }

 private:
  static py::object Attr(PyObject* obj, PyObject* name) {
    PyObject* value = PyObject_GetAttr(obj, name);
    if (value == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(value);
  }

  std::vector<py::object> kinds_;
  std::vector<py::object> specs_;
  std::vector<uintptr_t> ptrs_;
  DataPtrFn data_ptr_;
};

}  // namespace

void BindReuse(py::module_& m) {
  py::class_<TensorSignatures>(m, "TensorSignatures",
                               "A reused preparation's one-pass check of its tensor leaves.")
      .def(py::init<const py::list&, const py::list&, std::vector<uintptr_t>, uintptr_t>(),
           py::arg("kinds"), py::arg("specs"), py::arg("ptrs"), py::arg("data_ptr_fn"))
      .def("match", &TensorSignatures::Match, py::arg("leaves"));
}

}  // namespace dcp::python
