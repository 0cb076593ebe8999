// Fused forward pass: FlashAttention-2 over the key box of each query tile.
//
// One CTA owns a 64-query tile of one (batch, head, dilation group), shaped in the grid's rank; it
// walks the box of keys that the tile's neighbourhoods span (64 keys at a time, flat over the
// box), so it only reads keys some query of the tile may see. Per 64-key chunk, each of the 4
// warps computes S = Q K^T for its 16 queries on tensor cores, masks the pairs outside each
// query's neighbourhood (SEMANTICS.md section 3/4, per axis), updates the online softmax in
// fp32, and accumulates P V with P taken straight from the S registers.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "attention_params.h"
#include "kernel_launch.h"
#include "mma_fragments.cuh"
#include "tile_loads.cuh"
#include "token_tiles.cuh"
#include "window_geometry.cuh"

namespace haloattn {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The keys one query row sees, per axis, in group units ([lo, hi) per axis; empty for rows past
// the tile).
struct RowWindow {
  int lo[kMaxRank], hi[kMaxRank];
};

__device__ inline RowWindow row_window(const AttentionParams& p, const TileWork& w, const TileShape& shape, int row) {
  RowWindow r;
  int x[kMaxRank];
  const int shape_extent[kMaxRank] = {shape.n[0], shape.n[1], shape.n[2]};
  unravel3(row, shape_extent, x);
  bool inside = row < kTileTokens;
  for (int a = 0; a < kMaxRank; ++a) {
    x[a] += w.x0[a];
    inside = inside && x[a] < w.x1[a];
  }
  for (int a = 0; a < kMaxRank; ++a) {
    const Range k = key_range(p.axis[a], p.pattern, inside ? x[a] : 0, w.group_len[a]);
    r.lo[a] = inside ? k.lo : 0;
    r.hi[a] = inside ? k.hi : 0;
  }
  return r;
}

__device__ inline bool attends(const RowWindow& r, const int (&key)[kMaxRank]) {
  bool ok = true;
#pragma unroll
  for (int a = 0; a < kMaxRank; ++a) ok = ok && r.lo[a] <= key[a] && key[a] < r.hi[a];
  return ok;
}

template <typename T, int D>
struct ForwardSmem {
  static constexpr int kPitch = tile_pitch<D>();
  static constexpr size_t kBytes = 3 * kTileTokens * kPitch * sizeof(T) + kMaxRank * kTileTokens * sizeof(int);
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(const AttentionParams p, const TileShape shape) {
  constexpr int kPitch = tile_pitch<D>();
  constexpr int kKSteps = D / 16;    // MMA k-steps over the head dim
  constexpr int kKeyTiles = kTileTokens / 8;  // n-tiles of S per warp
  constexpr int kOutTiles = D / 8;   // n-tiles of O per warp
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kTileTokens * kPitch;
  T* sV = sK + kTileTokens * kPitch;
  int* sKeyCoord = reinterpret_cast<int*>(sV + kTileTokens * kPitch);  // [axis][64], -1 past the box

  const TileWork w = locate_tile(p, shape, p.heads, blockIdx.x);
  if (w.empty) return;
  const int kv_head = w.head / (p.heads / p.kv_heads);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;

  // The key box of the tile: key_range is monotone, so the first and last query bound it.
  int key_lo[kMaxRank], key_extent[kMaxRank];
  for (int a = 0; a < kMaxRank; ++a) {
    const Range first = key_range(p.axis[a], p.pattern, w.x0[a], w.group_len[a]);
    const Range last = key_range(p.axis[a], p.pattern, w.x1[a] - 1, w.group_len[a]);
    key_lo[a] = first.lo;
    key_extent[a] = last.hi - first.lo;
  }
  const int box_keys = key_extent[0] * key_extent[1] * key_extent[2];
  const int query_shape[kMaxRank] = {shape.n[0], shape.n[1], shape.n[2]};

  // The Q tile is a box [x0, x0 + shape) whose rows past x1 are zero-filled: load it through a
  // box of the clipped extent with the row order of the full tile shape.
  {
    constexpr int kChunks = D / 8;
    const T* base = reinterpret_cast<const T*>(p.query.ptr) + w.batch * p.query.batch_stride + w.head * p.query.head_stride;
    for (int c = threadIdx.x; c < kTileTokens * kChunks; c += kThreads) {
      const int row = c / kChunks, col = (c % kChunks) * 8;
      int x[kMaxRank];
      unravel3(row, query_shape, x);
      bool valid = true;
      for (int a = 0; a < kMaxRank; ++a) {
        x[a] += w.x0[a];
        valid = valid && x[a] < w.x1[a];
      }
      valid = valid && row < shape.n[0] * shape.n[1] * shape.n[2];
      copy16_async(sQ + row * kPitch + col, valid ? base + token_offset(p, p.query, w, x) + col : base, valid);
    }
  }

  const int row_a = warp * 16 + g, row_b = row_a + 8;
  const RowWindow win_a = row_window(p, w, shape, row_a);
  const RowWindow win_b = row_window(p, w, shape, row_b);

  uint32_t q_frag[kKSteps][4];
  float o[kOutTiles][4];
  for (int i = 0; i < kOutTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;  // log2 units
  const float scale_log2 = p.scale * kLog2e;

  for (int first = 0; first < box_keys; first += kTileTokens) {
    __syncthreads();  // the previous chunk's K/V are no longer read
    load_rows_async<T, D>(sK, p, p.key, w, kv_head, w.batch, key_lo, key_extent, first);
    load_rows_async<T, D>(sV, p, p.value, w, kv_head, w.batch, key_lo, key_extent, first);
    copy_async_commit();
    if (threadIdx.x < kTileTokens) {
      int y[kMaxRank];
      const bool valid = box_coords(first + threadIdx.x, key_lo, key_extent, y);
      for (int a = 0; a < kMaxRank; ++a) sKeyCoord[a * kTileTokens + threadIdx.x] = valid ? y[a] : -1;
    }
    copy_async_wait_all();
    __syncthreads();
    if (first == 0) {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) load_a<T>(q_frag[ks], sQ, kPitch, warp * 16, ks * 16, lane);
    }

    float s[kKeyTiles][4];
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        uint32_t b[2];
        load_b_nk<T>(b, sK, kPitch, nt * 8, ks * 16, lane);
        mma<T>(s[nt], q_frag[ks], b);
      }
    }

    // Mask and scale; row maxima over the quad of lanes that shares a row.
    float tile_max_a = -INFINITY, tile_max_b = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = nt * 8 + 2 * t + e;
        const int key[kMaxRank] = {sKeyCoord[col], sKeyCoord[kTileTokens + col], sKeyCoord[2 * kTileTokens + col]};
        s[nt][e] = attends(win_a, key) ? s[nt][e] * scale_log2 : -INFINITY;
        s[nt][2 + e] = attends(win_b, key) ? s[nt][2 + e] * scale_log2 : -INFINITY;
        tile_max_a = fmaxf(tile_max_a, s[nt][e]);
        tile_max_b = fmaxf(tile_max_b, s[nt][2 + e]);
      }
    }
#pragma unroll
    for (int offset = 1; offset < 4; offset <<= 1) {
      tile_max_a = fmaxf(tile_max_a, __shfl_xor_sync(0xffffffff, tile_max_a, offset));
      tile_max_b = fmaxf(tile_max_b, __shfl_xor_sync(0xffffffff, tile_max_b, offset));
    }
    const float new_m_a = fmaxf(m_a, tile_max_a), new_m_b = fmaxf(m_b, tile_max_b);
    // A row with no key yet keeps max -inf; subtracting 0 instead keeps exp2 at 0, not NaN.
    const float base_a = new_m_a == -INFINITY ? 0.f : new_m_a;
    const float base_b = new_m_b == -INFINITY ? 0.f : new_m_b;
    const float alpha_a = exp2f(m_a - base_a), alpha_b = exp2f(m_b - base_b);
    m_a = new_m_a;
    m_b = new_m_b;
    l_a *= alpha_a;
    l_b *= alpha_b;
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - base_a);
      s[nt][1] = exp2f(s[nt][1] - base_a);
      s[nt][2] = exp2f(s[nt][2] - base_b);
      s[nt][3] = exp2f(s[nt][3] - base_b);
      l_a += s[nt][0] + s[nt][1];
      l_b += s[nt][2] + s[nt][3];
    }
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      o[i][0] *= alpha_a;
      o[i][1] *= alpha_a;
      o[i][2] *= alpha_b;
      o[i][3] *= alpha_b;
    }
