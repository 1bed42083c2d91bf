// A load layout's own read pattern, as a reference of `dcp bench` (docs/benchmarks.md):
// every stored chunk the layout needs, read raw once by one rank that needs it, in file
// order, a rank's adjacent chunks as one run. It is what any reader that reads only what its
// ranks need asks of the disk, so a load's distance to it is dcp's own (planning, exchanges,
// copies, checksums), and its distance to the sequential read is the layout's.
#pragma once

#include <cstdint>
#include <vector>

namespace dcp::bench {

// Where a stored chunk lies: file index into the metadata's files, byte range.
struct PatternChunk {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Bytes one rank reads in one go (a run may still be read in several requests).
struct PatternRun {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Which rank reads which chunk: needs[r] lists the indices into `chunks` rank r needs. Each
// chunk somebody needs goes to the rank among those needing it with the fewest bytes assigned
// so far (ties: the lowest rank), chunks taken in file order, so that every rank decides the
// same from the same inputs. Returns, per rank, its runs in file order: its chunks, adjacent
// ones joined.
std::vector<std::vector<PatternRun>> AssignPatternReads(
    const std::vector<PatternChunk>& chunks, const std::vector<std::vector<uint32_t>>& needs);

}  // namespace dcp::bench
