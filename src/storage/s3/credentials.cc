#include "storage/s3/credentials.h"

#include <curl/curl.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "storage/s3/s3_config.h"
#include "storage/s3/sigv4.h"
#include "storage/s3/xml_reply.h"

namespace dcp::storage::s3 {
namespace {

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Trim(std::string s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  const size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::string HomeFile(const char* env, const char* rel) {
  std::string p = EnvVar(env);
  if (!p.empty()) return p;
  std::string home = EnvVar("HOME");
  return home.empty() ? std::string() : home + "/" + rel;
}

// ---- One unsigned HTTP request to a credential endpoint ---------------------------------------

struct HttpReply {
  long status = 0;
  std::string body;
};

size_t Collect(char* data, size_t size, size_t n, void* out) {
  auto* body = static_cast<std::string*>(out);
  if (body->size() < (size_t{1} << 20)) body->append(data, size * n);  // replies are small
  return size * n;
}

Result<HttpReply> Http(const std::string& method, const std::string& url,
                       const std::vector<std::string>& headers, const std::string& body,
                       long timeout_s) {
  CURL* curl = curl_easy_init();
  if (!curl) return Internal("curl_easy_init failed");
  curl_slist* list = nullptr;
  for (const auto& h : headers) list = curl_slist_append(list, h.c_str());
  HttpReply reply;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, timeout_s);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, timeout_s * 5);
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");  // link-local endpoints: never via a proxy
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply.body);
  if (method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  } else if (method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  const CURLcode rc = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply.status);
  curl_slist_free_all(list);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) return Unavailable(method + " " + url + ": " + curl_easy_strerror(rc));
  return reply;
}

