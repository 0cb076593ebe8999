// Hopper warpgroup MMA (wgmma, sm_90a) for the attention kernels: shared-memory matrix
// descriptors for 128-byte-swizzled tiles, and the two products a forward step needs,
//   S (64 x N)  = Q (64 x D, smem) K^T (N x D, smem)        -- both operands K-major
//   O (64 x DV) += P (64 x 16, registers) V (16 x DV, smem) -- V stored [keys][DV]: MN-major
// issued by one warpgroup (4 warps; warp w owns rows 16w..16w+15).
//
// Accumulator layout (PTX ISA, wgmma .m64nNk16, f32): thread (warp w, lane l), g = l / 4,
// t = l % 4, holds d[4j + 0..1] = (row 16w + g, cols 8j + 2t, +1) and d[4j + 2..3] = (row
// 16w + g + 8, same cols): per warp exactly mma.sync's C tiles side by side, so P's register
// A fragments for the next product come from the S registers as in mma_fragments.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

#include "mma_fragments.cuh"

#include <cstdint>
#include <utility>

namespace haloattn {
namespace sm90 {

namespace gmma = cute::SM90::GMMA;

// 128-byte swizzle, the layout wgmma's SW128 descriptors read: a tile of ROWS rows of 16-bit
// elements is stored as panels of 64 columns ([panel][row][64]); row r's 16-byte piece c of a
// panel sits at piece (c ^ (r % 8)), so the 8 rows a matrix fragment reads hit 8 distinct
// bank groups. Tiles start 1024-byte aligned: the hardware applies the swizzle to address bits.
constexpr int kPanelCols = 64;

template <int ROWS>
__host__ __device__ __forceinline__ int swizzled_element(int row, int piece) {
  return (piece >> 3) * ROWS * kPanelCols + row * kPanelCols + (((piece & 7) ^ (row & 7)) << 3);
}

__device__ __forceinline__ uint64_t sw128_descriptor(const void* smem, int leading_bytes, int stride_bytes) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>(cute::cast_smem_ptr_to_uint(smem) >> 4);
  d.bitfield.leading_byte_offset_ = static_cast<uint16_t>(leading_bytes >> 4);
  d.bitfield.stride_byte_offset_ = static_cast<uint16_t>(stride_bytes >> 4);
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = static_cast<uint8_t>(gmma::LayoutType::B128);
  return d.desc_;
}

// K-major operand (Q or K: [ROWS][D]), k-step ks (columns 16 ks .. 16 ks + 15): its panel, then
// 32 bytes per step inside the swizzled row (the hardware swizzles the summed address). 8-row
// groups are 1024 bytes apart; the leading offset is unused by swizzled K-major layouts.
template <typename T, int ROWS>
__device__ __forceinline__ uint64_t k_major_descriptor(const T* tile, int ks) {
  return sw128_descriptor(tile + (ks >> 2) * ROWS * kPanelCols + (ks & 3) * 16, 16, 1024);
}

// MN-major B operand (V: [ROWS keys][DV], DV contiguous), k-step kk (keys 16 kk .. 16 kk + 15):
// 8-key groups 1024 bytes apart (stride offset), 64-column panels ROWS * 128 bytes apart (leading).
template <typename T, int ROWS>
__device__ __forceinline__ uint64_t mn_major_descriptor(const T* tile, int kk) {
  return sw128_descriptor(tile + kk * 16 * kPanelCols, ROWS * kPanelCols * 2, 1024);
}

template <typename T, int N> struct SmemSmemAtom;   // m64nNk16, A and B K-major
template <typename T, int N> struct RegSmemAtom;    // m64nNk16, A in registers, B MN-major
template <> struct SmemSmemAtom<__nv_bfloat16, 64> {
  using type = gmma::MMA_64x64x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
};
template <> struct SmemSmemAtom<__half, 64> {
  using type = gmma::MMA_64x64x16_F32F16F16_SS<gmma::Major::K, gmma::Major::K>;
};
template <typename T, int N> struct RegSmemKAtom;   // m64nNk16, A in registers, B K-major
template <> struct RegSmemKAtom<__nv_bfloat16, 64> {
  using type = gmma::MMA_64x64x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>;
};
template <> struct RegSmemKAtom<__half, 64> {
  using type = gmma::MMA_64x64x16_F32F16F16_RS<gmma::Major::K, gmma::Major::K>;
};
template <> struct RegSmemAtom<__nv_bfloat16, 64> {
  using type = gmma::MMA_64x64x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>;
};
template <> struct RegSmemAtom<__half, 64> {
  using type = gmma::MMA_64x64x16_F32F16F16_RS<gmma::Major::K, gmma::Major::MN>;
};
template <> struct RegSmemAtom<__nv_bfloat16, 128> {
  using type = gmma::MMA_64x128x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>;
};
template <> struct RegSmemAtom<__half, 128> {
  using type = gmma::MMA_64x128x16_F32F16F16_RS<gmma::Major::K, gmma::Major::MN>;
};

template <typename Atom, int N, size_t... I>
__device__ __forceinline__ void smem_smem(uint64_t a, uint64_t b, float (&d)[N], bool accumulate,
                                          std::index_sequence<I...>) {
  Atom::fma(a, b, d[I]..., accumulate ? gmma::ScaleOut::One : gmma::ScaleOut::Zero);
}

template <typename Atom, int N, size_t... I>
__device__ __forceinline__ void reg_smem(const uint32_t (&a)[4], uint64_t b, float (&d)[N], std::index_sequence<I...>) {
  Atom::fma(a[0], a[1], a[2], a[3], b, d[I]..., gmma::ScaleOut::One);
}

template <typename Atom, int N, size_t... I>
__device__ __forceinline__ void reg_smem_k(const uint32_t (&a)[4], uint64_t b, float (&d)[N], bool accumulate,
                                           std::index_sequence<I...>) {
  Atom::fma(a[0], a[1], a[2], a[3], b, d[I]..., accumulate ? gmma::ScaleOut::One : gmma::ScaleOut::Zero);
}

// d (64 x N) = or += A B for one k-step; the caller fences, commits and waits.
template <typename T, int N>
__device__ __forceinline__ void mma_ss(uint64_t a, uint64_t b, float (&d)[N / 2], bool accumulate) {
  smem_smem<typename SmemSmemAtom<T, N>::type>(a, b, d, accumulate, std::make_index_sequence<N / 2>{});
}

template <typename T, int N>
__device__ __forceinline__ void mma_rs(const uint32_t (&a)[4], uint64_t b, float (&d)[N / 2]) {
  reg_smem<typename RegSmemAtom<T, N>::type>(a, b, d, std::make_index_sequence<N / 2>{});
}

// d (64 x N) = or += A B for one k-step, A from registers, B K-major in smem (S = Q K^T with Q
// held in registers).
template <typename T, int N>
__device__ __forceinline__ void mma_rs_k(const uint32_t (&a)[4], uint64_t b, float (&d)[N / 2], bool accumulate) {
  reg_smem_k<typename RegSmemKAtom<T, N>::type>(a, b, d, accumulate, std::make_index_sequence<N / 2>{});
}

// A 64 x N accumulator (P or dS) as the register A fragments of N / 16 k-steps: two adjacent
// 8-column accumulator tiles are one 16-column k-step.
template <typename T, int K>
__device__ __forceinline__ void accumulator_to_fragments(const float (&s)[K * 8], uint32_t (&a)[K][4]) {
#pragma unroll
  for (int kk = 0; kk < K; ++kk) {
    a[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
    a[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
    a[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
    a[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// Keeps the compiler from moving register reads or writes of an accumulator across the
// asynchronous MMA's issue and wait (the asm statement redefines the registers in place).
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(d[i]);
}

// The same for register A fragments: an asynchronous MMA reads them after its issue, so they must
// stay live (and unchanged) until the wait; fencing them after the wait keeps them so.
template <int K>
__device__ __forceinline__ void fence_fragments(uint32_t (&a)[K][4]) {
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int i = 0; i < 4; ++i) cute::warpgroup_fence_operand(a[k][i]);
}

}  // namespace sm90
}  // namespace haloattn
