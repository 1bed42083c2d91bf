// Which machine this process runs on, for decisions that depend on sharing a page cache.
#pragma once

#include <cstdint>
#include <string>

#include "core/host_name.h"

namespace dcp {

// A hash of HostName().
uint64_t HostId();

}  // namespace dcp
