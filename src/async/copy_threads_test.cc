#include "async/copy_threads.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

namespace dcp::async {
namespace {

// Pieces of every size class (empty, under the streamed minimum, odd lengths), each small
// size at all 16 source and 64 destination alignments (larger ones at 16 and 1), copied
// exactly: in a small job (plain memcpy) and in one past the streaming threshold of 16 MiB
// (non-temporal stores on x86-64), by one thread and by three (the large job: 3 ranges of
// over 8 MiB each).
TEST(CopyThreads, CopiesEveryByteAtAnyAlignmentStreamedOrNot) {
  const std::vector<uint64_t> sizes = {0, 1, 15, 63, 64, 65, 255, 256, 257, 4095};
  for (const uint64_t filler : {uint64_t{0}, uint64_t{28} << 20}) {  // the second: streamed
    struct Piece {
      uint64_t src, dst, size;
    };
    std::vector<Piece> layout;
    uint64_t s = 0, d = 0;
    auto add = [&](uint64_t size, uint64_t src_skew, uint64_t dst_skew) {
      layout.push_back({s + src_skew, d + dst_skew, size});
      s = (s + src_skew + size + 63) / 64 * 64;
      d = (d + dst_skew + size + 63) / 64 * 64;
    };
    for (const uint64_t size : sizes) {
      for (uint64_t a = 0; a < 16; ++a) {
        for (uint64_t b = 0; b < 64; ++b) add(size, a, b);  // every offset in a cache line
      }
    }
    for (uint64_t a = 0; a < 16; ++a) add(65537, a, 15 - a);  // (the small job stays small)
    add(1000003, 5, 9);
    add(filler, 3, 0);
    // The destination from a cache-line boundary, so that its offsets are the alignments.
    std::vector<std::byte> src(s), dst_memory(d + 64);
    std::byte* const line = reinterpret_cast<std::byte*>(
        (reinterpret_cast<uintptr_t>(dst_memory.data()) + 63) / 64 * 64);
    const std::span<std::byte> dst(line, d);
    for (uint64_t i = 0; i < s; ++i) src[i] = static_cast<std::byte>((i * 131) ^ (i >> 9));
    for (const int threads : {1, 3}) {
      std::fill(dst.begin(), dst.end(), std::byte{0});
      std::vector<CopyPiece> pieces;
      for (const Piece& p : layout) {
        pieces.push_back({src.data() + p.src, dst.data() + p.dst, p.size});
      }
      CopyThreads copiers(threads);
      EXPECT_EQ(copiers.Copy(pieces), filler > 0 ? threads : 1);
      std::vector<bool> inside(d);
      for (size_t k = 0; k < layout.size(); ++k) {
        const Piece& p = layout[k];
        ASSERT_EQ(std::memcmp(dst.data() + p.dst, src.data() + p.src, p.size), 0)
            << "piece " << k << " of " << p.size << " bytes, filler " << filler << ", threads "
            << threads;
        std::fill(inside.begin() + p.dst, inside.begin() + p.dst + p.size, true);
      }
      for (uint64_t i = 0; i < d; ++i) {  // nothing written outside the pieces
        if (!inside[i]) {
          ASSERT_EQ(dst[i], std::byte{0}) << "byte " << i << " outside";
        }
      }
    }
  }
}

}  // namespace
}  // namespace dcp::async
