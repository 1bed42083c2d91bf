#include "storage/s3/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>

namespace dcp::storage::s3 {
namespace {

std::string Hex(const unsigned char* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

std::string Hmac(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &n);
  return std::string(reinterpret_cast<const char*>(out), n);
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Header values: leading and trailing spaces dropped, inner runs of spaces made one.
std::string Trim(std::string_view s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

// Sorted lowercase headers: "name:value\n" lines, and the `;`-joined names.
std::pair<std::string, std::string> CanonicalHeaders(const Params& headers) {
  std::vector<std::pair<std::string, std::string>> h;
  for (const auto& [k, v] : headers) h.emplace_back(Lower(k), Trim(v));
  std::sort(h.begin(), h.end());
  std::string lines, names;
  for (const auto& [k, v] : h) {
    lines += k + ":" + v + "\n";
    names += (names.empty() ? "" : ";") + k;
  }
  return {lines, names};
}

std::string Scope(const std::string& amz_date, const SigningKey& key) {
  return amz_date.substr(0, 8) + "/" + key.region + "/s3/aws4_request";
}

}  // namespace

std::string UriEncode(std::string_view s, bool keep_slash) {
  static const char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (c == '/' && keep_slash)) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kDigits[c >> 4];
      out += kDigits[c & 15];
    }
  }
  return out;
}

std::string CanonicalQuery(const Params& query) {
  std::vector<std::pair<std::string, std::string>> q;
  for (const auto& [k, v] : query) q.emplace_back(UriEncode(k, false), UriEncode(v, false));
  std::sort(q.begin(), q.end());
  std::string out;
  for (const auto& [k, v] : q) out += (out.empty() ? "" : "&") + k + "=" + v;
  return out;
}

std::string CanonicalRequest(const RequestToSign& r) {
  auto [lines, names] = CanonicalHeaders(r.headers);
  return r.method + "\n" + r.path + "\n" + CanonicalQuery(r.query) + "\n" + lines + "\n" + names +
         "\n" + r.payload_sha256;
}

std::string Sha256Hex(std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), out, &n, EVP_sha256(), nullptr);
  return Hex(out, n);
}

std::string Authorization(const RequestToSign& r, const SigningKey& key,
                          const std::string& amz_date) {
  const std::string scope = Scope(amz_date, key);
  const std::string to_sign =
      "AWS4-HMAC-SHA256\n" + amz_date + "\n" + scope + "\n" + Sha256Hex(CanonicalRequest(r));
  std::string k = Hmac("AWS4" + key.secret_key, amz_date.substr(0, 8));
  k = Hmac(k, key.region);
  k = Hmac(k, "s3");
  k = Hmac(k, "aws4_request");
  const std::string sig = Hmac(k, to_sign);
  return "AWS4-HMAC-SHA256 Credential=" + key.access_key + "/" + scope +
         ", SignedHeaders=" + CanonicalHeaders(r.headers).second +
         ", Signature=" + Hex(reinterpret_cast<const unsigned char*>(sig.data()), sig.size());
}

}  // namespace dcp::storage::s3
