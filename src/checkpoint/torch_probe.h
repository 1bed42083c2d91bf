// `.metadata` (kTorchProbeName): the file by which frameworks (torchtitan, torchtune, ...)
// recognise a torch DCP checkpoint directory. A dcp checkpoint carries one so that their probes
// find it, and so that torch's own reader, handed one without hyperdcp, fails naming hyperdcp and
// how to read it.
#pragma once

#include <string>
#include <string_view>

#include "checkpoint/names.h"
#include "dcp/status.h"
#include "storage/file_system.h"

namespace dcp::checkpoint {

// The probe's bytes: a pickle (what torch's reader unpickles) naming one global, in a module
// whose name is the sentence telling how to read the checkpoint. Without hyperdcp, unpickling
// fails with "No module named '<that sentence>'" (with hyperdcp imported too: the sentence says
// to call its install(), under which torch's readers never unpickle it). Nothing in it runs
// code.
std::string_view TorchProbeBytes();

// Publishes the probe in `dir` after a commit (left as it is when it already holds these bytes;
// a torch checkpoint's own `.metadata` is replaced: the directory now holds a dcp checkpoint).
// `tmp_suffix`: as FileSystem::WriteAtomic's, unique to the save.
Status WriteTorchProbe(storage::FileSystem& fs, const std::string& dir,
                       const std::string& tmp_suffix);
// WriteTorchProbe after a commit, which has happened whatever it returns: a failure is told on
// stderr (frameworks then do not find this checkpoint; dcp and hyperdcp do).
void PublishTorchProbe(storage::FileSystem& fs, const std::string& dir,
                       const std::string& tmp_suffix);

}  // namespace dcp::checkpoint
