// Integer division for the tile geometry the kernels work out per tile (window_geometry.cuh,
// token_tiles.cuh, key_tiles.cuh). There every numerator is >= 0 and every divisor >= 1. A
// signed `/` by a run-time value is about 25 SASS instructions (sign fix-ups around a reciprocal);
// the Hopper forward worked out some 70 of them per pair tile in every consumer thread, about as
// many instructions as four key tiles' softmax (Nsight Compute, 2026-11-27). With the operands
// known to be non-negative an unsigned division gives the same quotient in fewer instructions.
// (Shifts for power-of-two divisors, tested at run time or used for the tile extents, made ptxas
// spill more in the backward's copy warps and in the forward: ptxas -v, not kept.)
#pragma once

namespace haloattn {

// floor(x / d) for x >= 0, d >= 1.
__host__ __device__ __forceinline__ int div_nonneg(int x, int d) {
  return static_cast<int>(static_cast<unsigned>(x) / static_cast<unsigned>(d));
}

// ceil(x / d) for x >= 0, d >= 1.
__host__ __device__ __forceinline__ int ceil_div_nonneg(int x, int d) { return div_nonneg(x + d - 1, d); }

}  // namespace haloattn
