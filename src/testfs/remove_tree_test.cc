// FileSystem::RemoveTree's default, the one file systems without their own (object stores,
// test file systems) use, over a real directory: it must not follow links either.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "testfs/forwarding_file_system.h"

namespace dcp::testfs {
namespace {

// Posix underneath, the default RemoveTree on top (each level through List and Remove).
class ListingFileSystem final : public ForwardingFileSystem {};

TEST(DefaultRemoveTree, TakesATreeButNotWhatItsLinksPointTo) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("dcp-remove-tree-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "tree/a/b");
  std::filesystem::create_directories(dir / "outside");
  std::ofstream(dir / "tree/a/b/x") << "1";
  std::ofstream(dir / "tree/y") << "2";
  std::ofstream(dir / "outside/keep") << "3";
  std::filesystem::create_directory_symlink(dir / "outside", dir / "tree/a/link");
  ListingFileSystem fs;
  ASSERT_TRUE(fs.RemoveTree((dir / "tree").string()).ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "tree"));
  EXPECT_TRUE(std::filesystem::exists(dir / "outside/keep"));
  // A link named with a trailing slash goes alone; a missing path is removed already; "/" is
  // refused.
  std::filesystem::create_directory_symlink(dir / "outside", dir / "link");
  ASSERT_TRUE(fs.RemoveTree((dir / "link").string() + "/").ok());
  EXPECT_FALSE(std::filesystem::is_symlink(dir / "link"));
  EXPECT_TRUE(std::filesystem::exists(dir / "outside/keep"));
  EXPECT_TRUE(fs.RemoveTree((dir / "missing").string()).ok());
  EXPECT_EQ(fs.RemoveTree("/").code(), StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dcp::testfs