std::string Snippet(const std::string& body) {
  std::string s = Trim(body.substr(0, 200));
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// The credentials of an endpoint's JSON reply, or why not, naming `what` was asked.
Result<AwsCredentials> FromReply(const Result<HttpReply>& r, const std::string& what,
                                 const std::string& source) {
  if (!r.ok()) return r.status().Annotate(what + ": ");
  if (r->status != 200) {
    return FailedPrecondition(what + ": HTTP " + std::to_string(r->status) + ": " +
                              Snippet(r->body));
  }
  auto c = CredentialsFromJson(r->body, source);
  if (!c.ok()) return c.status().Annotate(what + ": ");
  return c;
}

// ---- The sources, each kNotFound when not configured ------------------------------------------

Result<AwsCredentials> FromEnvironment() {
  AwsCredentials c{EnvVar("AWS_ACCESS_KEY_ID"), EnvVar("AWS_SECRET_ACCESS_KEY"),
                   EnvVar("AWS_SESSION_TOKEN"), 0, "environment"};
  if (c.access_key.empty() || c.secret_key.empty()) return NotFound("environment");
  return c;
}

Result<AwsCredentials> FromWebIdentity(const AwsProfile& profile, const std::string& region) {
  std::string token_file = EnvVar("AWS_WEB_IDENTITY_TOKEN_FILE");
  std::string role = EnvVar("AWS_ROLE_ARN");
  std::string session = EnvVar("AWS_ROLE_SESSION_NAME");
  if (token_file.empty() || role.empty()) {
    token_file = profile.Get("web_identity_token_file");
    role = profile.Get("role_arn");
    session = profile.Get("role_session_name");
  }
  if (token_file.empty() || role.empty()) return NotFound("web identity");
  if (session.empty()) session = "dcp-" + std::to_string(std::time(nullptr));
  const std::string what = "web identity (role " + role + ", token file " + token_file + ")";
  const std::string token = Trim(ReadText(token_file));
  if (token.empty()) return FailedPrecondition(what + ": the token file is missing or empty");
  std::string endpoint = EnvVar("AWS_ENDPOINT_URL_STS");
  if (endpoint.empty()) endpoint = EnvVar("AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = "https://sts." + region + ".amazonaws.com";
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const std::string form =
      "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=" + UriEncode(role, false) +
      "&RoleSessionName=" + UriEncode(session, false) +
      "&WebIdentityToken=" + UriEncode(token, false);
  DCP_ASSIGN_OR_RETURN(
      HttpReply r,
      Http("POST", endpoint + "/", {"Content-Type: application/x-www-form-urlencoded"}, form, 10));
  Xml xml(r.body);
  const xmlNode* creds = xml.root() ? Find(xml.root(), "Credentials") : nullptr;
  if (r.status != 200 || !creds) {
    const std::string code = xml.root() ? ChildText(xml.root(), "Code") : "";
    return FailedPrecondition(what + ": STS at " + endpoint + " answered HTTP " +
                              std::to_string(r.status) + (code.empty() ? "" : " " + code) + ": " +
                              Snippet(r.body));
  }
  AwsCredentials c{ChildText(creds, "AccessKeyId"), ChildText(creds, "SecretAccessKey"),
                   ChildText(creds, "SessionToken"), ParseIso8601(ChildText(creds, "Expiration")),
                   "web identity"};
  if (c.access_key.empty() || c.secret_key.empty()) {
    return FailedPrecondition(what + ": STS answered no credentials");
  }
  if (c.expires_unix_s < 0) {  // never taken as "does not expire"
    return FailedPrecondition(what + ": STS answered an unreadable Expiration");
  }
  return c;
}

Result<AwsCredentials> FromProfileKeys(const AwsProfile& profile) {
  AwsCredentials c{profile.Get("aws_access_key_id"), profile.Get("aws_secret_access_key"),
                   profile.Get("aws_session_token"), 0, "profile " + profile.name};
  if (c.access_key.empty() || c.secret_key.empty()) return NotFound("profile keys");
  return c;
}

Result<AwsCredentials> FromProcess(const AwsProfile& profile) {
  const std::string command = profile.Get("credential_process");
  if (command.empty()) return NotFound("credential_process");
  const std::string what = "credential_process of profile " + profile.name + " (" + command + ")";
  std::fflush(nullptr);
  FILE* out = ::popen(command.c_str(), "r");
  if (!out) return FailedPrecondition(what + ": cannot run it");
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), out)) > 0;) {
    if (text.size() < (size_t{1} << 20)) text.append(buf, n);
  }
  const int status = ::pclose(out);
  if (status != 0) {
    return FailedPrecondition(what + ": exited with status " +
                              std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : status));
  }
  auto c = CredentialsFromJson(text, "credential_process");
  if (!c.ok()) return c.status().Annotate(what + ": ");
  return c;
}

