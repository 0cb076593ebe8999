// A position inside a box of tokens (row-major over rank-3 extents) that moves forward without a
// division per step: the Hopper kernels walk a key box in flat order, and each thread visits
// positions a fixed distance apart, so carrying is cheaper than unravelling every position.
#pragma once

#include "attention_params.h"
#include "token_tiles.cuh"

namespace haloattn {

struct BoxCursor {
  int x[kMaxRank];  // offsets from the box's low corner; x[0] >= extent[0] once past the box
};

__host__ __device__ inline BoxCursor box_cursor(int flat, const int (&extent)[kMaxRank]) {
  BoxCursor c;
  unravel3(flat, extent, c.x);
  return c;
}

__host__ __device__ inline void advance(BoxCursor& c, int n, const int (&extent)[kMaxRank]) {
  c.x[2] += n;
  if (c.x[2] >= extent[2]) {
    const int carry = c.x[2] / extent[2];
    c.x[2] -= carry * extent[2];
    c.x[1] += carry;
  }
  if (c.x[1] >= extent[1]) {
    const int carry = c.x[1] / extent[1];
    c.x[1] -= carry * extent[1];
    c.x[0] += carry;
  }
}

}  // namespace haloattn
