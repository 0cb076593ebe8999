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

// Rows of a chunk into `tile` ([ROWS][D], pitch tile_pitch<D>()), head `head`: row r is the
// token at group coordinates coords[axis * ROWS + r] (written by store_box_coords, so the
// coordinates are unravelled once per row, not once per copy), zero-filled where they are -1.
template <typename T, int D, int ROWS = kTileTokens>
__device__ inline void load_rows_async(T* tile, const AttentionParams& p, const TokenTensor& t, const TileWork& w,
                                       int head, const int* coords) {
  constexpr int kChunks = D / 8;  // 16-byte pieces per row
  const T* base = reinterpret_cast<const T*>(t.ptr) + w.batch * t.batch_stride + head * t.head_stride;
  for (int c = threadIdx.x; c < ROWS * kChunks; c += kThreads) {
    const int row = c / kChunks, col = (c % kChunks) * 8;
    const int x[kMaxRank] = {coords[row], coords[ROWS + row], coords[2 * ROWS + row]};
    const bool valid = x[0] >= 0;
    const T* src = valid ? base + token_offset(p, t, w, x) + col : base;
    copy16_async(tile + row * tile_pitch<D>() + col, src, valid);
  }
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
