// Fused forward pass: FlashAttention-2 over the key box of each query tile.
//
// One CTA owns a 64-query tile of one (batch, head, dilation group), shaped in the grid's rank; it
// walks the box of keys that the tile's neighbourhoods span (64 keys at a time, flat over the
// box), so it only reads keys some query of the tile may see. Per 64-key chunk, each of the 4
// warps computes S = Q K^T for its 16 queries on tensor cores, masks the pairs outside each
// query's neighbourhood (SEMANTICS.md section 3/4, per axis), updates the online softmax in
// fp32, and accumulates P V with P taken straight from the S registers. The next chunk's copy
// (cp.async) overlaps the current chunk's math.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "attention_params.h"
#include "kernel_launch.h"
#include "mma_fragments.cuh"
#include "row_output.cuh"
#include "row_windows.cuh"
#include "tile_loads.cuh"
#include "token_tiles.cuh"
#include "window_geometry.cuh"

namespace haloattn {
namespace {

template <typename T, int D>
struct ForwardSmem {
  static constexpr int kPitch = tile_pitch<D>();
  // Q, two stages of K and V, two stages of key coordinates.
  static constexpr size_t kBytes = 5 * kTileTokens * kPitch * sizeof(T) + 2 * kMaxRank * kTileTokens * sizeof(int);
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(const AttentionParams p, const TileShape shape) {
  constexpr int kPitch = tile_pitch<D>();
  constexpr int kKSteps = D / 16;    // MMA k-steps over the head dim
  constexpr int kKeyTiles = kTileTokens / 8;  // n-tiles of S per warp
  constexpr int kOutTiles = D / 8;   // n-tiles of O per warp
  extern __shared__ __align__(16) unsigned char smem[];
  // K/V chunks are double-buffered: the copy of chunk c + 1 runs while chunk c is computed.
  constexpr int kTileElems = kTileTokens * kPitch;
  constexpr int kCoordInts = kMaxRank * kTileTokens;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kTileElems;       // [stage][64][pitch]
  T* sV = sK + 2 * kTileElems;   // [stage][64][pitch]
  int* sKeyCoord = reinterpret_cast<int*>(sV + 2 * kTileElems);  // [stage][axis][64], -1 past the box

  const TileWork w = locate_tile(p, shape, p.heads, blockIdx.x);
  if (w.empty) return;
  const int kv_head = w.head / (p.heads / p.kv_heads);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;

  int key_lo[kMaxRank], key_extent[kMaxRank];
  key_box(p, w, key_lo, key_extent);
  const int box_keys = key_extent[0] * key_extent[1] * key_extent[2];
  const bool shared_window = tile_shares_one_window(p, w);
  load_tile_async<T, D>(sQ, p, p.query, w, shape, w.head);

  const int row_a = warp * 16 + g, row_b = row_a + 8;
  int x_a[kMaxRank], x_b[kMaxRank];
  const bool inside_a = tile_row_coords(w, shape, row_a, x_a);
  const bool inside_b = tile_row_coords(w, shape, row_b, x_b);
  const RowWindow win_a = query_window(p, w, x_a, inside_a);
  const RowWindow win_b = query_window(p, w, x_b, inside_b);

  uint32_t q_frag[kKSteps][4];
  float o[kOutTiles][4];
  for (int i = 0; i < kOutTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;  // log2 units
  const float scale_log2 = p.scale * kLog2e;

  auto fetch_chunk = [&](int first, int stage) {
    int* coords = sKeyCoord + stage * kCoordInts;
    store_box_coords(coords, first, key_lo, key_extent);
    __syncthreads();  // the copies below read the coordinates
    load_rows_async<T, D>(sK + stage * kTileElems, p, p.key, w, kv_head, coords);
    load_rows_async<T, D>(sV + stage * kTileElems, p, p.value, w, kv_head, coords);
    copy_async_commit();
  };
  fetch_chunk(0, 0);  // one copy group with the Q tile

  for (int first = 0, stage = 0; first < box_keys; first += kTileTokens, stage ^= 1) {
    // The other stage was last read in the previous iteration, which ended with a barrier.
    if (first + kTileTokens < box_keys) {
      fetch_chunk(first + kTileTokens, stage ^ 1);
      copy_async_wait_one_pending();
    } else {
      copy_async_wait_all();
    }
    __syncthreads();
    const T* sK_now = sK + stage * kTileElems;
    const T* sV_now = sV + stage * kTileElems;
    const int* key_coord = sKeyCoord + stage * kCoordInts;
    if (first == 0) {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) load_a<T>(q_frag[ks], sQ, kPitch, warp * 16, ks * 16, lane);
    }

    float s[kKeyTiles][4];
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; nt += 2) {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        uint32_t b[2][2];
        load_b_nk<T>(b, sK_now, kPitch, nt * 8, ks * 16, lane);
        mma<T>(s[nt], q_frag[ks], b[0]);
        mma<T>(s[nt + 1], q_frag[ks], b[1]);
      }
    }

