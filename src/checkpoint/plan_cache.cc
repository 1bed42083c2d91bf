#include "checkpoint/plan_cache.h"

namespace dcp::checkpoint {

PlanCache& ProcessPlanCache() {
  static PlanCache* cache = new PlanCache;
  return *cache;
}

}  // namespace dcp::checkpoint