Result<AwsCredentials> FromContainer() {
  std::string url = EnvVar("AWS_CONTAINER_CREDENTIALS_FULL_URI");
  const std::string relative = EnvVar("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  if (!relative.empty()) url = "http://169.254.170.2" + relative;
  if (url.empty()) return NotFound("container credentials");
  std::string token = EnvVar("AWS_CONTAINER_AUTHORIZATION_TOKEN");
  const std::string token_file = EnvVar("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
  if (!token_file.empty()) token = Trim(ReadText(token_file));  // rotated: read each time
  std::vector<std::string> headers;
  if (!token.empty()) headers.push_back("Authorization: " + token);
  const std::string what = "container credentials at " + url;
  Result<HttpReply> r = Http("GET", url, headers, "", 2);
  for (int retry = 0; retry < 2 && !(r.ok() && r->status < 500); ++retry) {
    r = Http("GET", url, headers, "", 2);  // as the AWS SDKs: a few quick tries
  }
  return FromReply(r, what, "container");
}

Result<AwsCredentials> FromInstanceMetadata() {
  if (EnvVar("AWS_EC2_METADATA_DISABLED") == "true") return NotFound("instance metadata");
  std::string base = EnvVar("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (base.empty()) base = "http://169.254.169.254";
  while (!base.empty() && base.back() == '/') base.pop_back();
  // Not configured anywhere: off EC2 nothing answers (or something else does), and that is
  // no error, only one source fewer.
  auto token = Http("PUT", base + "/latest/api/token",
                    {"X-aws-ec2-metadata-token-ttl-seconds: 21600"}, "", 1);
  if (!token.ok() || token->status != 200 || Trim(token->body).empty()) {
    return NotFound("instance metadata");
  }
  const std::string auth = "X-aws-ec2-metadata-token: " + Trim(token->body);
  const std::string roles_url = base + "/latest/meta-data/iam/security-credentials/";
  auto roles = Http("GET", roles_url, {auth}, "", 1);
  if (!roles.ok() || roles->status != 200) return NotFound("instance metadata");
  const std::string role = Trim(roles->body.substr(0, roles->body.find('\n')));
  if (role.empty()) return NotFound("instance metadata (no role attached)");
  auto r = Http("GET", roles_url + role, {auth}, "", 2);
  const std::string what = "instance metadata role " + role + " at " + base;
  return FromReply(r, what, "instance metadata");
}

}  // namespace

std::string EnvVar(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string AwsProfile::Get(const char* key) const {
  std::string v = IniValue(credentials_text, name, key);
  if (!v.empty()) return v;
  return IniValue(config_text, name == "default" ? name : "profile " + name, key);
}

AwsProfile AwsProfile::FromEnvironment() {
  AwsProfile p;
  p.name = EnvVar("AWS_PROFILE");
  if (p.name.empty()) p.name = "default";
  p.credentials_text = ReadText(HomeFile("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"));
  p.config_text = ReadText(HomeFile("AWS_CONFIG_FILE", ".aws/config"));
  return p;
}

Result<AwsCredentials> ResolveCredentials(const AwsProfile& profile, const std::string& region) {
  using Source = std::function<Result<AwsCredentials>()>;
  const Source sources[] = {
      FromEnvironment,
      [&] { return FromWebIdentity(profile, region); },
      [&] { return FromProfileKeys(profile); },
      [&] { return FromProcess(profile); },
      FromContainer,
      FromInstanceMetadata,
  };
  for (const Source& source : sources) {
    auto c = source();
    if (c.ok() || c.status().code() != StatusCode::kNotFound) return c;
  }
  return NotFound(
      "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give profile '" +
      profile.name +
      "' aws_access_key_id and aws_secret_access_key in ~/.aws/credentials (searched: the "
      "environment, a web identity token, the profile's keys and credential_process, container "
      "credentials, the instance metadata service)");
}

bool DueForRefresh(const AwsCredentials& c, int64_t fetched_unix_s, int64_t now_unix_s) {
  if (c.expires_unix_s <= 0) return false;
  const int64_t life = std::max<int64_t>(0, c.expires_unix_s - fetched_unix_s);
  return now_unix_s >= c.expires_unix_s - std::min<int64_t>(300, life / 2);
}

int64_t ParseIso8601(const std::string& text) {
  std::tm tm{};
  const char* rest = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!rest) return -1;
  if (*rest == '.') {
    ++rest;
    while (*rest >= '0' && *rest <= '9') ++rest;
  }
  const std::string zone(rest);
  if (zone != "Z" && zone != "+00:00" && !zone.empty()) return -1;
  return static_cast<int64_t>(timegm(&tm));
}

Result<AwsCredentials> CredentialsFromJson(const std::string& text, const std::string& source) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return DataLoss("the credentials are not JSON: " + Snippet(text));
  auto str = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (auto v = j.find("Version"); v != j.end() && !(v->is_number_integer() && *v == 1)) {
    return DataLoss("credentials of Version " + v->dump() + " (1 is known)");
  }
  AwsCredentials c{str("AccessKeyId"), str("SecretAccessKey"), str("Token"), 0, source};
  if (c.session_token.empty()) c.session_token = str("SessionToken");
  if (c.access_key.empty() || c.secret_key.empty()) {
    return DataLoss("no AccessKeyId and SecretAccessKey in the credentials");
  }
  const std::string expiration = str("Expiration");
  if (!expiration.empty()) {
    c.expires_unix_s = ParseIso8601(expiration);
    if (c.expires_unix_s < 0) return DataLoss("unreadable Expiration '" + expiration + "'");
  }
  return c;
}

}  // namespace dcp::storage::s3
