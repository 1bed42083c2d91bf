// Renaming the entries of a checkpoint before they are matched against a state dict, so a
// checkpoint saved under one naming ("model.layers.0...") loads into another
// ("layers.0..." or "backbone.model.layers.0...").
#pragma once

#include <string_view>

#include "dcp/status.h"
#include "metadata/metadata.h"

namespace dcp::metadata {

// Every tensor and bytes-entry fqn that starts with `strip` loses that prefix, then `add` is
// prepended to every fqn (names without `strip` only get `add`). Entries are re-sorted. On
// kInvalidArgument (two entries, or a tensor and a bytes entry, renamed to the same name, or a
// name renamed to "") `md` is left unchanged. Both empty: a no-op.
Status RenameTensors(Metadata& md, std::string_view strip, std::string_view add);

}  // namespace dcp::metadata
