// Which machine this process runs on, for decisions that depend on sharing a page cache.
#pragma once

#include <cstdint>

namespace dcp {

// A hash of the host name, or of $DCP_HOST_ID when set (tests use it to pretend that the
// processes of one machine run on several).
uint64_t HostId();

}  // namespace dcp
