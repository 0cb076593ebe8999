// Deterministic backward pass (no atomics), FlashAttention-2 style, in three kernels (on Hopper,
// where its copies can read the layout, neighborhood_backward_sm90.cu's two kernels replace them):
//   1. delta = rowsum(dO * O) - dLSE per (token, head): the softmax-gradient correction.
//   2. dQ, query-major: each 64-query tile walks its key box like the forward pass, recomputes
//      P = exp(S - LSE), dP = dO V^T, dS = P (dP - delta) and accumulates dQ = scale dS K.
//   3. dK/dV, key-major: each 64-key tile walks the box of queries that see it (the inverse rule)
//      for every query head of its GQA group, and accumulates dV = P^T dO, dK = scale dS^T Q.
// Kernels 2 and 3 double-buffer their chunks: the next chunk's copy overlaps the current math.
// Every gradient element is summed by one thread in a fixed order, so results are bitwise
// reproducible.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "attention_params.h"
#include "kernel_launch.h"
#include "mma_fragments.cuh"
#include "row_windows.cuh"
#include "tile_loads.cuh"
#include "token_tiles.cuh"

namespace haloattn {
namespace {

template <typename T> __device__ inline float to_float(T v);
template <> __device__ inline float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ inline float to_float<__half>(__half v) { return __half2float(v); }

// One warp per (token, head) row; rows ordered like the [B, *spatial, H] LSE buffer.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) delta_kernel(const AttentionParams p, int64_t rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int head = static_cast<int>(row % p.heads);
  int64_t token = row / p.heads;
  const int64_t batch = token / grid_tokens(p);
  token %= grid_tokens(p);
  int64_t out_offset = batch * p.out.batch_stride + head * p.out.head_stride;
  int64_t grad_offset = batch * p.grad_out.batch_stride + head * p.grad_out.head_stride;
  for (int a = kMaxRank - 1; a >= 0; --a) {
    const int64_t i = token % p.axis[a].length;
    token /= p.axis[a].length;
    out_offset += i * p.out.axis_stride[a];
    grad_offset += i * p.grad_out.axis_stride[a];
  }
  const T* o = reinterpret_cast<const T*>(p.out.ptr) + out_offset;
  const T* d_o = reinterpret_cast<const T*>(p.grad_out.ptr) + grad_offset;
  float sum = 0.f;
  for (int d = lane; d < D; d += 32) sum += to_float(o[d]) * to_float(d_o[d]);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  if (lane == 0) {
    const float* grad_lse = reinterpret_cast<const float*>(p.grad_lse);
    reinterpret_cast<float*>(p.delta)[row] = sum - (grad_lse ? grad_lse[row] : 0.f);
  }
}

// P = exp(S - LSE) for a 16 x 64 accumulator whose rows/cols are masked by `keep(row, col)`;
// the LSE is in log2 units, per row (`per_row`) or per column.
template <int NT, typename Keep, typename Lse>
__device__ inline void softmax_probs(float (&s)[NT][4], float scale_log2, int t, Keep keep, Lse lse2) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e >> 1, col = nt * 8 + 2 * t + (e & 1);
      s[nt][e] = keep(half, col) ? exp2f(s[nt][e] * scale_log2 - lse2(half, col)) : 0.f;
    }
  }
}

