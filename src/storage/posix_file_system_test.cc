#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "storage/file_system.h"

namespace dcp::storage {
namespace {

class ScratchDir {
 public:
  ScratchDir() {
    path_ = (std::filesystem::temp_directory_path() /
             ("dcp-posix-fs-test-" + std::to_string(::getpid())))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string Sub(const std::string& n) const { return JoinPath(path_, n); }

 private:
  std::string path_;
};

// The fraction of bytes [begin, end) of `path` in the page cache (mincore), -1 if unknown.
double Resident(const std::string& path, uint64_t begin, uint64_t end) {
  const ByteRange r{begin, end - begin};
  return PosixFileSystem().CachedFraction(path, std::span(&r, 1)).value_or(-1);
}

// Waits (up to `seconds`: the disk is shared, advice is asynchronous) until at least 90% of the
// pages of bytes [begin, end) of `path` are in the page cache (read-ahead pages are the first
// reclaimed under memory pressure: not all of them need to stay).
bool BecomesResident(const std::string& path, uint64_t begin, uint64_t end, int seconds = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (Resident(path, begin, end) < 0.9) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Writes `mib` MiB to `path` and drops it from the page cache; false where the file system keeps
// it in memory anyway (tmpfs) or does not read through the page cache.
bool WriteCold(const std::string& path, int mib) {
  {
    std::ofstream out(path, std::ios::binary);
    std::vector<char> block(size_t{1} << 20, 'x');
    for (int i = 0; i < mib; ++i)
      out.write(block.data(), static_cast<std::streamsize>(block.size()));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool dropped = ::fsync(fd) == 0 && ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  ::close(fd);
  return dropped && Resident(path, 0, uint64_t(mib) << 20) < 0.5;
}

// Past 4096 pages the page cache is sampled in windows spread over the ranges: the answer
// still tells which share of them is resident.
TEST(PosixFileSystemTest, TheCachedFractionOfLargeRangesIsSampledEvenly) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  ScratchDir dir;
  const std::string path = dir.Sub("data");
  if (!WriteCold(path, 64)) GTEST_SKIP() << path << " stays in memory (tmpfs?)";
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    std::vector<char> buf(kMiB);
    for (uint64_t at = 0; at < 32 * kMiB; at += kMiB) {
      ASSERT_EQ(::pread(fd, buf.data(), kMiB, static_cast<off_t>(at)), static_cast<ssize_t>(kMiB));
    }
    ::close(fd);
  }
  // Checked exactly (16 MiB: 4096 pages): what was read is there, the end is not.
  for (uint64_t at = 0; at < 32 * kMiB; at += 16 * kMiB) {
    if (Resident(path, at, at + 16 * kMiB) < 0.9) GTEST_SKIP() << "the page cache keeps too little";
  }
  ASSERT_LT(Resident(path, 48 * kMiB, 64 * kMiB), 0.1);
  EXPECT_LT(Resident(path, 40 * kMiB, 64 * kMiB), 0.1);  // sampled
  // Three ranges, 16 of their 32 MiB read (clear of what read-ahead brought past 32 MiB).
  const ByteRange ranges[] = {{0, 8 * kMiB}, {16 * kMiB, 8 * kMiB}, {48 * kMiB, 16 * kMiB}};
  const double half = PosixFileSystem().CachedFraction(path, ranges).value_or(-1);
  EXPECT_GT(half, 0.4);
  EXPECT_LT(half, 0.6);
  EXPECT_GT(Resident(path, 0, 32 * kMiB), 0.9);  // sampled
  // Bytes past the end are not in the page cache: half of a range twice the file's size.
  const double past = Resident(path, 0, 128 * kMiB);
  EXPECT_GT(past, 0.2);
  EXPECT_LT(past, 0.35);
}

TEST(PosixFileSystemTest, AnnouncedRangesAreAdvisedAWindowAheadOfTheReads) {
  // A 32 MiB file out of the page cache; its second half announced: the kernel is asked for
  // 8 MiB of it at once, and for more only as bytes are read.
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  ScratchDir dir;
  // A control: where advice itself does not bring a file into the page cache (no page cache,
  // or no room), there is nothing to check.
  const std::string control = dir.Sub("control");
  if (!WriteCold(control, 1)) GTEST_SKIP() << control << " stays in memory (tmpfs?)";
  {
    const int fd = ::open(control.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
    ::close(fd);
    if (!BecomesResident(control, 0, kMiB, 20)) {
      GTEST_SKIP() << "POSIX_FADV_WILLNEED does not bring " << control << " into the page cache";
    }
  }
  const std::string path = dir.Sub("data");
  ASSERT_TRUE(WriteCold(path, 32));
  auto file = PosixFileSystem().OpenReadable(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const std::vector<ByteRange> half{{16 * kMiB, 8 * kMiB}, {24 * kMiB, 8 * kMiB}};
  (*file)->WillRead(half);
  EXPECT_TRUE(BecomesResident(path, 16 * kMiB, 24 * kMiB));
  EXPECT_LT(Resident(path, 26 * kMiB, 32 * kMiB), 0.5);  // not asked for yet
  EXPECT_LT(Resident(path, 0, 14 * kMiB), 0.5);          // never announced
  // Reading 5 MiB leaves 3 MiB of the window ahead, under half of it: 5 MiB more are asked for.
  std::vector<std::byte> buf(5 * kMiB);
  ASSERT_TRUE((*file)->ReadAt(16 * kMiB, buf).ok());
  EXPECT_TRUE(BecomesResident(path, 24 * kMiB, 29 * kMiB));
  EXPECT_LT(Resident(path, 30 * kMiB, 32 * kMiB), 0.5);
}

TEST(PosixFileSystemTest, RefusesFifoWithoutBlocking) {
  // Issue 11 item 9: opening a FIFO for reading waited for a writer forever. (If this regresses,
  // the test hangs until ctest's timeout.)
  ScratchDir dir;
  const std::string fifo = dir.Sub("dcp.metadata");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  FileSystem& fs = PosixFileSystem();
  auto r = fs.OpenReadable(fifo);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find(fifo + ": it is a FIFO, not a regular file"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_FALSE(fs.FileSize(fifo).ok());
  EXPECT_FALSE(ReadWholeFile(fs, fifo).ok());
  // A directory is not a regular file either.
  auto d = fs.OpenReadable(dir.Sub(""));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("a directory"), std::string::npos);
}

// The non-regular-file check at open must not get in the way of ordinary files.
TEST(PosixFileSystemTest, RegularFilesStillRead) {
  ScratchDir dir;
  std::ofstream(dir.Sub("f"), std::ios::binary) << "hello";
  auto data = ReadWholeFile(PosixFileSystem(), dir.Sub("f"));
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ(*data, "hello");
}

// A file told its size takes it at once (sparse: huge pages on a huge=within_size tmpfs), and
// holds exactly what was appended once synced, whether less or all of it came.
TEST(PosixFileSystemTest, AFileToldItsSizeTakesItAndKeepsOnlyWhatCame) {
  ScratchDir dir;
  FileSystem& fs = PosixFileSystem();
  const std::string bytes(3000, 'x');
  for (size_t appended : {size_t{3000}, size_t{1000}}) {
    const std::string path = dir.Sub("f" + std::to_string(appended));
    auto f = fs.NewWritableFile(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    (*f)->WillWrite(3000);
    EXPECT_EQ(*fs.FileSize(path), 3000u);
    ASSERT_TRUE((*f)->Append(std::as_bytes(std::span(bytes.data(), appended))).ok());
    ASSERT_TRUE((*f)->Sync().ok());
    ASSERT_TRUE((*f)->Close().ok());
    EXPECT_EQ(*ReadWholeFile(fs, path), bytes.substr(0, appended));
  }
}

TEST(PosixFileSystemTest, RemoveTakesEmptyDirectoriesAndExchangeSwaps) {
  ScratchDir dir;
  FileSystem& fs = PosixFileSystem();
  std::filesystem::create_directories(dir.Sub("a"));
  std::filesystem::create_directories(dir.Sub("b"));
  std::ofstream(dir.Sub("a/x")) << "1";
  std::ofstream(dir.Sub("b/y")) << "2";
  ASSERT_TRUE(fs.Exchange(dir.Sub("a"), dir.Sub("b")).ok());
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("a/y")));
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("b/x")));
  EXPECT_FALSE(fs.Remove(dir.Sub("a")).ok());  // not empty
  ASSERT_TRUE(fs.Remove(dir.Sub("a/y")).ok());
  ASSERT_TRUE(fs.Remove(dir.Sub("a")).ok());
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("a")));
}

