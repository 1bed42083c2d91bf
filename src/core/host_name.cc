#include "core/host_name.h"

#include <unistd.h>

#include <cstdlib>

namespace dcp {

std::string HostName() {
  if (const char* id = std::getenv("DCP_HOST_ID")) return id;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace dcp
