// The checkpoint manager's step names and its retention rule, pure functions
// (include/dcp/manager.h): every rank decides the same from the same steps.
#include <algorithm>
#include <set>

#include "checkpoint/names.h"
#include "dcp/manager.h"

namespace dcp {

std::string StepDirName(int64_t step) { return checkpoint::StepDirName(step); }

std::optional<int64_t> ParseStepDirName(const std::string& name) {
  return checkpoint::ParseStepDirName(name);
}

std::vector<int64_t> StepsToRemove(const std::vector<int64_t>& steps_in,
                                   std::optional<int64_t> latest, const RetentionPolicy& policy,
                                   const std::set<int64_t>& keeps, const StepBases& bases) {
  std::vector<int64_t> steps = steps_in;
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  std::vector<int64_t> out;
  if (!latest || !std::binary_search(steps.begin(), steps.end(), *latest)) return out;
  if (!policy.keep_last && !policy.keep_every) return out;  // keep everything
  const int64_t keep_last =
      policy.keep_last ? std::max<int64_t>(*policy.keep_last, 1) : int64_t{1};  // newest kept
  std::set<int64_t> kept(keeps.begin(), keeps.end());
  // The keep_last newest steps, counting down from the newest complete one.
  for (int64_t i = 0; i < keep_last && i < static_cast<int64_t>(steps.size()); ++i) {
    kept.insert(steps[steps.size() - 1 - static_cast<size_t>(i)]);
  }
  for (int64_t s : steps) {
    if (policy.keep_every && *policy.keep_every > 0 && s % *policy.keep_every == 0) kept.insert(s);
  }
  // The bases of kept steps hold some of their bytes; a base's own bases keep it loadable.
  std::vector<int64_t> todo(kept.begin(), kept.end());
  while (!todo.empty()) {
    const int64_t s = todo.back();
    todo.pop_back();
    auto it = bases.find(s);
    if (it == bases.end()) continue;
    for (int64_t b : it->second) {
      if (kept.insert(b).second) todo.push_back(b);
    }
  }
  for (int64_t s : steps) {
    if (s < *latest && !kept.count(s)) out.push_back(s);
  }
  return out;
}

Status ValidateRetention(const RetentionPolicy& policy) {
  if (policy.keep_last && *policy.keep_last < 1) {
    return InvalidArgument("keep_last=" + std::to_string(*policy.keep_last) +
                           " would keep no step but the newest: keep_last counts the newest "
                           "steps kept (at least 1); to keep every step leave it unset (None)");
  }
  if (policy.keep_every && *policy.keep_every < 1) {
    return InvalidArgument("keep_every=" + std::to_string(*policy.keep_every) +
                           " is not a step interval: keep_every keeps the multiples of a "
                           "positive number; to keep every step leave both settings unset (None)");
  }
  return OkStatus();
}

}  // namespace dcp
