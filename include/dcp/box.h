// Shapes and boxes: the N-d geometry that resharding is built on.
//
// A Box is a half-open region of a global tensor: offsets[d] <= i < offsets[d] + lengths[d].
// A "chunk" is a Box that a rank holds or that is stored. Resharding is Intersect plus
// index arithmetic (see planner/copy_runs.h).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dcp {

inline constexpr int kMaxDims = 8;

// A small fixed-capacity list of extents or coordinates (up to kMaxDims, no allocation).
// Building one of more than kMaxDims dimensions throws dcp::Error (kInvalidArgument), in every
// build type.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  static Shape Zeros(int rank);

  int rank() const { return rank_; }
  int64_t operator[](int d) const { return v_[d]; }  // 0 <= d < rank()
  int64_t& operator[](int d) { return v_[d]; }
  void push_back(int64_t x);
  const int64_t* begin() const { return v_.data(); }
  const int64_t* end() const { return v_.data() + rank_; }

  // Product of extents (1 for a 0-d shape); nullopt on overflow or a negative extent.
  std::optional<uint64_t> NumElements() const;

  std::string ToString() const;  // "[8192, 2048]"
  friend bool operator==(const Shape& a, const Shape& b);
  friend bool operator<(const Shape& a, const Shape& b);  // lexicographic, rank first

 private:
  std::array<int64_t, kMaxDims> v_{};
  int rank_ = 0;
};

struct Box {
  Shape offsets;
  Shape lengths;

  static Box Whole(const Shape& shape) { return {Shape::Zeros(shape.rank()), shape}; }
  int rank() const { return offsets.rank(); }
  uint64_t NumElements() const { return lengths.NumElements().value_or(0); }
  bool Empty() const { return NumElements() == 0; }
  // True when this box lies inside [0, shape).
  bool WithinShape(const Shape& shape) const;
  bool Contains(const Box& inner) const;
  std::string ToString() const;  // "{offsets [0, 4], lengths [2, 4]}"

  friend bool operator==(const Box& a, const Box& b) = default;
  friend bool operator<(const Box& a, const Box& b) {
    return a.offsets == b.offsets ? a.lengths < b.lengths : a.offsets < b.offsets;
  }
};

// Two boxes of `boxes` (indices) that overlap, or nullopt when all are pairwise disjoint.
// Identical non-empty boxes overlap. Sweeps along the dimension whose offsets vary most, so
// the usual slab layouts (split along any one dimension) cost O(n log n).
std::optional<std::pair<size_t, size_t>> FindOverlap(const std::vector<Box>& boxes);
// The same over `n` boxes given by `box_at(i)` (returning const Box&).
template <typename BoxAt>
std::optional<std::pair<size_t, size_t>> FindOverlap(size_t n, BoxAt box_at);

// The common region of two boxes of the same rank; nullopt when it is empty.
// Boxes of different ranks never intersect (callers check ranks first).
std::optional<Box> Intersect(const Box& a, const Box& b);

template <typename BoxAt>
std::optional<std::pair<size_t, size_t>> FindOverlap(size_t n, BoxAt box_at) {
  if (n < 2) return std::nullopt;
  const int rank = box_at(0).rank();
  // Sweep along the dimension with the most distinct offsets.
  int dim = 0;
  size_t best = 0;
  std::vector<int64_t> offsets(n);
  for (int d = 0; d < rank; ++d) {
    for (size_t i = 0; i < n; ++i) offsets[i] = box_at(i).offsets[d];
    std::sort(offsets.begin(), offsets.end());
    const auto distinct =
        static_cast<size_t>(std::unique(offsets.begin(), offsets.end()) - offsets.begin());
    if (distinct > best) best = distinct, dim = d;
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  if (rank > 0) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return box_at(a).offsets[dim] < box_at(b).offsets[dim];
    });
  }
  for (size_t i = 0; i < n; ++i) {
    const Box& a = box_at(order[i]);
    if (a.Empty()) continue;
    for (size_t j = i + 1; j < n; ++j) {
      const Box& b = box_at(order[j]);
      // Sorted along `dim`: nothing further starts before `a` ends there.
      if (rank > 0 && b.offsets[dim] >= a.offsets[dim] + a.lengths[dim]) break;
      if (!b.Empty() && Intersect(a, b)) {
        return std::pair{std::min(order[i], order[j]), std::max(order[i], order[j])};
      }
    }
  }
  return std::nullopt;
}

}  // namespace dcp