TEST(PosixFileSystemTest, RemoveTreeTakesATreeButNotWhatItsLinksPointTo) {
  ScratchDir dir;
  FileSystem& fs = PosixFileSystem();
  std::filesystem::create_directories(dir.Sub("tree/a/b"));
  std::filesystem::create_directories(dir.Sub("outside"));
  std::ofstream(dir.Sub("tree/a/b/x")) << "1";
  std::ofstream(dir.Sub("tree/.hidden")) << "2";
  std::ofstream(dir.Sub("outside/keep")) << "3";
  std::filesystem::create_directory_symlink(dir.Sub("outside"), dir.Sub("tree/a/link"));
  ASSERT_TRUE(fs.RemoveTree(dir.Sub("tree")).ok());
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("tree")));
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("outside/keep")));
  // A link given itself goes alone, trailing slash or not; a missing path is removed already.
  std::filesystem::create_directory_symlink(dir.Sub("outside"), dir.Sub("link"));
  ASSERT_TRUE(fs.RemoveTree(dir.Sub("link") + "/").ok());
  EXPECT_FALSE(std::filesystem::is_symlink(dir.Sub("link")));
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("outside/keep")));
  EXPECT_TRUE(fs.RemoveTree(dir.Sub("missing")).ok());
  EXPECT_EQ(fs.RemoveTree(dir.Sub("outside/..")).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("outside/keep")));
}

