#include "storage/s3/s3_config.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace dcp::storage::s3 {
namespace {

std::string Strip(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  size_t e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

Result<int64_t> PositiveEnv(const char* name, int64_t fallback) {
  std::string v = EnvVar(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (*end != '\0' || n <= 0) {
    return InvalidArgument(std::string(name) + "=" + v + ": expected a positive integer");
  }
  return static_cast<int64_t>(n);
}

}  // namespace

std::string IniValue(const std::string& text, const std::string& section, const std::string& key) {
  std::istringstream in(text);
  std::string line, current;
  while (std::getline(in, line)) {
    line = Strip(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      current = Strip(line.substr(1, line.size() - 2));
      continue;
    }
    size_t eq = line.find('=');
    if (current != section || eq == std::string::npos) continue;
    if (Strip(line.substr(0, eq)) == key) return Strip(line.substr(eq + 1));
  }
  return {};
}

Result<S3Config> S3ConfigFromEnvironment() {
  S3Config c;
  const AwsProfile profile = AwsProfile::FromEnvironment();
  auto from_files = [&](const char* key) { return profile.Get(key); };

  c.endpoint = EnvVar("AWS_ENDPOINT_URL_S3");
  if (c.endpoint.empty()) c.endpoint = EnvVar("AWS_ENDPOINT_URL");
  if (c.endpoint.empty()) c.endpoint = from_files("endpoint_url");
  while (!c.endpoint.empty() && c.endpoint.back() == '/') c.endpoint.pop_back();
  // A scheme's default port: curl leaves it out of the Host header, so the signature must too.
  for (std::string_view dflt :
       {std::string_view("http://|:80"), std::string_view("https://|:443")}) {
    const auto bar = dflt.find('|');
    const std::string_view scheme = dflt.substr(0, bar), port = dflt.substr(bar + 1);
    if (c.endpoint.starts_with(scheme) && c.endpoint.ends_with(port) &&
        c.endpoint.find('/', scheme.size()) == std::string::npos) {
      c.endpoint.resize(c.endpoint.size() - port.size());
    }
  }
  c.region = EnvVar("AWS_REGION");
  if (c.region.empty()) c.region = EnvVar("AWS_DEFAULT_REGION");
  if (c.region.empty()) c.region = from_files("region");
  if (c.region.empty()) c.region = "us-east-1";

  auto credentials = ResolveCredentials(profile, c.region);
  if (!credentials.ok()) {
    const Status& st = credentials.status();
    return st.code() == StatusCode::kNotFound ? InvalidArgument(st.message()) : st;
  }
  c.credentials = std::move(*credentials);

  const std::string addressing = EnvVar("DCP_S3_ADDRESSING");
  if (addressing.empty()) {
    c.path_style = !c.endpoint.empty();
  } else if (addressing == "path" || addressing == "virtual") {
    c.path_style = addressing == "path";
  } else {
    return InvalidArgument("DCP_S3_ADDRESSING=" + addressing + ": expected path or virtual");
  }
  DCP_ASSIGN_OR_RETURN(int64_t part_mb, PositiveEnv("DCP_S3_PART_MB", 16));
  if (part_mb < 5 || part_mb > 5120) {
    return InvalidArgument("DCP_S3_PART_MB=" + std::to_string(part_mb) +
                           ": S3 parts are 5 MiB to 5 GiB");
  }
  c.part_bytes = static_cast<uint64_t>(part_mb) << 20;
  DCP_ASSIGN_OR_RETURN(int64_t conns, PositiveEnv("DCP_S3_CONNECTIONS", 8));
  c.connections = static_cast<int>(std::min<int64_t>(conns, 256));
  DCP_ASSIGN_OR_RETURN(int64_t attempts, PositiveEnv("DCP_S3_MAX_ATTEMPTS", 8));
  c.max_attempts = static_cast<int>(std::min<int64_t>(attempts, 100));
  return c;
}

uint64_t PartBytes(uint64_t base, size_t index) {
  const size_t doublings = std::min<size_t>(index / 1000, 20);
  return std::min(base << doublings, std::max(base, kMaxPartBytes));
}

uint64_t PartBytesFor(const S3Config& config, uint64_t total) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  const uint64_t per_connection = total / static_cast<uint64_t>(std::max(1, config.connections));
  const uint64_t rounded = (per_connection + kMiB - 1) / kMiB * kMiB;
  return std::min(std::clamp(rounded, config.part_bytes, 4 * config.part_bytes), kMaxPartBytes);
}

bool IsS3Path(const std::string& path) { return path.rfind("s3://", 0) == 0; }

Result<S3Location> ParseS3Path(const std::string& path) {
  if (!IsS3Path(path)) return InvalidArgument(path + ": not an s3://bucket/prefix path");
  std::string rest = path.substr(5);
  size_t slash = rest.find('/');
  S3Location loc;
  loc.bucket = rest.substr(0, slash);
  if (slash != std::string::npos) loc.key = rest.substr(slash + 1);
  while (!loc.key.empty() && loc.key.back() == '/') loc.key.pop_back();
  if (loc.bucket.empty()) return InvalidArgument(path + ": no bucket name after s3://");
  // Keys are literal on S3, but an HTTP client resolves "." and ".." in the URL it sends:
  // the objects written would not be the ones signed, listed and cleaned up.
  for (size_t start = 0; start <= loc.key.size();) {
    const size_t end = std::min(loc.key.find('/', start), loc.key.size());
    const std::string_view seg = std::string_view(loc.key).substr(start, end - start);
    if (!loc.key.empty() && (seg == "." || seg == ".." || seg.empty())) {
      return InvalidArgument(path + ": '" + std::string(seg.empty() ? "//" : seg) +
                             "' in an s3:// id (keys are taken literally; name the prefix "
                             "without '.', '..' or empty segments)");
    }
    start = end + 1;
  }
  return loc;
}

}  // namespace dcp::storage::s3
