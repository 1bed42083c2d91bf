// Compact binary encoding helpers: LEB128 varints, fixed little-endian 64-bit values and
// length-prefixed strings. Used by the metadata codec and by the plans ranks exchange.
// The reader never reads past its input: on malformed data it latches !ok() and returns 0s.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "dcp/box.h"

namespace dcp::wire {

class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  void Varint(uint64_t v) {
    char buf[10];
    int n = 0;
    while (v >= 0x80) {
      buf[n++] = static_cast<char>(v | 0x80);
      v >>= 7;
    }
    buf[n++] = static_cast<char>(v);
    out_.append(buf, n);
  }
  void Fixed64(uint64_t v) {
    char buf[8];
    for (int i = 0; i < 8; ++i) buf[i] = static_cast<char>(v >> (8 * i));
    out_.append(buf, 8);
  }
  void Byte(uint8_t b) { out_.push_back(static_cast<char>(b)); }
  void String(std::string_view s) {
    Varint(s.size());
    out_.append(s);
  }
  // Rank byte followed by the extents.
  void ShapeWithRank(const Shape& s) {
    Byte(static_cast<uint8_t>(s.rank()));
    for (int64_t d : s) Varint(static_cast<uint64_t>(d));
  }
  void Extents(const Shape& s) {
    for (int64_t d : s) Varint(static_cast<uint64_t>(d));
  }

 private:
  std::string& out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : p_(in.data()), end_(in.data() + in.size()) {}
  bool ok() const { return ok_; }
  bool AtEnd() const { return p_ == end_; }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) return Fail();
      uint8_t b = static_cast<uint8_t>(*p_++);
      if (shift == 63 && b > 1) return Fail();  // would overflow 64 bits
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    return Fail();
  }
  uint64_t Fixed64() {
    if (end_ - p_ < 8) return Fail();
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p_[i])) << (8 * i);
    p_ += 8;
    return v;
  }
  uint8_t Byte() {
    if (p_ == end_) return static_cast<uint8_t>(Fail());
    return static_cast<uint8_t>(*p_++);
  }
  std::string_view String() {
    uint64_t n = Varint();
    if (!ok_ || remaining() < n) return Fail(), std::string_view();
    std::string_view s(p_, n);
    p_ += n;
    return s;
  }
  // A count of items each taking at least `min_bytes`, bounded by what is left so a
  // corrupt count cannot make the caller allocate gigabytes.
  uint64_t Count(uint64_t min_bytes) {
    uint64_t n = Varint();
    if (ok_ && min_bytes > 0 && n > remaining() / min_bytes) return Fail();
    return n;
  }
  Shape Extents(int rank) {
    Shape s = Shape::Zeros(rank);
    for (int d = 0; d < rank; ++d) {
      uint64_t v = Varint();
      s[d] = v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v);
    }
    return s;
  }
  Shape ShapeWithRank() {
    uint8_t rank = Byte();
    if (rank > kMaxDims) return Fail(), Shape();
    return Extents(rank);
  }

 private:
  uint64_t Fail() {
    ok_ = false;
    p_ = end_;
    return 0;
  }
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

}  // namespace dcp::wire
