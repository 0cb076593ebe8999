// What the Hopper kernels (forward and backward) share: their thread layout (a producer
// warpgroup and one consumer warpgroup per half of a pair tile), TMA box copies of one head's
// tile in the 128-byte-swizzled panels wgmma reads, the pair tile's halves, the
// single-instruction exp2, and the rank the masks test.
#pragma once

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cuda_runtime.h>
#include <cutlass/arch/barrier.h>

#include <algorithm>
#include <string>

#include "attention_params.h"
#include "kernel_launch.h"
#include "key_tiles.cuh"
#include "token_tiles.cuh"
#include "wgmma_ops.cuh"

namespace haloattn {
namespace sm90 {

constexpr int kHalfRows = 64;    // rows per consumer warpgroup (the M of one wgmma)
constexpr int kConsumers = 2;    // warpgroups, one per half of a pair tile
constexpr int kWarpgroup = 128;  // threads
constexpr int kThreads = kWarpgroup * (1 + kConsumers);

using Barrier = cutlass::arch::ClusterBarrier;
using TxBarrier = cutlass::arch::ClusterTransactionBarrier;

// Registers per thread at launch (the __launch_bounds__(kThreads, 1) cap). setmaxnreg only moves
// them between the warpgroups after the role split: asking for more would block
// setmaxnreg.inc forever.
constexpr int kLaunchRegisters = 168;
constexpr bool register_split_fits(int producer, int consumer) {
  return producer * kWarpgroup + consumer * kConsumers * kWarpgroup <= kLaunchRegisters * kThreads;
}

// The ring the partner tiles stream through: one 64-token tile per stage (the N of S), four
// stages unless a kernel says otherwise (kRing). The n-th tile a CTA handles (over all its pairs)
// sits in stage n % kRing, and its barriers complete their phase number n / kRing.
constexpr int kChunk = kKeyTileTokens;
constexpr int kStages = 4;
template <int kRing = kStages>
__device__ inline int stage_of(int n) { return n % kRing; }
template <int kRing = kStages>
__device__ inline uint32_t phase_of(int n) { return (n / kRing) & 1; }

// Group coordinate `x` along axis a as the token coordinate a copy starts at.
__device__ inline int token_coordinate(const AttentionParams& p, const TileWork& w, int a, int x) {
  return x * p.axis[a].dilation + w.group[a];
}

// One [rows][D] tile of map `map` (rows: the box's tokens in row-major order) into `dst`, as D / 64
// panel copies of one head; `x` is the box's low corner in group coordinates.
template <int D>
__device__ inline void copy_box(const CUtensorMap* map, uint64_t* bar, void* dst, int rows, const AttentionParams& p,
                                const TileWork& w, int head, const int (&x)[kMaxRank], uint64_t cache_hint) {
  const int c2 = token_coordinate(p, w, 2, x[2]), c1 = token_coordinate(p, w, 1, x[1]), c0 = token_coordinate(p, w, 0, x[0]);
#pragma unroll
  for (int panel = 0; panel < D / kPanelCols; ++panel) {
    // Panels are kPanelCols-element columns of a [rows][64] block each (swizzled_element) of
    // 16-bit elements.
    cute::SM90_TMA_LOAD_5D::copy(map, bar, cache_hint,
                                 static_cast<unsigned char*>(dst) + panel * rows * kPanelCols * sizeof(uint16_t),
                                 head * D + panel * kPanelCols, c2, c1, c0, w.batch);
  }
}

// The reverse of copy_box: a [rows][D] tile in shared memory (D / 64 swizzled panels) written to
// the tokens of map `map` at group coordinates x, one bulk copy per panel, committed as one bulk
// group (wait for its reads with cute::tma_store_wait). The copy engine skips rows past the grid
// and past a dilation group's end, as copy_box's loads zero-fill them.
template <int D>
__device__ inline void store_box(const CUtensorMap* map, const void* src, int rows, const AttentionParams& p,
                                 const TileWork& w, int head, const int (&x)[kMaxRank]) {
  const int c2 = token_coordinate(p, w, 2, x[2]), c1 = token_coordinate(p, w, 1, x[1]), c0 = token_coordinate(p, w, 0, x[0]);
#pragma unroll
  for (int panel = 0; panel < D / kPanelCols; ++panel) {
    cute::SM90_TMA_STORE_5D::copy(map, static_cast<const unsigned char*>(src) + panel * rows * kPanelCols * sizeof(uint16_t),
                                  head * D + panel * kPanelCols, c2, c1, c0, w.batch);
  }
  cute::tma_store_arrive();
}

// Barrier `id` (1-15; 0 is __syncthreads) over the `threads` threads that reach it.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Arrives on barrier `id` for `threads` threads without waiting: the other threads' bar.sync on
// it completes once these arrivals and theirs add up to `threads`.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// 2^x in one MUFU instruction (ex2.approx.ftz: about 2 ulp, denormal results flushed to zero,
// as FlashAttention's exponentials). exp2f adds a range fix-up of about four instructions per
// score, which was a fifth of the consumer's instructions.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The grid's rank once leading unit axes are dropped (masks test only the others).
inline int effective_rank(const AttentionParams& p) {
  int rank = kMaxRank;
  for (int a = 0; a < kMaxRank - 1 && p.axis[a].length == 1; ++a) --rank;
  return rank;
}

// The kernel's dynamic shared memory, 1024-byte aligned: tiles in the 128-byte-swizzled layout
// must be (the hardware applies the swizzle to address bits), and the launch is only promised
// 16, so it asks for 1024 bytes more.
__device__ inline unsigned char* aligned_shared_memory() {
  extern __shared__ unsigned char smem_unaligned[];
  const uint32_t raw = cute::cast_smem_ptr_to_uint(smem_unaligned);
  return smem_unaligned + ((1024 - (raw & 1023)) & 1023);
}

// Every thread of the CTA fills the partner tiling's prefix masks (key_tiles.cuh) into `below`.
__device__ inline void fill_prefix_masks(uint64_t* below, const KeyTiling& kt) {
  for (int i = threadIdx.x; i < kMaxRank * kMaskEntries; i += kThreads)
    below[i] = prefix_mask(kt, i / kMaskEntries, i % kMaskEntries);
}

// Launches a persistent Hopper kernel: one CTA per SM (its shared memory allows no second), each
// walking pairs blockIdx.x, + gridDim.x, ...: the pairs in flight at once are neighbours, whose
// partner boxes overlap in L2.
template <typename Kernel, typename... Args>
std::string launch_persistent(const AttentionParams& p, Kernel kernel, size_t smem, int64_t pairs, const Args&... args) {
  int sms = 0;
  HALOATTN_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device));
  HALOATTN_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const unsigned ctas = static_cast<unsigned>(std::min<int64_t>(pairs, sms));
  kernel<<<ctas, kThreads, smem, reinterpret_cast<cudaStream_t>(p.stream)>>>(p, args...);
  HALOATTN_CUDA_TRY(cudaGetLastError());
  return {};
}

}  // namespace sm90
}  // namespace haloattn
