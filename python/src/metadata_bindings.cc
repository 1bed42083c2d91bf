// read_metadata: a checkpoint's names, dtypes, global shapes and bytes entries as plain
// Python values (dcp/_metadata.py wraps them).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "dcp/checkpoint.h"
#include "dcp/metadata.h"

namespace py = pybind11;

namespace dcp::python {
namespace {

std::vector<int64_t> ToList(const Shape& s) { return {s.begin(), s.end()}; }

py::dict ToPython(const Metadata& md) {
  py::list files, tensors, bytes;
  for (const auto& f : md.files) files.append(py::make_tuple(f.name, f.size));
  for (const auto& t : md.tensors) {
    py::list chunks;
    for (const auto& c : t.chunks) {
      chunks.append(py::make_tuple(ToList(c.box.offsets), ToList(c.box.lengths)));
    }
    tensors.append(
        py::make_tuple(t.fqn, std::string(DTypeName(t.dtype)), ToList(t.global_shape), chunks));
  }
  for (const auto& b : md.bytes) bytes.append(py::make_tuple(b.fqn, b.byte_length));
  py::dict paths;  // fqn -> path, for the entries that have one
  for (const auto& t : md.tensors) {
    if (!t.path.empty()) paths[py::str(t.fqn)] = py::bytes(t.path);
  }
  for (const auto& b : md.bytes) {
    if (!b.path.empty()) paths[py::str(b.fqn)] = py::bytes(b.path);
  }
  py::dict d;
  d["save_id"] = md.save_id;
  d["world_size"] = md.world_size;
  d["has_checksums"] = md.has_checksums;
  d["files"] = files;
  d["tensors"] = tensors;
  d["bytes"] = bytes;
  d["paths"] = paths;
  return d;
}

}  // namespace

void BindMetadata(py::module_& m) {
  m.def(
      "read_metadata",
      [](const std::string& dir) {
        Metadata md;
        {
          py::gil_scoped_release release;
          md = read_metadata(dir);
        }
        return ToPython(md);
      },
      py::arg("dir"),
      "{save_id, world_size, has_checksums, files: [(name, size)], tensors: [(fqn, dtype, "
      "global_shape, [(offsets, lengths)])], bytes: [(fqn, byte_length)], paths: {fqn: bytes}}");
}

}  // namespace dcp::python
