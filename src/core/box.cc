#include "dcp/box.h"

#include <algorithm>
#include <cassert>
#include <string>

#include "dcp/status.h"

namespace dcp {

namespace {

// A fixed array sits behind Shape: the limit is checked in release builds too.
void CheckRank(size_t rank) {
  if (rank > static_cast<size_t>(kMaxDims)) {
    throw Error(InvalidArgument("a shape has " + std::to_string(rank) +
                                " dimensions; dcp supports at most " + std::to_string(kMaxDims)));
  }
}

}  // namespace

Shape::Shape(std::initializer_list<int64_t> dims) {
  CheckRank(dims.size());
  for (int64_t d : dims) v_[rank_++] = d;
}

Shape Shape::Zeros(int rank) {
  if (rank < 0) throw Error(InvalidArgument("a shape cannot have negative rank"));
  CheckRank(static_cast<size_t>(rank));
  Shape s;
  s.rank_ = rank;
  return s;
}

void Shape::push_back(int64_t x) {
  CheckRank(static_cast<size_t>(rank_) + 1);
  v_[rank_++] = x;
}

std::optional<uint64_t> Shape::NumElements() const {
  uint64_t n = 1;
  for (int d = 0; d < rank_; ++d) {
    if (v_[d] < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(v_[d]), &n)) return std::nullopt;
  }
  return n;
}

std::string Shape::ToString() const {
  std::string s = "[";
  for (int d = 0; d < rank_; ++d) {
    if (d) s += ", ";
    s += std::to_string(v_[d]);
  }
  return s + "]";
}

bool operator==(const Shape& a, const Shape& b) {
  return a.rank_ == b.rank_ && std::equal(a.begin(), a.end(), b.begin());
}

bool operator<(const Shape& a, const Shape& b) {
  if (a.rank_ != b.rank_) return a.rank_ < b.rank_;
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
}

bool Box::WithinShape(const Shape& shape) const {
  if (offsets.rank() != shape.rank() || lengths.rank() != shape.rank()) return false;
  for (int d = 0; d < shape.rank(); ++d) {
    if (offsets[d] < 0 || lengths[d] < 0 || offsets[d] > shape[d] ||
        lengths[d] > shape[d] - offsets[d]) {
      return false;
    }
  }
  return true;
}

bool Box::Contains(const Box& inner) const {
  if (inner.rank() != rank()) return false;
  for (int d = 0; d < rank(); ++d) {
    if (inner.offsets[d] < offsets[d] ||
        inner.offsets[d] + inner.lengths[d] > offsets[d] + lengths[d]) {
      return false;
    }
  }
  return true;
}

std::string Box::ToString() const {
  return "{offsets " + offsets.ToString() + ", lengths " + lengths.ToString() + "}";
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  if (a.rank() != b.rank()) return std::nullopt;
  Box out{Shape::Zeros(a.rank()), Shape::Zeros(a.rank())};
  for (int d = 0; d < a.rank(); ++d) {
    int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    int64_t hi = std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d]);
    if (lo >= hi) return std::nullopt;
    out.offsets[d] = lo;
    out.lengths[d] = hi - lo;
  }
  return out;
}

std::optional<std::pair<size_t, size_t>> FindOverlap(const std::vector<Box>& boxes) {
  return FindOverlap(boxes.size(), [&](size_t i) -> const Box& { return boxes[i]; });
}

}  // namespace dcp
