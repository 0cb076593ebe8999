// Host side of the Hopper forward kernel's copies: TMA tensor maps over q, k and v read in place.
//
// A [B, *spatial, H, D] tensor becomes a 5-D map, innermost first: (H * D, L2, L1, L0, B) with
// the tensor's own strides, so a box of one head's 64-channel panel over a spatial block of
// tokens is one copy. Heads fold into the channel axis (their stride must be D); dilation is the
// box's element stride (the copy engine reads every d-th token, so a box covers one dilation
// group); rows past the grid, before it or past a group's end are zero-filled by the engine.
// The driver's encoder is reached through the runtime's entry-point query, so the module still
// links nothing but the static CUDA runtime.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <string>

#include "attention_params.h"
#include "token_tiles.cuh"

namespace haloattn {

// 64 16-bit channels: one 128-byte swizzle row, the panel width the wgmma descriptors read.
constexpr int kMapPanel = 64;

struct ForwardMaps {
  CUtensorMap query, key, value, out;  // out: the query map's box, for the epilogue's stores
};

inline std::string tensor_map_encoder(PFN_cuTensorMapEncodeTiled_v12000& encode) {
  static PFN_cuTensorMapEncodeTiled_v12000 cached = nullptr;
  if (cached == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr)
      return "the CUDA driver has no cuTensorMapEncodeTiled (needs a CUDA 12 driver)";
    cached = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  encode = cached;
  return {};
}

// The map of `t` (`heads` heads) whose box is one 64-channel panel of one head over `box` tokens
// per axis. Returns why the tensor cannot be mapped, or an empty string.
inline std::string encode_token_map(CUtensorMap& map, const char* name, const AttentionParams& p, const TokenTensor& t,
                                    int heads, const int (&box)[kMaxRank]) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  std::string missing = tensor_map_encoder(encode);
  if (!missing.empty()) return missing;
  const int64_t elem = 2;  // float16 / bfloat16
  if (heads > 1 && t.head_stride != p.head_dim)
    return std::string(name) + "'s heads are not adjacent (head stride " + std::to_string(t.head_stride) + ", head_dim " +
           std::to_string(p.head_dim) + ")";
  cuuint64_t dims[5] = {static_cast<cuuint64_t>(heads) * p.head_dim, static_cast<cuuint64_t>(p.axis[2].length),
                        static_cast<cuuint64_t>(p.axis[1].length), static_cast<cuuint64_t>(p.axis[0].length),
                        static_cast<cuuint64_t>(p.batch)};
  int64_t strides[4] = {t.axis_stride[2], t.axis_stride[1], t.axis_stride[0], t.batch_stride};
  // A dimension of one element is never stepped along: give it a stride the encoder accepts
  // (torch reports arbitrary strides, even 0, for size-1 dimensions).
  int64_t extent_so_far = static_cast<int64_t>(dims[0]);
  for (int i = 0; i < 4; ++i) {
    if (dims[i + 1] == 1) strides[i] = extent_so_far;
    extent_so_far = strides[i] * static_cast<int64_t>(dims[i + 1]);
  }
  cuuint64_t stride_bytes[4];
  for (int i = 0; i < 4; ++i) {
    if (strides[i] <= 0 || (strides[i] * elem) % 16 != 0)
      return std::string(name) + " has a stride the copy engine cannot step (" + std::to_string(strides[i]) + " elements)";
    stride_bytes[i] = static_cast<cuuint64_t>(strides[i] * elem);
  }
  cuuint32_t box_dims[5] = {kMapPanel, 1, 1, 1, 1};
  cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  for (int a = 0; a < kMaxRank; ++a) {
    const int d = p.axis[a].dilation;
    if (d > 8 || box[a] * d > 256)
      return std::string("axis ") + std::to_string(a) + "'s tile of " + std::to_string(box[a]) + " tokens at dilation " +
             std::to_string(d) + " exceeds a copy box (tile * dilation <= 256, dilation <= 8)";
    box_dims[3 - a] = static_cast<cuuint32_t>(box[a] * d);
    element_strides[3 - a] = static_cast<cuuint32_t>(d);
  }
  const CUresult status = encode(&map, p.dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                                 5, reinterpret_cast<void*>(t.ptr), dims, stride_bytes, box_dims, element_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) return std::string("cuTensorMapEncodeTiled rejected ") + name + " (CUresult " + std::to_string(status) + ")";
  return {};
}

}  // namespace haloattn