    // Mask (unless every key of the chunk is every row's: a shared window, no padding) and
    // scale; row maxima over the quad of lanes that shares a row. Rows past the grid see all
    // keys on the unmasked path: finite, and never stored.
    const bool masked = !shared_window || first + kTileTokens > box_keys;
    float tile_max_a = -INFINITY, tile_max_b = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        bool keep_a = true, keep_b = true;
        if (masked) {
          int key[kMaxRank];
          read_coords(key_coord, nt * 8 + 2 * t + e, key);
          keep_a = attends(win_a, key);
          keep_b = attends(win_b, key);
        }
        s[nt][e] = keep_a ? s[nt][e] * scale_log2 : -INFINITY;
        s[nt][2 + e] = keep_b ? s[nt][2 + e] * scale_log2 : -INFINITY;
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
      for (int i = 0; i < kOutTiles; i += 2) {
        uint32_t b[2][2];
        load_b_kn<T>(b, sV_now, kPitch, kk * 16, i * 8, lane);
        mma<T>(o[i], a, b[0]);
        mma<T>(o[i + 1], a, b[1]);
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's fetch
  }

  l_a = quad_sum(l_a);
  l_b = quad_sum(l_b);
  // Write O / l and the natural-log LSE for the rows inside the grid.
  if (inside_a) store_row<T, kOutTiles>(p, w, x_a, l_a, m_a, t, [&](int j) { return make_float2(o[j][0], o[j][1]); });
  if (inside_b) store_row<T, kOutTiles>(p, w, x_b, l_b, m_b, t, [&](int j) { return make_float2(o[j][2], o[j][3]); });
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
  // This module's CUDA runtime keeps its own current device: follow the tensors'.
  HALOATTN_CUDA_TRY(cudaSetDevice(p.device));
  // The Hopper kernel folds the scale into its exp2 FFMA, which keeps the maxima only for a
  // positive scale; scale <= 0 (uniform or reversed attention) runs the portable kernel.
  const bool hopper = hopper_kernels_run_on(p.device) && p.scale > 0.f;
  if (p.forward_kernel == KernelChoice::kHopper && !hopper)
    return "forward_kernel='hopper' needs an sm_90 device, a build with sm_90a in HALOATTN_CUDA_ARCHS and scale > 0";
  if (hopper && p.forward_kernel != KernelChoice::kPortable) {
    std::string refusal;
    const std::string error = forward_sm90(p, refusal);
    if (refusal.empty()) return error;
    // auto: the portable kernel reads any layout the checks above accept.
    if (p.forward_kernel == KernelChoice::kHopper) return "forward_kernel='hopper' cannot take this call: " + refusal;
  }
  return dispatch_dtype_dim(p, [&](auto dtype_tag, auto dim_tag) {
    return launch_forward<typename decltype(dtype_tag)::type, decltype(dim_tag)::value>(p);
  });
}

}  // namespace haloattn
