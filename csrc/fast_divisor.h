// Division by a divisor fixed for a whole launch (a stride, window or dilation) as a multiply-high,
// an add and a shift: the per-tile geometry divides by these in every thread at every pair tile,
// and a hardware-less integer division is a chain of about 15 dependent instructions through the
// reciprocal unit, which the kernels' few warps per scheduler cannot hide (Nsight Compute,
// 2026-11-27: those chains held a quarter of the Hopper forward's samples on a short walk).
// Round-up method of Granlund and Montgomery: with l = ceil(log2 d) and
// m = floor(2^32 (2^l - d) / d) + 1, floor(x / d) = (mulhi(m, x) + x) >> l for 0 <= x < 2^31
// (the sum cannot overflow 32 bits there). d = 1 gives m = 1, l = 0: x itself.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HALOATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define HALOATTN_HOST_DEVICE inline
#endif

namespace haloattn {

struct Divisor {
  int d = 1;
  uint32_t magic = 1;
  int shift = 0;

  Divisor() = default;
  explicit Divisor(int divisor) : d(divisor) {
    if (divisor < 1) return;  // invalid; check_supported (kernel_launch.h) names it before any launch
    while ((int64_t{1} << shift) < divisor) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - divisor)) / divisor + 1);
  }

  // floor(x / d) for 0 <= x < 2^31.
  HALOATTN_HOST_DEVICE int div(int x) const {
#if defined(__CUDA_ARCH__)
    const uint32_t high = __umulhi(magic, static_cast<uint32_t>(x));
#else
    const uint32_t high = static_cast<uint32_t>((uint64_t{magic} * static_cast<uint32_t>(x)) >> 32);
#endif
    return static_cast<int>((high + static_cast<uint32_t>(x)) >> shift);
  }
  // ceil(x / d) for 0 <= x and x + d - 1 < 2^31.
  HALOATTN_HOST_DEVICE int ceil_div(int x) const { return div(x + d - 1); }
};

}  // namespace haloattn