template <typename T, int D>
struct GradQuerySmem {
  static constexpr int kPitch = tile_pitch<D>();
  // Q, dO, two stages of K and V, two stages of key coordinates.
  static constexpr size_t kBytes = 6 * kTileTokens * kPitch * sizeof(T) + 2 * kMaxRank * kTileTokens * sizeof(int);
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) grad_query_kernel(const AttentionParams p, const TileShape shape) {
  constexpr int kPitch = tile_pitch<D>();
  constexpr int kKSteps = D / 16;
  constexpr int kKeyTiles = kTileTokens / 8;
  constexpr int kDimTiles = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kTileElems = kTileTokens * kPitch;
  constexpr int kCoordInts = kMaxRank * kTileTokens;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kTileElems;
  T* sK = sdO + kTileElems;      // [stage][64][pitch]
  T* sV = sK + 2 * kTileElems;   // [stage][64][pitch]
  int* sKeyCoord = reinterpret_cast<int*>(sV + 2 * kTileElems);  // [stage][axis][64]

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
  load_tile_async<T, D>(sdO, p, p.grad_out, w, shape, w.head);

  int x[2][kMaxRank];
  bool inside[2];
  RowWindow win[2];
  float lse2[2], delta[2];
  const int64_t tokens = grid_tokens(p);
  for (int half = 0; half < 2; ++half) {
    inside[half] = tile_row_coords(w, shape, warp * 16 + g + 8 * half, x[half]);
    win[half] = query_window(p, w, x[half], inside[half]);
    const int64_t row = inside[half] ? (w.batch * tokens + token_index(p, w, x[half])) * p.heads + w.head : 0;
    lse2[half] = inside[half] ? reinterpret_cast<const float*>(p.lse)[row] * kLog2e : 0.f;
    delta[half] = inside[half] ? reinterpret_cast<const float*>(p.delta)[row] : 0.f;
  }

  float dq[kDimTiles][4];
  for (int i = 0; i < kDimTiles; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
  const float scale_log2 = p.scale * kLog2e;

  auto fetch_chunk = [&](int first, int stage) {
    int* coords = sKeyCoord + stage * kCoordInts;
    store_box_coords(coords, first, key_lo, key_extent);
    __syncthreads();  // the copies below read the coordinates
    load_rows_async<T, D>(sK + stage * kTileElems, p, p.key, w, kv_head, coords);
    load_rows_async<T, D>(sV + stage * kTileElems, p, p.value, w, kv_head, coords);
    copy_async_commit();
  };
  fetch_chunk(0, 0);  // one copy group with the Q and dO tiles

  for (int first = 0, stage = 0; first < box_keys; first += kTileTokens, stage ^= 1) {
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

    float s[kKeyTiles][4], dp[kKeyTiles][4];
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
    }
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t q[4], d_o[4];
      load_a<T>(q, sQ, kPitch, warp * 16, ks * 16, lane);
      load_a<T>(d_o, sdO, kPitch, warp * 16, ks * 16, lane);
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; nt += 2) {
        uint32_t b[2][2];
        load_b_nk<T>(b, sK_now, kPitch, nt * 8, ks * 16, lane);
        mma<T>(s[nt], q, b[0]);
        mma<T>(s[nt + 1], q, b[1]);
        load_b_nk<T>(b, sV_now, kPitch, nt * 8, ks * 16, lane);
        mma<T>(dp[nt], d_o, b[0]);
        mma<T>(dp[nt + 1], d_o, b[1]);
      }
    }
    // As in the forward: a shared window needs the mask only on the padding past the box.
    const bool masked = !shared_window || first + kTileTokens > box_keys;
    softmax_probs<kKeyTiles>(
        s, scale_log2, t,
        [&](int half, int col) {
          if (!masked) return true;
          int key[kMaxRank];
          read_coords(key_coord, col, key);
          return attends(win[half], key);
        },
        [&](int half, int) { return lse2[half]; });
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= dp[nt][e] - delta[e >> 1];  // s becomes dS
    }
#pragma unroll
    for (int kk = 0; kk < kTileTokens / 16; ++kk) {
      uint32_t a[4];
      accum_to_a<T, kKeyTiles>(a, s, kk);
#pragma unroll
      for (int i = 0; i < kDimTiles; i += 2) {
        uint32_t b[2][2];
        load_b_kn<T>(b, sK_now, kPitch, kk * 16, i * 8, lane);
        mma<T>(dq[i], a, b[0]);
        mma<T>(dq[i + 1], a, b[1]);
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's fetch
  }

  T* grad = reinterpret_cast<T*>(p.grad_query.ptr) + w.batch * p.grad_query.batch_stride +
            w.head * p.grad_query.head_stride;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (!inside[half]) continue;
    T* dst = grad + token_offset(p, p.grad_query, w, x[half]);
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i)
      *reinterpret_cast<uint32_t*>(dst + i * 8 + 2 * t) =
          pack2<T>(dq[i][2 * half] * p.scale, dq[i][2 * half + 1] * p.scale);
  }
}

