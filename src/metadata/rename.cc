#include "metadata/rename.h"

#include <algorithm>
#include <string>
#include <vector>

namespace dcp::metadata {
namespace {

std::string Renamed(const std::string& fqn, std::string_view strip, std::string_view add) {
  std::string_view rest = fqn;
  if (!strip.empty() && rest.substr(0, strip.size()) == strip) rest.remove_prefix(strip.size());
  std::string out;
  out.reserve(add.size() + rest.size());
  out.append(add).append(rest);
  return out;
}

template <typename Entry>
Status RenameAll(std::vector<Entry>& entries, std::vector<std::string>& names,
                 std::string_view strip, std::string_view add) {
  names.clear();
  names.reserve(entries.size());
  for (const Entry& e : entries) {
    names.push_back(Renamed(e.fqn, strip, add));
    if (names.back().empty()) {
      return InvalidArgument("renaming '" + e.fqn + "' (strip prefix '" + std::string(strip) +
                             "') leaves an empty name");
    }
  }
  return OkStatus();
}

Status Collision(const std::string& a, const std::string& b, const std::string& to) {
  return InvalidArgument("renaming checkpoint entries maps both '" + a + "' and '" + b + "' to '" +
                         to + "'");
}

template <typename Entry>
void ApplySorted(std::vector<Entry>& entries, std::vector<std::string>& names) {
  for (size_t i = 0; i < entries.size(); ++i) entries[i].fqn = std::move(names[i]);
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.fqn < b.fqn; });
}

// The first pair of entries sharing a new name, as (old name, old name, new name).
template <typename Entry>
Status CheckUnique(const std::vector<Entry>& entries, const std::vector<std::string>& names) {
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return names[a] < names[b]; });
  for (size_t i = 1; i < order.size(); ++i) {
    if (names[order[i]] == names[order[i - 1]]) {
      return Collision(entries[order[i - 1]].fqn, entries[order[i]].fqn, names[order[i]]);
    }
  }
  return OkStatus();
}

}  // namespace

Status RenameTensors(Metadata& md, std::string_view strip, std::string_view add) {
  if (strip.empty() && add.empty()) return OkStatus();
  std::vector<std::string> tensor_names, bytes_names;
  DCP_RETURN_IF_ERROR(RenameAll(md.tensors, tensor_names, strip, add));
  DCP_RETURN_IF_ERROR(RenameAll(md.bytes, bytes_names, strip, add));
  DCP_RETURN_IF_ERROR(CheckUnique(md.tensors, tensor_names));
  DCP_RETURN_IF_ERROR(CheckUnique(md.bytes, bytes_names));
  std::vector<std::string> sorted_bytes = bytes_names;
  std::sort(sorted_bytes.begin(), sorted_bytes.end());
  for (size_t i = 0; i < md.tensors.size(); ++i) {
    if (std::binary_search(sorted_bytes.begin(), sorted_bytes.end(), tensor_names[i])) {
      return InvalidArgument("renaming checkpoint entries maps tensor '" + md.tensors[i].fqn +
                             "' onto the name of a bytes entry, '" + tensor_names[i] + "'");
    }
  }
  ApplySorted(md.tensors, tensor_names);
  ApplySorted(md.bytes, bytes_names);
  return OkStatus();
}

}  // namespace dcp::metadata
