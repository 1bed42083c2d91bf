// Which machine this process runs on, for decisions that depend on sharing a page cache.
#pragma once

#include <cstdint>
#include <string>

namespace dcp {

// The host name, or $DCP_HOST_ID when set (tests use it to pretend that the processes of one
// machine run on several).
std::string HostName();

// A hash of HostName().
uint64_t HostId();

}  // namespace dcp
