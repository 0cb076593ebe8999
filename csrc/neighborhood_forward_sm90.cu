// Fused forward pass for Hopper (sm_90a): warp-specialised, warpgroup MMA.
//
// One CTA owns a 64-query tile of one (batch, head, dilation group), as in the portable kernel
// (neighborhood_forward.cu), and walks the key box of the tile in flat 64-key chunks. Three
// warpgroups split the work:
//   * the producer copies Q once and each K/V chunk into a ring of shared-memory stages
//     (cp.async into the 128-byte-swizzled layout wgmma reads; rows are gathered by box
//     coordinates, so any box shape, dilation and edge works), and publishes a stage on its
//     "full" mbarrier once the copies have landed;
//   * two consumer warpgroups take alternate chunks (even / odd): S = Q K^T (wgmma, both from
//     smem), mask and online softmax in registers, O += P V (wgmma, P from registers), then free
//     the stage on its "empty" mbarrier. Each keeps its own running max, sum and O; the second
//     hands its partial result to the first through shared memory at the end, which merges
//     and writes O and the LSE.
// While one consumer runs its softmax the other's tensor-core work proceeds, and no consumer
// ever waits for a copy it could have overlapped.
#include <cuda_runtime.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cmath>
#include <string>

#include "attention_params.h"
#include "box_cursor.cuh"
#include "kernel_launch.h"
#include "mma_fragments.cuh"
#include "row_windows.cuh"
#include "token_tiles.cuh"
#include "wgmma_ops.cuh"

