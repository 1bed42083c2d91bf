#include "comm/host_id.h"

#include <unistd.h>
#include <xxhash.h>

#include <cstdlib>

namespace dcp {

std::string HostName() {
  if (const char* id = std::getenv("DCP_HOST_ID")) return id;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

uint64_t HostId() {
  const std::string name = HostName();
  return XXH3_64bits(name.data(), name.size());
}

}  // namespace dcp
