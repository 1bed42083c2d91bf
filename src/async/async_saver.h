// Internal entry points of the async saver, for tests: a save through any FileSystem.
#pragma once

#include <string>

#include "dcp/async.h"
#include "storage/file_system.h"

namespace dcp::async {

// AsyncSaver::Save writing through `fs`, which must outlive the save (wait for the handle).
AsyncSave SaveWithFileSystem(AsyncSaver& saver, const StateDict& sd, const std::string& dir,
                             const SaveOptions& opts, AsyncSaveCallback on_done,
                             storage::FileSystem& fs);

}  // namespace dcp::async