TEST(PosixFileSystemTest, ReuseFileOverwritesInPlaceAndCutsTheTail) {
  ScratchDir dir;
  FileSystem& fs = PosixFileSystem();
  const std::string old_path = dir.Sub("r00000.safetensors"), path = dir.Sub("new.safetensors");
  std::ofstream(old_path) << std::string(1000, 'o');
  struct stat before {};
  ASSERT_EQ(::stat(old_path.c_str(), &before), 0);

  auto f = fs.ReuseFile(old_path, path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const std::string data(300, 'n');
  ASSERT_TRUE((*f)->Append(std::as_bytes(std::span(data.data(), data.size()))).ok());
  ASSERT_TRUE((*f)->Sync().ok());
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_FALSE(std::filesystem::exists(old_path));
  struct stat after {};
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);     // the same file, not a copy
  EXPECT_EQ(*ReadWholeFile(fs, path), data);  // nothing of the old bytes past the new ones

  // Nothing to recycle: kNotFound, and nothing created.
  auto missing = fs.ReuseFile(dir.Sub("gone.safetensors"), dir.Sub("other.safetensors"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("other.safetensors")));
}

// A retired file that another name shares (a hard-linked snapshot) or a symlink planted in its
// place is never written through: only its own name goes, and the caller writes a new file.
TEST(PosixFileSystemTest, ReuseFileNeverWritesThroughLinks) {
  ScratchDir dir;
  FileSystem& fs = PosixFileSystem();
  const std::string retired = dir.Sub("r00000.safetensors"), snapshot = dir.Sub("backup");
  std::ofstream(retired) << std::string(100, 's');
  ASSERT_EQ(::link(retired.c_str(), snapshot.c_str()), 0);
  auto f = fs.ReuseFile(retired, dir.Sub("new.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound) << f.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(retired));
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("new.safetensors")));
  EXPECT_EQ(*ReadWholeFile(fs, snapshot), std::string(100, 's'));

  const std::string target = dir.Sub("precious");
  std::ofstream(target) << "keep";
  ASSERT_EQ(::symlink(target.c_str(), retired.c_str()), 0);
  auto g = fs.ReuseFile(retired, dir.Sub("new.safetensors"));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::is_symlink(retired));
  EXPECT_EQ(*ReadWholeFile(fs, target), "keep");
}

// Issue 19 item 2: a new file (a data file, a converted shard's tmp file) where a symlink or a
// hard link was planted replaces the name only: neither target changes.
TEST(PosixFileSystemTest, NewWritableFileNeverWritesThroughLinks) {
  ScratchDir dir;
  FileSystem& fs = PosixFileSystem();
  const std::string target = dir.Sub("precious"), name = dir.Sub("data.safetensors");
  std::ofstream(target) << "keep";
  for (bool hard : {false, true}) {
    std::filesystem::remove(name);
    ASSERT_EQ(hard ? ::link(target.c_str(), name.c_str()) : ::symlink(target.c_str(), name.c_str()),
              0);
    auto f = fs.NewWritableFile(name);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_TRUE((*f)->Append(std::as_bytes(std::span("new", 3))).ok());
    ASSERT_TRUE((*f)->Close().ok());
    EXPECT_EQ(*ReadWholeFile(fs, target), "keep") << (hard ? "hard link" : "symlink");
    EXPECT_EQ(*ReadWholeFile(fs, name), "new");
    EXPECT_FALSE(std::filesystem::is_symlink(name));
  }
}

}  // namespace
}  // namespace dcp::storage
