// The collectives a broadcast load has in flight, and the staging buffers they hold
// (broadcast_load.cc): bounded in number and in bytes, buffers kept for reuse within the bound.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "dcp/checkpoint.h"
#include "dcp/comm.h"

namespace dcp::checkpoint {

// Outstanding collectives (broadcasts, all-gathers), oldest first, at most `limit`, holding at
// most `max_held` bytes of buffers (one larger operation may go alone).
class InFlight {
 public:
  InFlight(size_t limit, uint64_t max_held, LoadResult* stats)
      : limit_(std::max<size_t>(limit, 1)), max_held_(max_held), stats_(stats) {}
  // Requests remain only after a communication failure. The backend may still write into
  // their buffers (MPI cannot cancel a collective), so they are left allocated, as in
  // WaitOldest, rather than freed under it.
  ~InFlight();
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

  // A staging buffer: `size` bytes in use of `capacity`.
  struct Buffer {
    std::unique_ptr<std::byte[]> data;
    uint64_t capacity = 0;
    uint64_t size = 0;
    std::span<std::byte> span() const { return {data.get(), size}; }
  };

  struct Op {
    std::unique_ptr<CommRequest> request;
    uint64_t held = 0;                                     // buffer bytes it holds
    Buffer staging;                                        // whole stored chunks
    std::function<void(std::span<const std::byte>)> done;  // run on staging once complete
  };

  // A buffer of `bytes` (reserved just before, `staged`): a kept one when one fits
  // (Reusable), for a new one would be faulted in page by page (each a zeroed page) for every
  // broadcast; its bytes are whatever it held. Its whole capacity is held from now on (the
  // operation's `held`); the kept buffers already counted it.
  Buffer Take(uint64_t bytes);

  // Waits for older operations until one more holding `bytes` fits, by count and by memory
  // (one oversized operation may go alone), and counts those bytes as held from now on: called
  // before its buffer is allocated, so the peak recorded is what is really held (kept buffers
  // included). `staged`: a staging buffer is taken right after (Take); a kept one that fits
  // moves from kept to held and needs no more room, else the kept ones are freed first when
  // the budget runs short.
  Status Reserve(uint64_t bytes, bool staged = false);
  // Frees the kept buffers.
  void ReleaseKept();
  // Keeps the started operation `request`, whose `op.held` bytes were reserved just before.
  Status Post(Result<std::unique_ptr<CommRequest>> request, Op op);
  Status WaitOldest();
  Status Drain();
  // Lets the backend move data while this rank is busy reading.
  void Progress();

 private:
  size_t limit_;
  uint64_t max_held_;
  LoadResult* stats_;
  uint64_t held_ = 0;
  std::deque<Op> ops_;
  // Finished operations' buffers, kept while they and the held ones stay within max_held.
  std::vector<Buffer> free_;
  uint64_t free_bytes_ = 0;

  // The kept buffer an operation of `bytes` takes: the smallest of at least that and at most
  // twice that; free_.end() if none.
  std::vector<Buffer>::iterator Reusable(uint64_t bytes);
  void Give(Buffer b);
};

}  // namespace dcp::checkpoint
