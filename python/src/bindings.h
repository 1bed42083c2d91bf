// The parts of the extension module hyperdcp._dcp, one function per file, called by module.cc.
#pragma once

#include <pybind11/pybind11.h>

namespace dcp::python {

void BindCheckpoint(pybind11::module_& m);  // StateDict, save/load, results, async save
void BindComm(pybind11::module_& m);        // Comm handles: local, over a Python group
void BindMetadata(pybind11::module_& m);    // read_metadata
void BindManager(pybind11::module_& m);     // CheckpointManager
void BindReuse(pybind11::module_& m);       // TensorSignatures (a reused preparation's check)

}  // namespace dcp::python
