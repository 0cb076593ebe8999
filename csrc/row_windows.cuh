// Per-element masking: each query's neighbourhood as one [lo, hi) range per axis (group units),
// tested against a key's group coordinates. Keys past a box carry coordinate -1 and rows past
// the grid an empty range, so padding never attends.
#pragma once

#include "token_tiles.cuh"
#include "window_geometry.cuh"

namespace haloattn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct RowWindow {
  int lo[kMaxRank], hi[kMaxRank];
};

// The partner rule along one axis: the keys query x sees (key_range) or, key-major (`inverse`:
// the dK/dV pass, whose rows are keys), the queries that see key x (query_range). Both are
// monotone in x, so everything below holds for either direction.
__host__ __device__ inline Range partner_range(const AxisParams& a, Pattern pattern, int x, int group_len, bool inverse) {
  return inverse ? query_range(a, pattern, x, group_len) : key_range(a, pattern, x, group_len);
}

// Row x's partners (its keys, or with `inverse` the queries that see it) as [lo, hi) per axis.
__host__ __device__ inline RowWindow query_window(const AttentionParams& p, const TileWork& w, const int (&x)[kMaxRank],
                                         bool inside, bool inverse = false) {
  RowWindow r;
  for (int a = 0; a < kMaxRank; ++a) {
    const Range k = partner_range(p.axis[a], p.pattern, inside ? x[a] : 0, w.group_len[a], inverse);
    r.lo[a] = inside ? k.lo : 0;
    r.hi[a] = inside ? k.hi : 0;
  }
  return r;
}

__host__ __device__ inline bool attends(const RowWindow& r, const int (&key)[kMaxRank]) {
  bool ok = true;
#pragma unroll
  for (int a = 0; a < kMaxRank; ++a) ok = ok && r.lo[a] <= key[a] && key[a] < r.hi[a];
  return ok;
}

// The box of partners a tile's rows [x0, x1) see (keys; with `inverse` the queries that see the
// tile's keys): the partner rule is monotone, so the first and last row bound it on every axis.
__host__ __device__ inline void partner_box(const AttentionParams& p, const TileWork& w, int (&lo)[kMaxRank],
                                   int (&extent)[kMaxRank], bool inverse) {
  for (int a = 0; a < kMaxRank; ++a) {
    const Range first = partner_range(p.axis[a], p.pattern, w.x0[a], w.group_len[a], inverse);
    const Range last = partner_range(p.axis[a], p.pattern, w.x1[a] - 1, w.group_len[a], inverse);
    lo[a] = first.lo;
    extent[a] = last.hi - first.lo;
  }
}

// The box of keys a tile's queries see.
__host__ __device__ inline void key_box(const AttentionParams& p, const TileWork& w, int (&lo)[kMaxRank],
                               int (&extent)[kMaxRank]) {
  partner_box(p, w, lo, extent, false);
}

// True when every query of the tile sees the same keys on every axis (e.g. stride == window with
// aligned tiles): then the key box is exactly each query's neighbourhood and only the padding
// past the box needs a mask. By monotonicity the first and last query decide it.
__host__ __device__ inline bool tile_shares_one_window(const AttentionParams& p, const TileWork& w) {
  bool same = true;
  for (int a = 0; a < kMaxRank; ++a) {
    const Range first = key_range(p.axis[a], p.pattern, w.x0[a], w.group_len[a]);
    const Range last = key_range(p.axis[a], p.pattern, w.x1[a] - 1, w.group_len[a]);
    same = same && first.lo == last.lo && first.hi == last.hi;
  }
  return same;
}

// The partners every row of a tile attends (with `inverse`: the queries that see every key of
// the tile), per axis [lo, hi) (empty where hi <= lo): by monotonicity the last row's start and
// the first row's end.
__host__ __device__ inline RowWindow common_window(const AttentionParams& p, const TileWork& w, bool inverse = false) {
  RowWindow r;
  for (int a = 0; a < kMaxRank; ++a) {
    r.lo[a] = partner_range(p.axis[a], p.pattern, w.x1[a] - 1, w.group_len[a], inverse).lo;
    r.hi[a] = partner_range(p.axis[a], p.pattern, w.x0[a], w.group_len[a], inverse).hi;
  }
  return r;
}

// The box of queries that see a tile's keys [x0, x1) (the inverse rule).
__host__ __device__ inline void query_box(const AttentionParams& p, const TileWork& w, int (&lo)[kMaxRank],
                                 int (&extent)[kMaxRank]) {
  partner_box(p, w, lo, extent, true);
}

// Group coordinates of the ROWS tokens [first, first + ROWS) of a box into smem ([axis][ROWS]),
// -1 past the box. Threads [0, ROWS) each write one token.
template <int ROWS = kTileTokens>
__device__ inline void store_box_coords(int* coords, int first, const int (&lo)[kMaxRank],
                                        const int (&extent)[kMaxRank]) {
  if (threadIdx.x < ROWS) {
    int y[kMaxRank];
    const bool valid = box_coords(first + threadIdx.x, lo, extent, y);
    for (int a = 0; a < kMaxRank; ++a) coords[a * ROWS + threadIdx.x] = valid ? y[a] : -1;
  }
}

__device__ inline void read_coords(const int* coords, int col, int (&y)[kMaxRank]) {
  y[0] = coords[col];
  y[1] = coords[kTileTokens + col];
  y[2] = coords[2 * kTileTokens + col];
}

}  // namespace haloattn
