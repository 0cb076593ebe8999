// How the kernels cut the token grid into work: one CTA per (batch, head, dilation group, tile),
// where a tile is a box of up to 64 tokens of one dilation group (in group units, so dilation is a
// strided view and never a copy), shaped in the grid's own rank (e.g. 8x8 in 2-D, 4x4x4 in 3-D).
// The tokens a tile attends lie in one box too (window_geometry.cuh); kernels walk that box in
// flat chunks of 64, so no slot is wasted on the box's own shape.
#pragma once

#include "attention_params.h"
#include "nonnegative_division.cuh"
#include "window_geometry.cuh"

namespace haloattn {

constexpr int kTileTokens = 64;

struct TileShape {
  int n[kMaxRank];  // tokens per axis; the product is at most kTileTokens
};

__host__ __device__ inline int max_group_length(const AxisParams& a) {
  return a.by_dilation.ceil_div(a.length);
}

__host__ __device__ inline int tiles_along(const AxisParams& a, const TileShape& shape, int axis) {
  return ceil_div_nonneg(max_group_length(a), shape.n[axis]);
}

// Balanced power-of-two tile: repeatedly double the axis that still needs the most tiles.
inline TileShape choose_tile(const AttentionParams& p) {
  TileShape s{{1, 1, 1}};
  while (s.n[0] * s.n[1] * s.n[2] < kTileTokens) {
    int best = -1, best_tiles = 1;
    for (int a = kMaxRank - 1; a >= 0; --a) {
      const int tiles = tiles_along(p.axis[a], s, a);
      if (tiles > best_tiles) best = a, best_tiles = tiles;
    }
    if (best < 0) break;
    s.n[best] *= 2;
  }
  return s;
}

__host__ __device__ inline void unravel3(int flat, const int (&extent)[kMaxRank], int (&c)[kMaxRank]) {
  const int rest = div_nonneg(flat, extent[2]);
  c[2] = flat - rest * extent[2];
  c[0] = div_nonneg(rest, extent[1]);
  c[1] = rest - c[0] * extent[1];
}

// One CTA's share of the grid: a box [x0, x1) of dilation group `group` of (batch, head).
struct TileWork {
  int batch, head;
  int group[kMaxRank];      // dilation group coordinate per axis
  int group_len[kMaxRank];  // L_g per axis
  int x0[kMaxRank], x1[kMaxRank];
  int extent[kMaxRank];     // x1 - x0
  bool empty;               // the tile lies past this group's end (groups differ in length)
};

__host__ __device__ inline TileWork locate_tile(const AttentionParams& p, const TileShape& shape, int heads, int cta) {
  TileWork w;
  int tile_coord[kMaxRank];
  for (int a = kMaxRank - 1; a >= 0; --a) {
    const int n = tiles_along(p.axis[a], shape, a);
    const int rest = div_nonneg(cta, n);
    tile_coord[a] = cta - rest * n;
    cta = rest;
  }
  for (int a = kMaxRank - 1; a >= 0; --a) {
    const int rest = p.axis[a].by_dilation.div(cta);
    w.group[a] = cta - rest * p.axis[a].dilation;
    cta = rest;
  }
  w.batch = div_nonneg(cta, heads);
  w.head = cta - w.batch * heads;
  w.empty = false;
  for (int a = 0; a < kMaxRank; ++a) {
    w.group_len[a] = group_length(p.axis[a], w.group[a]);
    w.x0[a] = tile_coord[a] * shape.n[a];
    w.x1[a] = min(w.x0[a] + shape.n[a], w.group_len[a]);
    w.extent[a] = w.x1[a] - w.x0[a];
    if (w.extent[a] <= 0) w.empty = true;
  }
  return w;
}

inline int64_t count_tiles(const AttentionParams& p, const TileShape& shape, int heads) {
  int64_t n = static_cast<int64_t>(p.batch) * heads;
  for (int a = 0; a < kMaxRank; ++a) n *= static_cast<int64_t>(p.axis[a].dilation) * tiles_along(p.axis[a], shape, a);
  return n;
}

// Group coordinates of flat position `flat` of box [lo, lo + extent); false past the box.
__host__ __device__ inline bool box_coords(int flat, const int (&lo)[kMaxRank], const int (&extent)[kMaxRank],
                                  int (&x)[kMaxRank]) {
  if (flat >= extent[0] * extent[1] * extent[2]) return false;
  unravel3(flat, extent, x);
  for (int a = 0; a < kMaxRank; ++a) x[a] += lo[a];
  return true;
}

// Group coordinates of row `row` of a CTA's own tile (rows in the order of the full tile shape,
// so row r of every tile has the same place); false for rows past the grid's end.
__host__ __device__ inline bool tile_row_coords(const TileWork& w, const TileShape& shape, int row, int (&x)[kMaxRank]) {
  const int extent[kMaxRank] = {shape.n[0], shape.n[1], shape.n[2]};
  bool inside = row < shape.n[0] * shape.n[1] * shape.n[2];
  unravel3(row, extent, x);
  for (int a = 0; a < kMaxRank; ++a) {
    x[a] += w.x0[a];
    inside = inside && x[a] < w.x1[a];
  }
  return inside;
}

// Element offset of the token at group coordinates x (token coordinate x * dilation + group).
__device__ inline int64_t token_offset(const AttentionParams& p, const TokenTensor& t, const TileWork& w,
                                       const int (&x)[kMaxRank]) {
  int64_t off = 0;
  for (int a = 0; a < kMaxRank; ++a) off += static_cast<int64_t>(x[a] * p.axis[a].dilation + w.group[a]) * t.axis_stride[a];
  return off;
}

// Flat row-major token index (for the [B, *spatial, H] LSE and delta buffers).
__host__ __device__ inline int64_t token_index(const AttentionParams& p, const TileWork& w, const int (&x)[kMaxRank]) {
  int64_t flat = 0;
  for (int a = 0; a < kMaxRank; ++a) flat = flat * p.axis[a].length + x[a] * p.axis[a].dilation + w.group[a];
  return flat;
}

__host__ __device__ inline int64_t grid_tokens(const AttentionParams& p) {
  return static_cast<int64_t>(p.axis[0].length) * p.axis[1].length * p.axis[2].length;
}

// Index of the query at group coordinates x of tile w in the [B, *spatial, H] LSE buffer.
__host__ __device__ inline int64_t lse_index(const AttentionParams& p, const TileWork& w, const int (&x)[kMaxRank]) {
  return (w.batch * grid_tokens(p) + token_index(p, w, x)) * p.heads + w.head;
}

}  // namespace haloattn
