// Host-side helpers shared by the kernels' launchers: error strings, the checks every entry
// point runs first, and the dispatch from runtime dtype/head_dim to the few compiled instances.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>
#include <type_traits>
#include <utility>

#include "attention_params.h"

namespace haloattn {

constexpr int64_t kMaxCtas = 2147483647;

#define HALOATTN_CUDA_TRY(call)                                                 \
  do {                                                                           \
    const cudaError_t status_ = (call);                                          \
    if (status_ != cudaSuccess) return std::string(#call ": ") + cudaGetErrorString(status_); \
  } while (0)

inline bool aligned16(int64_t address_or_stride_bytes) { return address_or_stride_bytes % 16 == 0; }

inline std::string check_tensor(const char* name, const TokenTensor& t) {
  if (t.ptr == 0) return std::string(name) + " is a null pointer";
  // Rows are copied in 16-byte pieces: every stride must keep them 16-byte aligned.
  bool ok = aligned16(t.ptr) && t.batch_stride % 8 == 0 && t.head_stride % 8 == 0;
  for (int a = 0; a < kMaxRank; ++a) ok = ok && t.axis_stride[a] % 8 == 0;
  if (!ok) return std::string(name) + " is not 16-byte aligned with strides divisible by 8 elements";
  return {};
}

inline std::string check_supported(const AttentionParams& p) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return "dtype must be float16 or bfloat16";
  if (p.head_dim != p.value_dim) return "head_dim and value_dim must be equal";
  if (p.head_dim != 64 && p.head_dim != 128) return "head_dim must be 64 or 128";
  if (p.kv_heads < 1 || p.heads % p.kv_heads != 0) return "heads must be a multiple of kv_heads";
  for (int a = 0; a < kMaxRank; ++a) {
    const AxisParams& x = p.axis[a];
    if (x.window < 1 || x.dilation < 1 || x.stride < 1 || x.stride > x.window || x.window * x.dilation > x.length)
      return "axis " + std::to_string(a) + " has an invalid window/stride/dilation";
    // The kernels divide by the precomputed divisors, not by the fields: they must agree.
    if (x.by_stride.d != x.stride || x.by_window.d != x.window || x.by_dilation.d != x.dilation)
      return "axis " + std::to_string(a) + " was built without with_divisors (attention_params.h)";
  }
  for (auto [name, t] : {std::pair<const char*, const TokenTensor&>{"query", p.query}, {"key", p.key},
                         {"value", p.value}, {"out", p.out}}) {
    std::string bad = check_tensor(name, t);
    if (!bad.empty()) return bad;
  }
  if (p.lse == 0) return "lse is a null pointer";
  return {};
}

// True where the Hopper kernels can run: the device is sm_90 and this build holds sm_90a code
// (HALOATTN_SM90A, set by CMake when HALOATTN_CUDA_ARCHS names 90a).
inline bool hopper_kernels_run_on(int device) {
#ifdef HALOATTN_SM90A
  int major = 0, minor = 0;  // attribute queries are cheap, unlike cudaGetDeviceProperties
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
         major == 9 && minor == 0;
#else
  (void)device;
  return false;
#endif
}

template <typename T> struct TypeTag { using type = T; };

// Calls fn(TypeTag<element>, integral_constant<head_dim>): 4 instances per kernel in all.
template <typename Fn>
std::string dispatch_dtype_dim(const AttentionParams& p, Fn&& fn) {
  const bool bf16 = p.dtype == DType::kBFloat16;
  if (p.head_dim == 64)
    return bf16 ? fn(TypeTag<__nv_bfloat16>{}, std::integral_constant<int, 64>{})
                : fn(TypeTag<__half>{}, std::integral_constant<int, 64>{});
  return bf16 ? fn(TypeTag<__nv_bfloat16>{}, std::integral_constant<int, 128>{})
              : fn(TypeTag<__half>{}, std::integral_constant<int, 128>{});
}

}  // namespace haloattn
