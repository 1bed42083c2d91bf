#include "comm/host_id.h"

#include <xxhash.h>

namespace dcp {

uint64_t HostId() {
  const std::string name = HostName();
  return XXH3_64bits(name.data(), name.size());
}

}  // namespace dcp
