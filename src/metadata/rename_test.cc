#include "metadata/rename.h"

#include <gtest/gtest.h>

namespace dcp::metadata {
namespace {

Metadata Names(std::vector<std::string> tensors, std::vector<std::string> bytes = {}) {
  Metadata md;
  for (auto& n : tensors) md.tensors.push_back({n, DType::kF32, Shape{1}, {}});
  for (auto& n : bytes) md.bytes.push_back({n, 0, 0, 0, 0});
  return md;
}

std::vector<std::string> TensorNames(const Metadata& md) {
  std::vector<std::string> out;
  for (const auto& t : md.tensors) out.push_back(t.fqn);
  return out;
}

TEST(RenameTest, StripThenAddAndResort) {
  Metadata md = Names({"lm_head.w", "model.a", "model.b"}, {"model.step"});
  ASSERT_TRUE(RenameTensors(md, "model.", "net.").ok());
  EXPECT_EQ(TensorNames(md), (std::vector<std::string>{"net.a", "net.b", "net.lm_head.w"}));
  EXPECT_EQ(md.bytes[0].fqn, "net.step");
}

TEST(RenameTest, NoOpWhenBothEmpty) {
  Metadata md = Names({"b", "a"});  // deliberately unsorted: untouched
  ASSERT_TRUE(RenameTensors(md, "", "").ok());
  EXPECT_EQ(TensorNames(md), (std::vector<std::string>{"b", "a"}));
}

TEST(RenameTest, CollisionIsAnErrorAndLeavesMetadataUnchanged) {
  Metadata md = Names({"a", "model.a"});
  Status s = RenameTensors(md, "model.", "");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("maps both 'a' and 'model.a' to 'a'"), std::string::npos)
      << s.message();
  EXPECT_EQ(TensorNames(md), (std::vector<std::string>{"a", "model.a"}));
}

TEST(RenameTest, EmptyNameAndTensorOntoBytesEntry) {
  Metadata md = Names({"model."});
  EXPECT_FALSE(RenameTensors(md, "model.", "").ok());
  Metadata md2 = Names({"model.x"}, {"x"});
  Status s = RenameTensors(md2, "model.", "");
  EXPECT_NE(s.message().find("bytes entry"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace dcp::metadata
