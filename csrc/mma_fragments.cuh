// Warp-level tensor-core tiles for the attention kernels: CuTe's SM80 m16n8k16 MMA atoms (which
// Hopper runs as HMMA) and the register fragments they take, loaded from padded shared memory
// with ldmatrix.
//
// Fragment layouts (PTX ISA, mma.m16n8k16), with g = lane / 4 and t = lane % 4:
//   A (16 x 16, row major):  a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16 x 8, k x n):       b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   C (16 x 8, row major):   c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
// Two C tiles side by side (16 x 16) are exactly one A fragment, which chains softmax(QK^T) into
// the next product without leaving registers (FlashAttention-2's trick).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cute/arch/mma_sm80.hpp>

#include <cstdint>

#include "fragment_sources.cuh"

namespace haloattn {

template <typename T> struct MmaAtom;
template <> struct MmaAtom<__nv_bfloat16> { using type = cute::SM80_16x8x16_F32BF16BF16F32_TN; };
template <> struct MmaAtom<__half> { using type = cute::SM80_16x8x16_F32F16F16F32_TN; };

// c += a * b for one 16 x 8 x 16 step.
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  MmaAtom<T>::type::fma(c[0], c[1], c[2], c[3], a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3]);
}

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The inverse of pack2: two 16-bit elements as floats.
template <typename T> __device__ __forceinline__ float2 unpack2(uint32_t v);
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}
template <> __device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
  return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// A fragment of rows [row0, row0+16) x cols [k0, k0+16) of a row-major tile with pitch `ld`.
template <typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int ld, int row0, int k0, int lane) {
  const TileCoord c = a_source(lane, row0, k0);
  ldmatrix_x4(a, tile + c.row * ld + c.col);
}

// B fragments of n-tiles n0 and n0 + 8 (k0..k0+16) from a tile stored n-major, tile[n][k]
// (contiguous in k), e.g. K for Q K^T.
template <typename T>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[2][2], const T* tile, int ld, int n0, int k0, int lane) {
  const TileCoord c = b_nk_source(lane, n0, k0);
  uint32_t r[4];
  ldmatrix_x4(r, tile + c.row * ld + c.col);
  b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

// B fragments of n-tiles n0 and n0 + 8 from a tile stored k-major, tile[k][n] (contiguous in
// n), e.g. V for P V.
template <typename T>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[2][2], const T* tile, int ld, int k0, int n0, int lane) {
  const TileCoord c = b_kn_source(lane, k0, n0);
  uint32_t r[4];
  ldmatrix_x4_trans(r, tile + c.row * ld + c.col);
  b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

// The A fragment of columns [16 kk, 16 kk + 16) of a 16-row accumulator held as C tiles.
template <typename T, int NT>
__device__ __forceinline__ void accum_to_a(uint32_t (&a)[4], const float (&c)[NT][4], int kk) {
  a[0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// 16-byte global -> shared copy; `valid == false` writes zeros (cp.async's zero fill).
__device__ __forceinline__ void copy16_async(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void copy_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
// Waits for all but the most recently committed copy group.
__device__ __forceinline__ void copy_async_wait_one_pending() { asm volatile("cp.async.wait_group 1;\n" ::); }

}  // namespace haloattn
