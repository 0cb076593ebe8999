// Neighbourhood tests of the Hopper forward kernel in box-relative coordinates: a query's window
// as per-axis [lo, lo + width) against a key's box coordinates (the producer stores them as int4
// x0, x1, x2), and whether a whole chunk of keys lies inside a window. Host-callable so that
// tests/cuda_host/tiling_check.cu can check the mask-free chunks against a brute force.
#pragma once

#include <cuda_runtime.h>

#include "row_windows.cuh"

namespace haloattn {

// The box coordinate the producer gives key slots past the end of a box: no window holds it.
constexpr int kPastBox = 1 << 30;

// A query's neighbourhood relative to the key box, as per-axis [lo, lo + width): one unsigned
// compare per axis tests a key (a key below lo wraps to a large unsigned offset).
struct BoxWindow {
  int lo[kMaxRank];
  unsigned width[kMaxRank];
};

__host__ __device__ inline BoxWindow box_window(const RowWindow& r, const int (&box_lo)[kMaxRank]) {
  BoxWindow b;
#pragma unroll
  for (int a = 0; a < kMaxRank; ++a) {
    b.lo[a] = r.lo[a] - box_lo[a];
    b.width[a] = static_cast<unsigned>(r.hi[a] > r.lo[a] ? r.hi[a] - r.lo[a] : 0);
  }
  return b;
}

// Tests only the grid's RANK trailing axes: the leading padding axes hold every key.
template <int RANK>
__host__ __device__ __forceinline__ bool holds(const BoxWindow& b, const int4& key) {
  bool in = static_cast<unsigned>(key.z - b.lo[2]) < b.width[2];
  if (RANK >= 2) in = in && static_cast<unsigned>(key.y - b.lo[1]) < b.width[1];
  if (RANK >= 3) in = in && static_cast<unsigned>(key.x - b.lo[0]) < b.width[0];
  return in;
}

// True when every key of a chunk lies in `b`: the chunk runs in flat order from `first` to
// `last`, so along an axis it covers [first, last] when all slower axes agree and the whole
// box extent otherwise.
__host__ __device__ inline bool spans_inside(const int4& first, const int4& last, const BoxWindow& b,
                                             const int (&extent)[kMaxRank]) {
  const int lo[kMaxRank] = {first.x, first.x == last.x ? first.y : 0, first.x == last.x && first.y == last.y ? first.z : 0};
  const int hi[kMaxRank] = {last.x, first.x == last.x ? last.y : extent[1] - 1,
                            first.x == last.x && first.y == last.y ? last.z : extent[2] - 1};
  bool inside = true;
#pragma unroll
  for (int a = 0; a < kMaxRank; ++a)
    inside = inside && lo[a] >= b.lo[a] && static_cast<unsigned>(hi[a] - b.lo[a]) < b.width[a];
  return inside;
}

}  // namespace haloattn