// dK/dV walk queries in chunks of 32 for head_dim 128 (64 otherwise) so that the two gradient
// accumulators and the two score tiles fit in registers.
template <int D> constexpr int query_chunk() { return D == 128 ? 32 : 64; }

template <typename T, int D>
struct GradKeyValueSmem {
  static constexpr int kPitch = tile_pitch<D>();
  static constexpr int kChunk = query_chunk<D>();
  // K, V, then two stages of (Q, dO, per-query window bounds, LSE, delta).
  static constexpr size_t kStageBytes = 2 * kChunk * kPitch * sizeof(T) + kChunk * (3 * kMaxRank * sizeof(int) + 2 * sizeof(float));
  static constexpr size_t kBytes = 2 * kTileTokens * kPitch * sizeof(T) + 2 * kStageBytes;
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) grad_key_value_kernel(const AttentionParams p, const TileShape shape) {
  constexpr int kPitch = tile_pitch<D>();
  constexpr int kChunk = query_chunk<D>();
  constexpr int kKSteps = D / 16;
  constexpr int kQueryTiles = kChunk / 8;
  constexpr int kDimTiles = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kTileTokens * kPitch;
  // One stage of a query chunk; the copy of chunk c + 1 runs while chunk c is computed.
  struct Stage {
    T* q;
    T* d_o;
    int* coords;  // [axis][chunk] group coordinates of the chunk's queries, -1 past the box
    int* win_lo;  // [axis][chunk]
    int* win_hi;
    float* lse2;
    float* delta;
  };
  auto stage_at = [&](int index) {
    unsigned char* base = reinterpret_cast<unsigned char*>(sV + kTileTokens * kPitch) +
                          index * GradKeyValueSmem<T, D>::kStageBytes;
    Stage st;
    st.q = reinterpret_cast<T*>(base);
    st.d_o = st.q + kChunk * kPitch;
    st.coords = reinterpret_cast<int*>(st.d_o + kChunk * kPitch);
    st.win_lo = st.coords + kMaxRank * kChunk;
    st.win_hi = st.win_lo + kMaxRank * kChunk;
    st.lse2 = reinterpret_cast<float*>(st.win_hi + kMaxRank * kChunk);
    st.delta = st.lse2 + kChunk;
    return st;
  };

  const TileWork w = locate_tile(p, shape, p.kv_heads, blockIdx.x);  // w.head is the KV head
  if (w.empty) return;
  const int group_size = p.heads / p.kv_heads;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;

  int query_lo[kMaxRank], query_extent[kMaxRank];
  query_box(p, w, query_lo, query_extent);
  const int box_queries = query_extent[0] * query_extent[1] * query_extent[2];
  load_tile_async<T, D>(sK, p, p.key, w, shape, w.head);
  load_tile_async<T, D>(sV, p, p.value, w, shape, w.head);

  int y[2][kMaxRank];  // this thread's two key rows, -1 past the grid
  bool key_inside[2];
  for (int half = 0; half < 2; ++half) {
    key_inside[half] = tile_row_coords(w, shape, warp * 16 + g + 8 * half, y[half]);
    if (!key_inside[half])
      for (int a = 0; a < kMaxRank; ++a) y[half][a] = -1;
  }

  float dk[kDimTiles][4], dv[kDimTiles][4];
  for (int i = 0; i < kDimTiles; ++i)
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
  const float scale_log2 = p.scale * kLog2e;
  const int64_t tokens = grid_tokens(p);

  // One flat walk over (query head of the GQA group, query chunk of the box).
  const int chunks = (box_queries + kChunk - 1) / kChunk;
  const int steps = group_size * chunks;
  auto fetch_chunk = [&](int step, const Stage& st) {
    const int head = w.head * group_size + step / chunks, first = (step % chunks) * kChunk;
    if (threadIdx.x < kChunk) {
      int x[kMaxRank];
      const bool inside = box_coords(first + threadIdx.x, query_lo, query_extent, x);
      const RowWindow win = query_window(p, w, x, inside);
      for (int a = 0; a < kMaxRank; ++a) {
        st.coords[a * kChunk + threadIdx.x] = inside ? x[a] : -1;
        st.win_lo[a * kChunk + threadIdx.x] = win.lo[a];
        st.win_hi[a * kChunk + threadIdx.x] = win.hi[a];
      }
      const int64_t row = inside ? (w.batch * tokens + token_index(p, w, x)) * p.heads + head : 0;
      st.lse2[threadIdx.x] = inside ? reinterpret_cast<const float*>(p.lse)[row] * kLog2e : 0.f;
      st.delta[threadIdx.x] = inside ? reinterpret_cast<const float*>(p.delta)[row] : 0.f;
    }
    __syncthreads();  // the copies below read the coordinates
    load_rows_async<T, D, kChunk>(st.q, p, p.query, w, head, st.coords);
    load_rows_async<T, D, kChunk>(st.d_o, p, p.grad_out, w, head, st.coords);
    copy_async_commit();
  };
  fetch_chunk(0, stage_at(0));  // one copy group with the K and V tiles

  for (int step = 0; step < steps; ++step) {
    if (step + 1 < steps) {
      fetch_chunk(step + 1, stage_at((step + 1) & 1));
      copy_async_wait_one_pending();
    } else {
      copy_async_wait_all();
    }
    __syncthreads();
    const Stage st = stage_at(step & 1);
    // Transposed scores: rows are this warp's 16 keys, columns the chunk's queries.
    float s[kQueryTiles][4], dp[kQueryTiles][4];
#pragma unroll
    for (int nt = 0; nt < kQueryTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
    }
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t k[4], v[4];
      load_a<T>(k, sK, kPitch, warp * 16, ks * 16, lane);
      load_a<T>(v, sV, kPitch, warp * 16, ks * 16, lane);
#pragma unroll
      for (int nt = 0; nt < kQueryTiles; nt += 2) {
        uint32_t b[2][2];
        load_b_nk<T>(b, st.q, kPitch, nt * 8, ks * 16, lane);
        mma<T>(s[nt], k, b[0]);
        mma<T>(s[nt + 1], k, b[1]);
        load_b_nk<T>(b, st.d_o, kPitch, nt * 8, ks * 16, lane);
        mma<T>(dp[nt], v, b[0]);
        mma<T>(dp[nt + 1], v, b[1]);
      }
    }
    softmax_probs<kQueryTiles>(
        s, scale_log2, t,
        [&](int half, int col) {
          bool ok = true;
#pragma unroll
          for (int a = 0; a < kMaxRank; ++a)
            ok = ok && st.win_lo[a * kChunk + col] <= y[half][a] && y[half][a] < st.win_hi[a * kChunk + col];
          return ok;
        },
        [&](int, int col) { return st.lse2[col]; });
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {  // dV += P^T dO
      uint32_t a[4];
      accum_to_a<T, kQueryTiles>(a, s, kk);
#pragma unroll
      for (int i = 0; i < kDimTiles; i += 2) {
        uint32_t b[2][2];
        load_b_kn<T>(b, st.d_o, kPitch, kk * 16, i * 8, lane);
        mma<T>(dv[i], a, b[0]);
        mma<T>(dv[i + 1], a, b[1]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < kQueryTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= dp[nt][e] - st.delta[nt * 8 + 2 * t + (e & 1)];  // dS^T
    }
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {  // dK += dS^T Q
      uint32_t a[4];
      accum_to_a<T, kQueryTiles>(a, s, kk);
#pragma unroll
      for (int i = 0; i < kDimTiles; i += 2) {
        uint32_t b[2][2];
        load_b_kn<T>(b, st.q, kPitch, kk * 16, i * 8, lane);
        mma<T>(dk[i], a, b[0]);
        mma<T>(dk[i + 1], a, b[1]);
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's fetch
  }
  copy_async_wait_all();  // a key tile no query sees (possible with stride) ran no step

  for (int half = 0; half < 2; ++half) {
    if (!key_inside[half]) continue;
    T* dst_k = reinterpret_cast<T*>(p.grad_key.ptr) + w.batch * p.grad_key.batch_stride +
               w.head * p.grad_key.head_stride + token_offset(p, p.grad_key, w, y[half]);
    T* dst_v = reinterpret_cast<T*>(p.grad_value.ptr) + w.batch * p.grad_value.batch_stride +
               w.head * p.grad_value.head_stride + token_offset(p, p.grad_value, w, y[half]);
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) {
      *reinterpret_cast<uint32_t*>(dst_k + i * 8 + 2 * t) =
          pack2<T>(dk[i][2 * half] * p.scale, dk[i][2 * half + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dst_v + i * 8 + 2 * t) = pack2<T>(dv[i][2 * half], dv[i][2 * half + 1]);
    }
  }
}

template <typename Kernel>
std::string allow_smem(Kernel kernel, size_t bytes) {
  HALOATTN_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return {};
}

template <typename T, int D>
std::string launch_delta(const AttentionParams& p) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.axis[0].length * p.axis[1].length * p.axis[2].length * p.heads;
  const int64_t ctas = (rows + kThreads / 32 - 1) / (kThreads / 32);
  if (ctas > kMaxCtas) return "the problem needs more than 2^31 - 1 thread blocks";
  delta_kernel<T, D><<<static_cast<unsigned>(ctas), kThreads, 0, reinterpret_cast<cudaStream_t>(p.stream)>>>(p, rows);
  HALOATTN_CUDA_TRY(cudaGetLastError());
  return {};
}

template <typename T, int D>
std::string launch_portable(const AttentionParams& p) {
  const cudaStream_t stream = reinterpret_cast<cudaStream_t>(p.stream);
  const TileShape shape = choose_tile(p);
  const int64_t query_ctas = count_tiles(p, shape, p.heads);
  const int64_t key_ctas = count_tiles(p, shape, p.kv_heads);
  if (query_ctas > kMaxCtas) return "the problem needs more than 2^31 - 1 thread blocks";

  std::string error = allow_smem(grad_query_kernel<T, D>, GradQuerySmem<T, D>::kBytes);
  if (!error.empty()) return error;
  grad_query_kernel<T, D><<<static_cast<unsigned>(query_ctas), kThreads, GradQuerySmem<T, D>::kBytes, stream>>>(p, shape);
  HALOATTN_CUDA_TRY(cudaGetLastError());

  error = allow_smem(grad_key_value_kernel<T, D>, GradKeyValueSmem<T, D>::kBytes);
  if (!error.empty()) return error;
  grad_key_value_kernel<T, D>
      <<<static_cast<unsigned>(key_ctas), kThreads, GradKeyValueSmem<T, D>::kBytes, stream>>>(p, shape);
  HALOATTN_CUDA_TRY(cudaGetLastError());
  return {};
}

}  // namespace

std::string backward(const AttentionParams& p) {
  std::string bad = check_supported(p);
  for (auto [name, t] : {std::pair<const char*, const TokenTensor&>{"grad_out", p.grad_out},
                         {"grad_query", p.grad_query}, {"grad_key", p.grad_key}, {"grad_value", p.grad_value}}) {
    if (bad.empty()) bad = check_tensor(name, t);
  }
  if (bad.empty() && p.delta == 0) bad = "delta is a null pointer";
  if (!bad.empty()) return bad;
  // This module's CUDA runtime keeps its own current device: follow the tensors'.
  HALOATTN_CUDA_TRY(cudaSetDevice(p.device));
  const bool hopper = hopper_kernels_run_on(p.device);
  if (p.backward_kernel == KernelChoice::kHopper && !hopper)
    return "backward_kernel='hopper' needs an sm_90 device and a build with sm_90a in HALOATTN_CUDA_ARCHS";
  return dispatch_dtype_dim(p, [&](auto dtype_tag, auto dim_tag) {
    using T = typename decltype(dtype_tag)::type;
    constexpr int D = decltype(dim_tag)::value;
    if (hopper && p.backward_kernel != KernelChoice::kPortable) {
      std::string refusal;
      const std::string error = backward_sm90(p, refusal);  // its dQ pass works out delta itself
      if (refusal.empty()) return error;
      // auto: the portable kernels read any layout the checks above accept.
      if (p.backward_kernel == KernelChoice::kHopper) return "backward_kernel='hopper' cannot take this call: " + refusal;
    }
    const std::string error = launch_delta<T, D>(p);
    return error.empty() ? launch_portable<T, D>(p) : error;
  });
}

}  // namespace haloattn
