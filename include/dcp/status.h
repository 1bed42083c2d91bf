// Errors as values inside the library, one exception type at the public API.
//
// Internally every fallible step returns Status or Result<T>; the public entry points
// (dcp::save, dcp::load, ...) throw dcp::Error carrying the same code and message, so a
// caller deals with one type. Messages are one sentence naming the file, tensor or rank.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace dcp {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,     // caller passed something wrong (shape, dtype, option)
  kNotFound,            // file or key missing
  kDataLoss,            // corrupt, truncated or checksum-mismatched data
  kFailedPrecondition,  // state does not allow it (no committed metadata, ...)
  kUnavailable,         // an I/O or peer failure that may be transient
  kDeadlineExceeded,    // a blocking wait ran out of time
  kInternal,            // a bug or an unexpected system error
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  // Prefixes context ("saving to /ckpt: ") without changing the code or agreed().
  Status Annotate(std::string_view context) const;

  // True when every rank of the communicator returned this same status (AgreeOnStatus and the
  // collectives that agree on failure set it): one rank reporting it is enough, as the CLI
  // does under mpirun. Not part of equality or ToString().
  bool agreed() const { return agreed_; }
  Status MarkAgreed() const {
    Status s = *this;
    s.agreed_ = !ok();
    return s;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  bool agreed_ = false;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A status from errno for an operation on a path: "open /ckpt/x: No such file or directory".
Status ErrnoStatus(std::string_view op, std::string_view path, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: must not be ok

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  std::variant<Status, T> v_;
};

// The public API's exception: the code and one clear message.
class Error : public std::runtime_error {
 public:
  explicit Error(const Status& s)
      : std::runtime_error(s.message()), code_(s.code()), agreed_(s.agreed()) {}
  StatusCode code() const { return code_; }
  // Every rank of the communicator raised this same error (Status::agreed()).
  bool agreed() const { return agreed_; }

 private:
  StatusCode code_;
  bool agreed_ = false;
};

inline void ThrowIfError(const Status& s) {
  if (!s.ok()) throw Error(s);
}
template <typename T>
T ValueOrThrow(Result<T> r) {
  if (!r.ok()) throw Error(r.status());
  return std::move(r).value();
}

}  // namespace dcp

#define DCP_CONCAT_INNER_(a, b) a##b
#define DCP_CONCAT_(a, b) DCP_CONCAT_INNER_(a, b)

#define DCP_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::dcp::Status dcp_status_ = (expr);        \
    if (!dcp_status_.ok()) return dcp_status_; \
  } while (0)

#define DCP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

#define DCP_ASSIGN_OR_RETURN(lhs, expr) \
  DCP_ASSIGN_OR_RETURN_IMPL_(DCP_CONCAT_(dcp_result_, __LINE__), lhs, expr)
