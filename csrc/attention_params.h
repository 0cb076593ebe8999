// The plain-old-data description of one attention call that crosses from Python (through
// bindings.cpp) to the kernels: pointers as integers, strides in elements, every grid padded to
// rank 3 with leading unit axes (length 1, window 1), which attend exactly like a missing axis.
#pragma once

#include <cstdint>
#include <string>

#include "fast_divisor.h"

namespace haloattn {

constexpr int kMaxRank = 3;

// One spatial axis, as in SEMANTICS.md section 2 (pattern-specific fields unused otherwise).
struct AxisParams {
  int length = 1;
  int window = 1;
  int stride = 1;
  int dilation = 1;
  int causal = 0;
  int shift = 0;
  // The index rules' divisors, prepared once per call (with_divisors): the kernels divide by them
  // at every tile.
  Divisor by_stride, by_window, by_dilation;
};

inline AxisParams with_divisors(AxisParams a) {
  a.by_stride = Divisor(a.stride);
  a.by_window = Divisor(a.window);
  a.by_dilation = Divisor(a.dilation);
  return a;
}

// A [B, *spatial, heads, dim] tensor read or written in place: its element strides.
struct TokenTensor {
  int64_t ptr = 0;
  int64_t batch_stride = 0;
  int64_t axis_stride[kMaxRank] = {0, 0, 0};
  int64_t head_stride = 0;
};

enum class DType : int { kFloat16 = 0, kBFloat16 = 1 };
enum class Pattern : int { kNeighborhood = 0, kWindow = 1 };
// Which kernels run: auto takes the Hopper ones (wgmma, TMA) where the device is sm_90 and this
// build has sm_90a code (the forward also needs scale > 0), else the portable ones (mma.sync);
// the others force one (benchmarks, tests).
enum class KernelChoice : int { kAuto = 0, kPortable = 1, kHopper = 2 };

struct AttentionParams {
  DType dtype = DType::kBFloat16;
  Pattern pattern = Pattern::kNeighborhood;
  int batch = 1;
  int heads = 1;
  int kv_heads = 1;
  int head_dim = 64;
  int value_dim = 64;
  AxisParams axis[kMaxRank];
  float scale = 1.0f;
  TokenTensor query, key, value, out;
  int64_t lse = 0;  // float32 [B, *spatial, H], contiguous
  KernelChoice forward_kernel = KernelChoice::kAuto;
  // Backward only.
  KernelChoice backward_kernel = KernelChoice::kAuto;
  TokenTensor grad_out, grad_query, grad_key, grad_value;
  int64_t grad_lse = 0;  // float32 [B, *spatial, H] contiguous, or 0 when absent
  int64_t delta = 0;     // float32 scratch [B, *spatial, H]: rowsum(dO * O) - grad_lse
  int64_t stream = 0;    // cudaStream_t as an integer
  int device = 0;        // CUDA device index of every tensor (set as current before launching)
};

// Host entry points (defined in the .cu files). Each returns an empty string on success, else
// the CUDA error or the unsupported parameter, which bindings.cpp raises as a Python exception.
std::string forward(const AttentionParams& params);
// The Hopper kernel, after forward's checks: sets `refusal` (and launches nothing) where it
// cannot take the call (a layout or dilation its tensor-map copies cannot read).
std::string forward_sm90(const AttentionParams& params, std::string& refusal);
std::string backward(const AttentionParams& params);
// The Hopper backward (a dQ pass that also writes delta, then a dK/dV pass), after backward's
// checks: sets `refusal` (and launches nothing) where it cannot take the call.
std::string backward_sm90(const AttentionParams& params, std::string& refusal);
// Number of CUDA devices, or -1 with the runtime's error in `error`.
int device_count(std::string& error);
// Compute capability major * 10 + minor of `device`, or -1 with the error in `error`.
int device_capability(int device, std::string& error);

}  // namespace haloattn
