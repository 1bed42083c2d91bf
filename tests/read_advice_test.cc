// What a broadcast load announces to storage ahead of its reads (ReadableFile::WillRead) stays
// with the file when the load's limit of open files closes it: reopened, it is told again.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/load.h"
#include "dcp/checkpoint.h"
#include "dcp/metadata.h"
#include "recording_fs.h"
#include "storage/file_system.h"
#include "test_util.h"

namespace dcp {
namespace {

using testing::RecordingFs;
using testing::TempDir;

constexpr int64_t kCols = 1024;
// Rows of tensor t<k>, saved by rank k: 6 MiB and 2 MiB of fp32, so that balancing the bytes
// read makes one rank read slabs of both.
int64_t RowsOf(int k) { return k == 0 ? 1536 : 512; }

float Value(int t, int64_t i) { return static_cast<float>(t * 1000003 + i % 65521); }

// Whether every range of `reads` lies inside one of `announced` (merged).
bool Covered(const std::vector<storage::ByteRange>& reads,
             const std::vector<storage::ByteRange>& announced) {
  const auto told = storage::MergeRanges(announced);
  return std::all_of(reads.begin(), reads.end(), [&](const storage::ByteRange& r) {
    return std::any_of(told.begin(), told.end(), [&](const storage::ByteRange& a) {
      return a.offset <= r.offset && r.offset + r.length <= a.offset + a.length;
    });
  });
}

TEST(ReadAdvice, AFileReopenedAfterTheOpenFileLimitIsToldAgain) {
  // Rank k saved tensor "t<k>" alone, so each is in a file of its own. Two ranks then load
  // both whole (dp2) with at most one open file: one of them reads slabs of both files, so
  // announcing them opens one file after the other and reading them opens a file again.
  TempDir tmp;
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    const int k = c->rank();
    std::vector<float> buf(RowsOf(k) * kCols);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = Value(k, static_cast<int64_t>(i));
    StateDict sd;
    const Shape shape{RowsOf(k), kCols};
    sd.add("t" + std::to_string(k), TensorView(buf.data(), DType::kF32, shape),
           Chunk{shape, Shape{0, 0}});
    save(sd, tmp.path(), {.comm = c});
  });
  const Metadata md = read_metadata(tmp.path());
  ASSERT_EQ(md.files.size(), 2u);
  RecordingFs fs;
  std::vector<int> right(2, 0);
  testing::RunRanks(2, [&](const std::shared_ptr<Comm>& c) {
    std::vector<std::vector<float>> bufs;
    StateDict sd;
    for (int t = 0; t < 2; ++t) {
      const Shape shape{RowsOf(t), kCols};
      bufs.emplace_back(RowsOf(t) * kCols, 0.0f);
      sd.add("t" + std::to_string(t), TensorView(bufs[t].data(), DType::kF32, shape),
             Chunk{shape, Shape{0, 0}});
    }
    auto r = checkpoint::Load(sd, tmp.path(),
                              {.comm = c,
                               .max_open_files = 1,
                               .broadcast_slab_bytes = 1 << 20,
                               .broadcast_within_host = true,
                               .broadcast_cached = true},
                              fs);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    bool ok = true;
    for (int t = 0; t < 2; ++t) {
      for (size_t i = 0; i < bufs[t].size(); ++i) ok = ok && bufs[t][i] == Value(t, i);
    }
    right[c->rank()] = ok;
  });
  EXPECT_TRUE(right[0] && right[1]);
  size_t opens_read = 0, reopened = 0;
  for (const auto& f : md.files) {
    const auto logs = fs.LogsOf(tmp.Sub(f.name));
    reopened += logs.size() > 2;  // more opens than ranks
    for (const RecordingFs::Log* log : logs) {
      if (log->read.empty()) continue;
      ++opens_read;
      EXPECT_TRUE(Covered(log->read, log->announced))
          << f.name << ": an open that read was not told what it would read";
    }
  }
  EXPECT_GT(reopened, 0u) << "no file was closed and opened again: the case this test is for";
  EXPECT_GT(opens_read, 0u);
}

}  // namespace
}  // namespace dcp
