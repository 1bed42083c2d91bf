#include "dcp/status.h"

#include <cstring>

namespace dcp {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kInternal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::Annotate(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + message_);
}

Status ErrnoStatus(std::string_view op, std::string_view path, int err) {
  std::string msg = std::string(op) + " " + std::string(path) + ": " + std::strerror(err);
  switch (err) {
    case ENOENT:
      return NotFound(std::move(msg));
    case EINVAL:
      return InvalidArgument(std::move(msg));
    case ENOSPC:
    case EDQUOT:
    case EIO:
    case EAGAIN:
      return Unavailable(std::move(msg));
    default:
      return Internal(std::move(msg));
  }
}

}  // namespace dcp
