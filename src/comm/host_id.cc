#include "comm/host_id.h"

#include <unistd.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>

namespace dcp {

uint64_t HostId() {
  char name[256] = {};
  if (const char* id = std::getenv("DCP_HOST_ID")) {
    std::strncpy(name, id, sizeof(name) - 1);
  } else if (gethostname(name, sizeof(name) - 1) != 0) {
    std::strcpy(name, "localhost");
  }
  return XXH3_64bits(name, std::strlen(name));
}

}  // namespace dcp