#pragma unroll
    for (int kk = 0; kk < kTileTokens / 16; ++kk) {
      uint32_t a[4];
      accum_to_a<T, kKeyTiles>(a, s, kk);
#pragma unroll
      for (int i = 0; i < kOutTiles; ++i) {
        uint32_t b[2];
        load_b_kn<T>(b, sV, kPitch, kk * 16, i * 8, lane);
        mma<T>(o[i], a, b);
      }
    }
  }

#pragma unroll
  for (int offset = 1; offset < 4; offset <<= 1) {
    l_a += __shfl_xor_sync(0xffffffff, l_a, offset);
    l_b += __shfl_xor_sync(0xffffffff, l_b, offset);
  }

  // Write O / l and the natural-log LSE for the rows inside the grid.
  T* out = reinterpret_cast<T*>(p.out.ptr) + w.batch * p.out.batch_stride + w.head * p.out.head_stride;
  float* lse = reinterpret_cast<float*>(p.lse);
  const int64_t tokens = grid_tokens(p);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = half == 0 ? row_a : row_b;
    int x[kMaxRank];
    unravel3(row, query_shape, x);
    bool inside = row < shape.n[0] * shape.n[1] * shape.n[2];
    for (int a = 0; a < kMaxRank; ++a) {
      x[a] += w.x0[a];
      inside = inside && x[a] < w.x1[a];
    }
    if (!inside) continue;
    const float l = half == 0 ? l_a : l_b;
    const float m = half == 0 ? m_a : m_b;
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
    T* dst = out + token_offset(p, p.out, w, x);
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      const uint32_t v = pack2<T>(o[i][2 * half] * inv_l, o[i][2 * half + 1] * inv_l);
      *reinterpret_cast<uint32_t*>(dst + i * 8 + 2 * t) = v;
    }
    if (t == 0) {
      lse[(w.batch * tokens + token_index(p, w, x)) * p.heads + w.head] =
          l > 0.f ? (m + log2f(l)) * kLn2 : -INFINITY;
    }
  }
}

template <typename T, int D>
std::string launch_forward(const AttentionParams& p) {
  const TileShape shape = choose_tile(p);
  const int64_t ctas = count_tiles(p, shape, p.heads);
  if (ctas > kMaxCtas) return "the problem needs more than 2^31 - 1 thread blocks";
  auto kernel = forward_kernel<T, D>;
  const size_t smem = ForwardSmem<T, D>::kBytes;
  HALOATTN_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(ctas), kThreads, smem, reinterpret_cast<cudaStream_t>(p.stream)>>>(p, shape);
  HALOATTN_CUDA_TRY(cudaGetLastError());
  return {};
}

}  // namespace

std::string forward(const AttentionParams& p) {
  std::string bad = check_supported(p);
  if (!bad.empty()) return bad;
  return dispatch_dtype_dim(p, [&](auto dtype_tag, auto dim_tag) {
    return launch_forward<typename decltype(dtype_tag)::type, decltype(dim_tag)::value>(p);
  });
}

}  // namespace haloattn
