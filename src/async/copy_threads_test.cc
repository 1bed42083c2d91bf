#include "async/copy_threads.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace dcp::async {
namespace {

// Pieces of every size class (empty, under the streamed minimum, odd lengths) at every
// alignment of source and destination, copied exactly: in a small job (plain memcpy) and in
// one past the streaming threshold (16 MiB) (non-temporal stores on x86-64), by 1 and 3 threads.
TEST(CopyThreads, CopiesEveryByteAtAnyAlignmentStreamedOrNot) {
  const std::vector<uint64_t> sizes = {0, 1, 15, 63, 64, 255, 256, 257, 4095, 65537};
  for (const uint64_t filler : {uint64_t{0}, uint64_t{20} << 20}) {  // the second: streamed
    std::vector<uint64_t> lengths;
    for (int a = 0; a < 16; ++a) lengths.insert(lengths.end(), sizes.begin(), sizes.end());
    lengths.push_back(1000003);
    lengths.push_back(filler);
    uint64_t total = 0;
    for (uint64_t n : lengths) total += n + 32;
    std::vector<std::byte> src(total), dst(total);
    for (uint64_t i = 0; i < total; ++i) src[i] = static_cast<std::byte>((i * 131) ^ (i >> 9));
    for (const int threads : {1, 3}) {
      std::fill(dst.begin(), dst.end(), std::byte{0});
      std::vector<CopyPiece> pieces;
      std::vector<std::pair<uint64_t, uint64_t>> spans;  // (source offset, destination offset)
      uint64_t s = 0, d = 0;
      for (size_t k = 0; k < lengths.size(); ++k) {
        const uint64_t src_skew = k % 16, dst_skew = (k * 7) % 16;  // every alignment
        spans.emplace_back(s + src_skew, d + dst_skew);
        pieces.push_back({src.data() + s + src_skew, dst.data() + d + dst_skew, lengths[k]});
        s += lengths[k] + src_skew;
        d += lengths[k] + dst_skew;
        s = (s + 15) / 16 * 16;
        d = (d + 15) / 16 * 16;
      }
      ASSERT_LE(std::max(s, d), total);
      CopyThreads copiers(threads);
      copiers.Copy(pieces);
      for (size_t k = 0; k < lengths.size(); ++k) {
        ASSERT_EQ(
            std::memcmp(dst.data() + spans[k].second, src.data() + spans[k].first, lengths[k]), 0)
            << "piece " << k << " of " << lengths[k] << " bytes, filler " << filler << ", threads "
            << threads;
      }
      // Nothing written outside the pieces.
      std::vector<bool> inside(total);
      for (size_t k = 0; k < lengths.size(); ++k) {
        for (uint64_t i = 0; i < lengths[k]; ++i) inside[spans[k].second + i] = true;
      }
      for (uint64_t i = 0; i < total; ++i) {
        if (!inside[i]) {
          ASSERT_EQ(dst[i], std::byte{0}) << "byte " << i << " outside";
        }
      }
    }
  }
}

}  // namespace
}  // namespace dcp::async
