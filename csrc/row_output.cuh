// The kernels' epilogues: a thread's share of one row (columns 8j + 2t and 8j + 2t + 1 of every
// 8-column tile j, as mma.sync and wgmma accumulators both lay them out) written to a token
// tensor (store_values: the backward's gradients), or as O / l with the row's natural-log LSE
// (store_row: the forward).
#pragma once

#include "mma_fragments.cuh"
#include "row_windows.cuh"
#include "token_tiles.cuh"

namespace haloattn {

// Sum over the quad of lanes (t = 0..3) that shares an accumulator row.
__device__ __forceinline__ float quad_sum(float v) {
#pragma unroll
  for (int offset = 1; offset < 4; offset <<= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

// A thread's share of row x (group coordinates of tile w) of the [B, *spatial, H, D] tensor
// `out`: pair(j) gives its two values of 8-column tile j.
template <typename T, int TILES, typename Pair>
__device__ __forceinline__ void store_values(const AttentionParams& p, const TokenTensor& out, const TileWork& w,
                                             const int (&x)[kMaxRank], int t, Pair&& pair) {
  T* dst = reinterpret_cast<T*>(out.ptr) + w.batch * out.batch_stride + w.head * out.head_stride +
           token_offset(p, out, w, x);
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
    const float2 v = pair(j);
    *reinterpret_cast<uint32_t*>(dst + j * 8 + 2 * t) = pack2<T>(v.x, v.y);
  }
}

// The natural-log LSE of a row into LSE element `index` (lse_index; one lane of the row's quad
// writes it): l is the row's softmax sum, max_log2 its maximum in log2 units.
__device__ __forceinline__ void store_lse_at(const AttentionParams& p, int64_t index, float l, float max_log2, int t) {
  if (t == 0) reinterpret_cast<float*>(p.lse)[index] = l > 0.f ? (max_log2 + log2f(l)) * kLn2 : -INFINITY;
}

// The same for row x of tile w.
__device__ __forceinline__ void store_lse(const AttentionParams& p, const TileWork& w, const int (&x)[kMaxRank],
                                          float l, float max_log2, int t) {
  store_lse_at(p, lse_index(p, w, x), l, max_log2, t);
}

// Row at group coordinates x of tile w: `pair(j)` gives this thread's two unnormalised values
// of tile j; l is the row's softmax sum, max_log2 its maximum in log2 units.
template <typename T, int TILES, typename Pair>
__device__ __forceinline__ void store_row(const AttentionParams& p, const TileWork& w, const int (&x)[kMaxRank],
                                          float l, float max_log2, int t, Pair&& pair) {
  const float inv_l = l > 0.f ? 1.f / l : 0.f;
  store_values<T, TILES>(p, p.out, w, x, t, [&](int j) {
    const float2 v = pair(j);
    return make_float2(v.x * inv_l, v.y * inv_l);
  });
  store_lse(p, w, x, l, max_log2, t);
}

}  // namespace haloattn
