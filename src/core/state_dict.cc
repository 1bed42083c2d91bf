#include "dcp/state_dict.h"

#include "dcp/status.h"

namespace dcp {

StateEntry& StateDict::GetOrCreate(std::string_view fqn, StateEntry::Kind kind) {
  auto [it, inserted] = index_.try_emplace(std::string(fqn), entries_.size());
  if (inserted) {
    StateEntry e;
    e.fqn = std::string(fqn);
    e.kind = kind;
    entries_.push_back(std::move(e));
  } else if (entries_[it->second].kind != kind) {
    throw Error(InvalidArgument("state dict entry '" + std::string(fqn) +
                                "' added both as a tensor and as bytes"));
  }
  return entries_[it->second];
}

void StateDict::add(std::string_view fqn, TensorView view, const Chunk& chunk) {
  StateEntry& e = GetOrCreate(fqn, StateEntry::Kind::kTensor);
  if (e.chunks.empty()) {
    e.dtype = view.dtype;
    e.global_shape = chunk.global_shape;
  }
  // Consistency (dtype, shape, bounds, overlap) is checked by save/load, where the error
  // can be agreed on by every rank.
  e.chunks.push_back(TensorChunk{Box{chunk.offsets, view.shape}, view});
}

void StateDict::add(std::string_view fqn, TensorView view) {
  add(fqn, view, Chunk{view.shape, Shape::Zeros(view.shape.rank())});
}

void StateDict::add_empty(std::string_view fqn, DType dtype, const Shape& global_shape) {
  StateEntry& e = GetOrCreate(fqn, StateEntry::Kind::kTensor);
  if (e.chunks.empty()) {
    e.dtype = dtype;
    e.global_shape = global_shape;
  }
}

void StateDict::add_bytes(std::string_view fqn, std::span<const std::byte> bytes) {
  StateEntry& e = GetOrCreate(fqn, StateEntry::Kind::kBytes);
  e.bytes.assign(bytes.begin(), bytes.end());
}

void StateDict::add_bytes(std::string_view fqn, std::string_view text) {
  add_bytes(fqn, std::as_bytes(std::span(text.data(), text.size())));
}

void StateDict::set_path(std::string_view fqn, std::string_view path) {
  auto it = index_.find(std::string(fqn));
  if (it == index_.end()) {
    throw Error(InvalidArgument("set_path: no state dict entry '" + std::string(fqn) + "'"));
  }
  entries_[it->second].path = std::string(path);
}

const StateEntry* StateDict::find(std::string_view fqn) const {
  auto it = index_.find(std::string(fqn));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::vector<std::byte>& StateDict::mutable_bytes(size_t index) {
  if (index >= entries_.size() || entries_[index].kind != StateEntry::Kind::kBytes) {
    throw Error(
        InvalidArgument("state dict entry " + std::to_string(index) + " is not a bytes entry"));
  }
  return entries_[index].bytes;
}

}  // namespace dcp
