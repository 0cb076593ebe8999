// The Hopper forward kernel's work unit: two 64-token query tiles side by side (a "pair tile"),
// one per consumer warpgroup, that share the copies of one key box (their union's), so each key
// crosses from L2 once per 128 queries instead of once per 64.
//
// The pair is split along its first axis longer than one token, so each half is a box of its own
// whose rows are a contiguous run of the pair's rows in flat order (one copy loads it).
#pragma once

#include "row_windows.cuh"
#include "token_tiles.cuh"

namespace haloattn {

// choose_tile's 64-token tile doubled along the slowest axis that still has more than one tile.
inline TileShape choose_pair_tile(const AttentionParams& p) {
  TileShape s = choose_tile(p);
  for (int a = 0; a < kMaxRank; ++a) {
    if (tiles_along(p.axis[a], s, a) > 1) {
      s.n[a] *= 2;
      break;
    }
  }
  return s;
}

// The shape of tile_half's halves (the query map's box): the pair halved along its first axis
// longer than one token.
__host__ __device__ inline TileShape half_shape(const TileShape& pair) {
  TileShape h = pair;
  for (int a = 0; a < kMaxRank; ++a) {
    if (pair.n[a] >= 2) {
      h.n[a] /= 2;
      break;
    }
  }
  return h;
}

struct TileHalf {
  TileWork work;  // the half as a tile of its own (empty past the grid)
  int first_row;  // its first row among the pair's rows (flat order)
  int rows;       // rows it owns (some may lie past the grid)
};

__host__ __device__ inline TileHalf tile_half(const TileWork& pair, const TileShape& shape, int half) {
  TileHalf h;
  h.work = pair;
  int split = -1;
  for (int a = kMaxRank - 1; a >= 0; --a)
    if (shape.n[a] >= 2) split = a;
  if (split < 0) {  // a one-token pair: the first half owns it
    h.first_row = 0;
    h.rows = half == 0 ? 1 : 0;
    h.work.empty = pair.empty || half != 0;
    return h;
  }
  h.rows = shape.n[0] * shape.n[1] * shape.n[2] / 2;
  h.first_row = half * h.rows;
  // Constant indices only (an array indexed at run time would live in local memory).
#pragma unroll
  for (int a = 0; a < kMaxRank; ++a) {
    if (a != split) continue;
    h.work.x0[a] = pair.x0[a] + half * (shape.n[a] / 2);
    h.work.x1[a] = min(h.work.x0[a] + shape.n[a] / 2, pair.x1[a]);
    h.work.extent[a] = h.work.x1[a] - h.work.x0[a];
    h.work.empty = pair.empty || h.work.extent[a] <= 0;
  }
  return h;
}

}  // namespace haloattn