namespace haloattn {
namespace sm90 {
namespace {

constexpr int kChunk = 64;       // keys per stage (the N of S = Q K^T)
constexpr int kStages = 4;       // K/V ring depth
constexpr int kConsumers = 2;    // warpgroups splitting the chunks
constexpr int kWarpgroup = 128;  // threads
constexpr int kThreads = kWarpgroup * (1 + kConsumers);
// Registers per thread after the split (setmaxnreg): the producer needs few, the consumers hold
// S, O and P. 128 * 56 + 256 * 224 fits the 64K-register file at one CTA per SM.
constexpr int kProducerRegisters = 56;
constexpr int kConsumerRegisters = 224;

using Barrier = cutlass::arch::ClusterBarrier;

template <typename T, int D>
struct Smem {
  static constexpr int kTileElems = kChunk * D;  // a [64][D] tile (queries or keys)
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + kTileElems * sizeof(T);
  static constexpr size_t kV = kK + kStages * kTileElems * sizeof(T);
  // The second consumer's partial result: D / 2 accumulators and (max, sum) of 2 rows per thread.
  static constexpr size_t kMerge = kV + kStages * kTileElems * sizeof(T);
  static constexpr size_t kMergeFloats = (D / 2 + 4) * kWarpgroup;
  static constexpr size_t kBarriers = kMerge + kMergeFloats * sizeof(float);
  static constexpr int kBarrierCount = 1 + 2 * kStages;  // Q full, K/V full[], K/V empty[]
  static constexpr size_t kBytes = kBarriers + kBarrierCount * sizeof(uint64_t);
  // Tiles must start 1024-byte aligned (the swizzle is applied to address bits); dynamic shared
  // memory is only promised 16, so the launch asks for one alignment's worth more.
  static constexpr size_t kLaunchBytes = kBytes + 1024;
  static_assert(kK % 1024 == 0 && kV % 1024 == 0 && (kTileElems * sizeof(T)) % 1024 == 0, "tiles 1024-aligned");
};

// Element offsets of a box's rows: offset(x) = base + sum x[a] * step[a].
struct BoxRows {
  const unsigned char* base;
  int64_t step[kMaxRank];  // bytes per box position along each axis (stride * dilation)
};

template <typename T>
__device__ inline BoxRows box_rows(const AttentionParams& p, const TokenTensor& t, const TileWork& w, int head,
                                   const int (&lo)[kMaxRank]) {
  int64_t offset = w.batch * t.batch_stride + head * t.head_stride;
  BoxRows r;
  for (int a = 0; a < kMaxRank; ++a) {
    offset += static_cast<int64_t>(lo[a] * p.axis[a].dilation + w.group[a]) * t.axis_stride[a];
    r.step[a] = static_cast<int64_t>(p.axis[a].dilation) * t.axis_stride[a] * sizeof(T);
  }
  r.base = reinterpret_cast<const unsigned char*>(t.ptr) + offset * sizeof(T);
  return r;
}

__device__ inline const void* row_address(const BoxRows& r, const BoxCursor& c) {
  return r.base + c.x[0] * r.step[0] + c.x[1] * r.step[1] + c.x[2] * r.step[2];
}

// Producer side of one chunk: rows [first, first + 64) of the key box into the K and V stages.
// Thread pt copies 16-byte piece pt % PIECES of rows pt / PIECES + i * (128 / PIECES).
template <typename T, int D>
__device__ inline void copy_chunk(T* sK, T* sV, const BoxRows& keys, const BoxRows& values, BoxCursor row,
                                  const int (&extent)[kMaxRank], int pt) {
  constexpr int kPieces = D / 8;
  constexpr int kRowsPerPass = kWarpgroup / kPieces;
  const int piece = pt % kPieces;
#pragma unroll
  for (int pass = 0; pass < kChunk / kRowsPerPass; ++pass) {
    const int r = pt / kPieces + pass * kRowsPerPass;
    const bool valid = row.x[0] < extent[0];
    const int dst = swizzled_element<kChunk>(r, piece);
    const int src = piece * 16;  // bytes
    copy16_async(sK + dst, valid ? static_cast<const unsigned char*>(row_address(keys, row)) + src : keys.base, valid);
    copy16_async(sV + dst, valid ? static_cast<const unsigned char*>(row_address(values, row)) + src : values.base, valid);
    advance(row, kRowsPerPass, extent);
  }
}

// The CTA's own 64 queries (rows past the grid zero-filled).
template <typename T, int D>
__device__ inline void copy_queries(T* sQ, const AttentionParams& p, const TileWork& w, const TileShape& shape,
                                    int pt) {
  constexpr int kPieces = D / 8;
  constexpr int kRowsPerPass = kWarpgroup / kPieces;
  const T* base = reinterpret_cast<const T*>(p.query.ptr) + w.batch * p.query.batch_stride + w.head * p.query.head_stride;
  const int piece = pt % kPieces;
#pragma unroll
  for (int pass = 0; pass < kChunk / kRowsPerPass; ++pass) {
    const int r = pt / kPieces + pass * kRowsPerPass;
    int x[kMaxRank];
    const bool valid = tile_row_coords(w, shape, r, x);
    copy16_async(sQ + swizzled_element<kChunk>(r, piece), valid ? base + token_offset(p, p.query, w, x) + piece * 8 : base,
                 valid);
  }
}

// Makes this thread's finished cp.async writes visible to the tensor cores (async proxy), then
// counts it in on `bar`.
__device__ inline void publish(uint64_t* bar) {
  cutlass::arch::fence_view_async_shared();
  Barrier::arrive(bar);
}

__device__ inline void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1) forward_kernel(const AttentionParams p, const TileShape shape) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Smem<T, D>;
  extern __shared__ unsigned char smem_unaligned[];
  const uint32_t raw = cute::cast_smem_ptr_to_uint(smem_unaligned);
  unsigned char* smem = smem_unaligned + ((1024 - (raw & 1023)) & 1023);
  T* sQ = reinterpret_cast<T*>(smem + L::kQ);
  T* sK = reinterpret_cast<T*>(smem + L::kK);
  T* sV = reinterpret_cast<T*>(smem + L::kV);
  float* merge = reinterpret_cast<float*>(smem + L::kMerge);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBarriers);
  uint64_t* full = q_full + 1;
  uint64_t* empty = full + kStages;

  const TileWork w = locate_tile(p, shape, p.heads, blockIdx.x);
  if (w.empty) return;
  int key_lo[kMaxRank], key_extent[kMaxRank];
  key_box(p, w, key_lo, key_extent);
  const int box_keys = key_extent[0] * key_extent[1] * key_extent[2];
  const int chunks = (box_keys + kChunk - 1) / kChunk;
  const int role = threadIdx.x / kWarpgroup;  // 0 producer, 1.. consumers
  const int tid = threadIdx.x % kWarpgroup;

