// Global -> shared copies of token rows (one head's [dim] vector per token) for the kernels:
// a tile's rows are a box of one dilation group, gathered by coordinates, zero-filled past the box.
#pragma once

#include "mma_fragments.cuh"
#include "token_tiles.cuh"

namespace haloattn {

constexpr int kThreads = 128;  // 4 warps, 16 rows of a 64-row tile each

// Shared-memory pitch of a [64][D] tile: 16 bytes of padding keep the fragment loads of one
// warp on 32 distinct banks.
template <int D> constexpr int tile_pitch() { return D + 8; }

// Group coordinates of flat position `flat` of box [lo, lo + extent); false past the box.
__device__ inline bool box_coords(int flat, const int (&lo)[kMaxRank], const int (&extent)[kMaxRank],
                                  int (&x)[kMaxRank]) {
  if (flat >= extent[0] * extent[1] * extent[2]) return false;
  unravel3(flat, extent, x);
  for (int a = 0; a < kMaxRank; ++a) x[a] += lo[a];
  return true;
}

// Rows [first, first + ROWS) of the box into `tile` ([ROWS][D], pitch tile_pitch<D>()), head `head`.
template <typename T, int D, int ROWS = kTileTokens>
__device__ inline void load_rows_async(T* tile, const AttentionParams& p, const TokenTensor& t, const TileWork& w,
                                       int head, int batch, const int (&lo)[kMaxRank],
                                       const int (&extent)[kMaxRank], int first) {
  constexpr int kChunks = D / 8;  // 16-byte pieces per row
  const T* base = reinterpret_cast<const T*>(t.ptr) + batch * t.batch_stride + head * t.head_stride;
  for (int c = threadIdx.x; c < ROWS * kChunks; c += kThreads) {
    const int row = c / kChunks, col = (c % kChunks) * 8;
    int x[kMaxRank];
    const bool valid = box_coords(first + row, lo, extent, x);
    const T* src = valid ? base + token_offset(p, t, w, x) + col : base;
    copy16_async(tile + row * tile_pitch<D>() + col, src, valid);
  }
}

}  // namespace haloattn

namespace haloattn {

// Group coordinates of row `row` of a CTA's own tile (rows in the order of the full tile shape,
// so row r of every tile has the same place); false for rows past the grid's end.
__device__ inline bool tile_row_coords(const TileWork& w, const TileShape& shape, int row, int (&x)[kMaxRank]) {
  const int extent[kMaxRank] = {shape.n[0], shape.n[1], shape.n[2]};
  bool inside = row < shape.n[0] * shape.n[1] * shape.n[2];
  unravel3(row, extent, x);
  for (int a = 0; a < kMaxRank; ++a) {
    x[a] += w.x0[a];
    inside = inside && x[a] < w.x1[a];
  }
  return inside;
}

// The CTA's own 64-token tile of `t` (head `head`) into `tile`, zero rows past the grid.
template <typename T, int D>
__device__ inline void load_tile_async(T* tile, const AttentionParams& p, const TokenTensor& t, const TileWork& w,
                                       const TileShape& shape, int head) {
  constexpr int kChunks = D / 8;
  const T* base = reinterpret_cast<const T*>(t.ptr) + w.batch * t.batch_stride + head * t.head_stride;
  for (int c = threadIdx.x; c < kTileTokens * kChunks; c += kThreads) {
    const int row = c / kChunks, col = (c % kChunks) * 8;
    int x[kMaxRank];
    const bool valid = tile_row_coords(w, shape, row, x);
    copy16_async(tile + row * tile_pitch<D>() + col, valid ? base + token_offset(p, t, w, x) + col : base, valid);
  }
}

}  // namespace haloattn
