// The state dict: an ordered map fqn -> tensor entry (chunks over caller memory) or bytes
// entry (an opaque serialized object owned by the state dict).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dcp/box.h"
#include "dcp/tensor.h"

namespace dcp {

// Where a local tensor sits in the global one.
struct Chunk {
  Shape global_shape;
  Shape offsets;
};

struct TensorChunk {
  Box box;          // region of the global tensor
  TensorView view;  // caller memory holding exactly box.lengths elements, row-major
};

struct StateEntry {
  enum class Kind : uint8_t { kTensor, kBytes };

  std::string fqn;
  Kind kind = Kind::kTensor;
  // Tensor entries: dtype and global shape (from the first chunk added), and the chunks
  // this rank holds (possibly none, possibly several). Save/load validate consistency.
  DType dtype = DType::kF32;
  Shape global_shape;
  std::vector<TensorChunk> chunks;
  // Bytes entries: the payload, owned here; load replaces it.
  std::vector<std::byte> bytes;
  // Where the entry sits in the caller's nested state dict, opaque to dcp (the Python package
  // writes its keys as typed JSON); empty: none. Saved into the metadata, so a checkpoint can
  // be opened with its nesting (TensorMeta::path).
  std::string path;
};

// Not thread-safe. Views must outlive the save/load call that uses them. Entries are added,
// never renamed or removed (the name index stays true): read them through find() and entries(),
// change a bytes entry's payload through mutable_bytes().
class StateDict {
 public:
  // One chunk of `fqn`: `view` holds the box at `chunk.offsets` of a tensor of
  // `chunk.global_shape`; view.shape gives the box lengths.
  void add(std::string_view fqn, TensorView view, const Chunk& chunk);
  // A whole (unsharded) tensor.
  void add(std::string_view fqn, TensorView view);
  // A tensor of which this rank holds no chunk: it is named (so a load checks it exists with
  // this dtype and shape) without memory. Adding chunks later is allowed.
  void add_empty(std::string_view fqn, DType dtype, const Shape& global_shape);
  // A bytes entry (copied; an existing entry's payload is replaced). For load, add it empty;
  // load fills it.
  void add_bytes(std::string_view fqn, std::span<const std::byte> bytes = {});
  void add_bytes(std::string_view fqn, std::string_view text);

  // Records the nesting path of entry `fqn` (see StateEntry::path). Throws dcp::Error
  // (kInvalidArgument) when there is no such entry.
  void set_path(std::string_view fqn, std::string_view path);

  // The entry named `fqn`, or null.
  const StateEntry* find(std::string_view fqn) const;
  const std::vector<StateEntry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  // The payload of bytes entry `index` (of entries()), for load to replace. Throws
  // dcp::Error (kInvalidArgument) when the index is out of range or names a tensor entry.
  std::vector<std::byte>& mutable_bytes(size_t index);

 private:
  StateEntry& GetOrCreate(std::string_view fqn, StateEntry::Kind kind);

  std::vector<StateEntry> entries_;  // insertion order
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace dcp