  if (threadIdx.x == 0) {
    Barrier::init(q_full, kWarpgroup);
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(&full[s], kWarpgroup);
      Barrier::init(&empty[s], kWarpgroup);
    }
  }
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (role == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    const int kv_head = w.head / (p.heads / p.kv_heads);
    const BoxRows keys = box_rows<T>(p, p.key, w, kv_head, key_lo);
    const BoxRows values = box_rows<T>(p, p.value, w, kv_head, key_lo);
    copy_queries<T, D>(sQ, p, w, shape, tid);
    copy_async_commit();
    BoxCursor row = box_cursor(tid / (D / 8), key_extent);
    for (int c = 0; c < chunks; ++c) {
      const int stage = c % kStages;
      if (c >= kStages) Barrier::wait(&empty[stage], ((c / kStages) - 1) & 1);
      copy_chunk<T, D>(sK + stage * L::kTileElems, sV + stage * L::kTileElems, keys, values, row, key_extent, tid);
      copy_async_commit();
      advance(row, kChunk, key_extent);
      // Publish the group before this one (Q with chunk 0) while this chunk's copies fly.
      copy_async_wait_one_pending();
      publish(c == 0 ? q_full : &full[(c - 1) % kStages]);
    }
    copy_async_wait_all();
    publish(&full[(chunks - 1) % kStages]);
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
  const int consumer = role - 1;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  constexpr int kSRegs = kChunk / 2;  // S accumulators per thread (64 x 64 over 128 threads)
  constexpr int kORegs = D / 2;
  constexpr int kKeyTiles = kChunk / 8;

  // The two rows this thread accumulates, and their neighbourhoods relative to the key box.
  const int row_a = warp * 16 + g, row_b = row_a + 8;
  int x_a[kMaxRank], x_b[kMaxRank];
  const bool inside_a = tile_row_coords(w, shape, row_a, x_a);
  const bool inside_b = tile_row_coords(w, shape, row_b, x_b);
  RowWindow win_a = query_window(p, w, x_a, inside_a);
  RowWindow win_b = query_window(p, w, x_b, inside_b);
  for (int a = 0; a < kMaxRank; ++a) {
    win_a.lo[a] -= key_lo[a], win_a.hi[a] -= key_lo[a];
    win_b.lo[a] -= key_lo[a], win_b.hi[a] -= key_lo[a];
  }
  const bool shared_window = tile_shares_one_window(p, w);

  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;  // log2 units
  const float scale_log2 = p.scale * kLog2e;
  // Column 2t of this consumer's first chunk; each later chunk of it starts 2 chunks on.
  BoxCursor chunk_col = box_cursor(consumer * kChunk + 2 * t, key_extent);

  Barrier::wait(q_full, 0);
  for (int c = consumer; c < chunks; c += kConsumers) {
    const int stage = c % kStages;
    const T* sK_now = sK + stage * L::kTileElems;
    const T* sV_now = sV + stage * L::kTileElems;
    Barrier::wait(&full[stage], (c / kStages) & 1);

    float s[kSRegs];
    cute::warpgroup_arrive();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      mma_ss<T, kChunk>(k_major_descriptor<T, kChunk>(sQ, ks), k_major_descriptor<T, kChunk>(sK_now, ks), s, ks > 0);
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    fence_registers(s);

    // Mask (unless every key of the chunk is in every row's window) and scale; row maxima over
    // the quad of lanes that shares a row.
    const bool masked = !shared_window || (c + 1) * kChunk > box_keys;
    float tile_max_a = -INFINITY, tile_max_b = -INFINITY;
    BoxCursor col = chunk_col;
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        bool keep_a = true, keep_b = true;
        if (masked) {
          const BoxCursor key = e == 0 ? col : advanced(col, 1, key_extent);
          keep_a = attends(win_a, key.x);
          keep_b = attends(win_b, key.x);
        }
        s[4 * j + e] = keep_a ? s[4 * j + e] * scale_log2 : -INFINITY;
        s[4 * j + 2 + e] = keep_b ? s[4 * j + 2 + e] * scale_log2 : -INFINITY;
        tile_max_a = fmaxf(tile_max_a, s[4 * j + e]);
        tile_max_b = fmaxf(tile_max_b, s[4 * j + 2 + e]);
      }
      if (masked) advance(col, 8, key_extent);
    }
    advance(chunk_col, kConsumers * kChunk, key_extent);
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
    for (int j = 0; j < kKeyTiles; ++j) {
      s[4 * j + 0] = exp2f(s[4 * j + 0] - base_a);
      s[4 * j + 1] = exp2f(s[4 * j + 1] - base_a);
      s[4 * j + 2] = exp2f(s[4 * j + 2] - base_b);
      s[4 * j + 3] = exp2f(s[4 * j + 3] - base_b);
      l_a += s[4 * j + 0] + s[4 * j + 1];
      l_b += s[4 * j + 2] + s[4 * j + 3];
    }
#pragma unroll
    for (int j = 0; j < kORegs / 4; ++j) {
      o[4 * j + 0] *= alpha_a;
      o[4 * j + 1] *= alpha_a;
      o[4 * j + 2] *= alpha_b;
      o[4 * j + 3] *= alpha_b;
    }
    uint32_t pa[kChunk / 16][4];
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {
      pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
    }
    fence_registers(o);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) mma_rs<T, D>(pa[kk], mn_major_descriptor<T, kChunk>(sV_now, kk), o);
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    fence_registers(o);
    Barrier::arrive(&empty[stage]);
  }

