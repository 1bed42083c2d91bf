#include "dcp/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>

namespace dcp {
namespace {

struct Case {
  int err;
  StatusCode code;
  const char* words;
};

// Permission and space problems are the caller's to fix, not internal errors, and say so.
TEST(ErrnoStatus, MapsCommonErrorsToMeaningfulCodesAndWords) {
  const Case cases[] = {
      {EACCES, StatusCode::kFailedPrecondition, "permission denied"},
      {EPERM, StatusCode::kFailedPrecondition, "not permitted"},
      {EROFS, StatusCode::kFailedPrecondition, "read-only file system"},
      {ENOSPC, StatusCode::kUnavailable, "no space left"},
      {EDQUOT, StatusCode::kUnavailable, "quota"},
      {ENOENT, StatusCode::kNotFound, "no such file"},
      {EIO, StatusCode::kUnavailable, "input/output error"},
  };
  for (const Case& c : cases) {
    Status s = ErrnoStatus("open", "/ckpt/x.distcp", c.err);
    EXPECT_EQ(s.code(), c.code) << s.ToString();
    EXPECT_NE(s.message().find(c.words), std::string::npos) << s.message();
    EXPECT_EQ(s.message().rfind("open /ckpt/x.distcp: ", 0), 0u) << s.message();
  }
}

TEST(Status, AnnotateKeepsAgreed) {
  Status s = Unavailable("disk gone").MarkAgreed();
  EXPECT_TRUE(s.agreed());
  EXPECT_TRUE(s.Annotate("saving to /x: ").agreed());
  EXPECT_FALSE(Unavailable("x").agreed());
  EXPECT_FALSE(OkStatus().MarkAgreed().agreed());
  EXPECT_TRUE(Error(s).agreed());
}

}  // namespace
}  // namespace dcp
