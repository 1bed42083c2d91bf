// Which machine this process runs on.
#pragma once

#include <string>

namespace dcp {

// The host name, or $DCP_HOST_ID when set (tests use it to pretend that the processes of one
// machine run on several).
std::string HostName();

}  // namespace dcp
