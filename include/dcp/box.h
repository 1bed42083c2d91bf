// Shapes and boxes: the N-d geometry that resharding is built on.
//
// A Box is a half-open region of a global tensor: offsets[d] <= i < offsets[d] + lengths[d].
// A "chunk" is a Box that a rank holds or that is stored. Resharding is Intersect plus
// index arithmetic (see planner/copy_runs.h).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace dcp {

inline constexpr int kMaxDims = 8;

// A small fixed-capacity list of extents or coordinates (up to kMaxDims, no allocation).
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  static Shape Zeros(int rank);

  int rank() const { return rank_; }
  int64_t operator[](int d) const { return v_[d]; }
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

// The common region of two boxes of the same rank; nullopt when it is empty.
// Boxes of different ranks never intersect (callers check ranks first).
std::optional<Box> Intersect(const Box& a, const Box& b);

}  // namespace dcp
