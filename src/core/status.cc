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
  Status s(code_, std::string(context) + message_);
  s.agreed_ = agreed_;
  return s;
}

// Codes by what the caller can do about it: fix the path or its permissions
// (kFailedPrecondition), free space or retry (kUnavailable), name an existing file (kNotFound).
// The message keeps strerror's words ("Permission denied", "Read-only file system", "No space
// left on device"), lower-cased as part of one sentence.
Status ErrnoStatus(std::string_view op, std::string_view path, int err) {
  std::string text = std::strerror(err);
  if (!text.empty() && text[0] >= 'A' && text[0] <= 'Z' &&
      !(text.size() > 1 && text[1] >= 'A' && text[1] <= 'Z')) {
    text[0] = static_cast<char>(text[0] - 'A' + 'a');
  }
  std::string msg = std::string(op) + " " + std::string(path) + ": " + text;
  switch (err) {
    case ENOENT:
      return NotFound(std::move(msg));
    case EINVAL:
      return InvalidArgument(std::move(msg));
    case EACCES:
    case EPERM:
      return FailedPrecondition(std::move(msg) + " (check the permissions of the path)");
    case EROFS:
      return FailedPrecondition(std::move(msg) + " (the file system is mounted read-only)");
    case ENOTDIR:
    case EISDIR:
    case EEXIST:
    case ENOTEMPTY:
    case ENAMETOOLONG:
    case ELOOP:
      return FailedPrecondition(std::move(msg));
    case ENOSPC:
      return Unavailable(std::move(msg) + " (free space on the file system and retry)");
    case EDQUOT:
      return Unavailable(std::move(msg) + " (the disk quota is exceeded)");
    case EIO:
    case EAGAIN:
    case EINTR:
    case EBUSY:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case ETIMEDOUT:
    case ESTALE:
      return Unavailable(std::move(msg));
    default:
      return Internal(std::move(msg));
  }
}

}  // namespace dcp