#pragma unroll
  for (int offset = 1; offset < 4; offset <<= 1) {
    l_a += __shfl_xor_sync(0xffffffff, l_a, offset);
    l_b += __shfl_xor_sync(0xffffffff, l_b, offset);
  }

  // The second consumer's partial (O, max, sum) goes through shared memory to the first, in
  // register order ([register][thread]: conflict-free, and the reader holds the same rows).
  if (consumer == 1) {
#pragma unroll
    for (int i = 0; i < kORegs; ++i) merge[i * kWarpgroup + tid] = o[i];
    merge[(kORegs + 0) * kWarpgroup + tid] = m_a;
    merge[(kORegs + 1) * kWarpgroup + tid] = m_b;
    merge[(kORegs + 2) * kWarpgroup + tid] = l_a;
    merge[(kORegs + 3) * kWarpgroup + tid] = l_b;
  }
  named_barrier_sync(1, kConsumers * kWarpgroup);
  if (consumer == 1) return;
  {
    const float m2_a = merge[(kORegs + 0) * kWarpgroup + tid], m2_b = merge[(kORegs + 1) * kWarpgroup + tid];
    const float l2_a = merge[(kORegs + 2) * kWarpgroup + tid], l2_b = merge[(kORegs + 3) * kWarpgroup + tid];
    const float new_m_a = fmaxf(m_a, m2_a), new_m_b = fmaxf(m_b, m2_b);
    const float base_a = new_m_a == -INFINITY ? 0.f : new_m_a;
    const float base_b = new_m_b == -INFINITY ? 0.f : new_m_b;
    const float own_a = exp2f(m_a - base_a), own_b = exp2f(m_b - base_b);
    const float other_a = exp2f(m2_a - base_a), other_b = exp2f(m2_b - base_b);
#pragma unroll
    for (int j = 0; j < kORegs / 4; ++j) {
      o[4 * j + 0] = o[4 * j + 0] * own_a + merge[(4 * j + 0) * kWarpgroup + tid] * other_a;
      o[4 * j + 1] = o[4 * j + 1] * own_a + merge[(4 * j + 1) * kWarpgroup + tid] * other_a;
      o[4 * j + 2] = o[4 * j + 2] * own_b + merge[(4 * j + 2) * kWarpgroup + tid] * other_b;
      o[4 * j + 3] = o[4 * j + 3] * own_b + merge[(4 * j + 3) * kWarpgroup + tid] * other_b;
    }
    l_a = l_a * own_a + l2_a * other_a;
    l_b = l_b * own_b + l2_b * other_b;
    m_a = new_m_a;
    m_b = new_m_b;
  }

  // Write O / l and the natural-log LSE for the rows inside the grid.
  T* out = reinterpret_cast<T*>(p.out.ptr) + w.batch * p.out.batch_stride + w.head * p.out.head_stride;
  float* lse = reinterpret_cast<float*>(p.lse);
  const int64_t tokens = grid_tokens(p);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (!(half == 0 ? inside_a : inside_b)) continue;
    const int(&x)[kMaxRank] = half == 0 ? x_a : x_b;
    const float l = half == 0 ? l_a : l_b;
    const float m = half == 0 ? m_a : m_b;
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
    T* dst = out + token_offset(p, p.out, w, x);
#pragma unroll
    for (int j = 0; j < kORegs / 4; ++j) {
      const uint32_t v = pack2<T>(o[4 * j + 2 * half] * inv_l, o[4 * j + 2 * half + 1] * inv_l);
      *reinterpret_cast<uint32_t*>(dst + j * 8 + 2 * t) = v;
    }
    if (t == 0) {
      lse[(w.batch * tokens + token_index(p, w, x)) * p.heads + w.head] = l > 0.f ? (m + log2f(l)) * kLn2 : -INFINITY;
    }
  }
#endif
}

template <typename T, int D>
std::string launch(const AttentionParams& p) {
  const TileShape shape = choose_tile(p);
  const int64_t ctas = count_tiles(p, shape, p.heads);
  if (ctas > kMaxCtas) return "the problem needs more than 2^31 - 1 thread blocks";
  auto kernel = forward_kernel<T, D>;
  const size_t smem = Smem<T, D>::kLaunchBytes;
  HALOATTN_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(ctas), kThreads, smem, reinterpret_cast<cudaStream_t>(p.stream)>>>(p, shape);
  HALOATTN_CUDA_TRY(cudaGetLastError());
  return {};
}

}  // namespace
}  // namespace sm90

std::string forward_sm90(const AttentionParams& p) {
  return dispatch_dtype_dim(p, [&](auto dtype_tag, auto dim_tag) {
    return sm90::launch<typename decltype(dtype_tag)::type, decltype(dim_tag)::value>(p);
  });
}

}  // namespace haloattn
