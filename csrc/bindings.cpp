// pybind11 module haloattn_cuda._C: the kernels' entry points taking plain integers (device
// pointers, element strides, shapes, the CUDA stream). Nothing here knows PyTorch, so one build
// serves every torch version; backends/cuda/ turns tensors into these arguments.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "attention_params.h"

namespace py = pybind11;
using haloattn::AttentionParams;
using haloattn::kMaxRank;

namespace {

// (length, window, stride, dilation, causal, shift) per axis, padded to rank 3 by the caller.
using AxisTuple = std::array<int, 6>;
// (data_ptr, batch_stride, (axis strides...), head_stride), strides in elements.
using TensorTuple = std::tuple<int64_t, int64_t, std::array<int64_t, kMaxRank>, int64_t>;

haloattn::TokenTensor token_tensor(const TensorTuple& t) {
  haloattn::TokenTensor out;
  out.ptr = std::get<0>(t);
  out.batch_stride = std::get<1>(t);
  for (int a = 0; a < kMaxRank; ++a) out.axis_stride[a] = std::get<2>(t)[a];
  out.head_stride = std::get<3>(t);
  return out;
}

AttentionParams make_params(int dtype, int pattern, int batch, int heads, int kv_heads, int head_dim, int value_dim,
                            const std::vector<AxisTuple>& axes, double scale, int device, int64_t stream) {
  if (axes.size() != kMaxRank) throw std::invalid_argument("axes must hold exactly 3 (padded) axes");
  AttentionParams p;
  p.dtype = static_cast<haloattn::DType>(dtype);
  p.pattern = static_cast<haloattn::Pattern>(pattern);
  p.batch = batch;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.value_dim = value_dim;
  for (int a = 0; a < kMaxRank; ++a) {
    const AxisTuple& x = axes[a];
    p.axis[a] = haloattn::with_divisors({x[0], x[1], x[2], x[3], x[4], x[5]});
  }
  p.scale = static_cast<float>(scale);
  p.stream = stream;
  p.device = device;
  return p;
}

void raise_if(const std::string& error) {
  if (!error.empty()) throw std::runtime_error("haloattn_cuda: " + error);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "haloattn's compiled CUDA kernels (raw pointers and strides; no libtorch)";

  m.def("device_count", []() {
    std::string error;
    const int n = haloattn::device_count(error);
    return py::make_tuple(n, error);
  }, "(number of CUDA devices, '') or (-1, the CUDA runtime's error)");

  m.def("device_capability", [](int device) {
    std::string error;
    const int cc = haloattn::device_capability(device, error);
    return py::make_tuple(cc, error);
  }, py::arg("device"), "(major * 10 + minor, '') or (-1, the CUDA runtime's error)");

  m.def("forward",
        [](int dtype, int pattern, int batch, int heads, int kv_heads, int head_dim, int value_dim,
           const std::vector<AxisTuple>& axes, double scale, const TensorTuple& query, const TensorTuple& key,
           const TensorTuple& value, const TensorTuple& out, int64_t lse, int device, int64_t stream,
           int forward_kernel) {
          AttentionParams p = make_params(dtype, pattern, batch, heads, kv_heads, head_dim, value_dim, axes, scale, device, stream);
          p.query = token_tensor(query);
          p.key = token_tensor(key);
          p.value = token_tensor(value);
          p.out = token_tensor(out);
          p.lse = lse;
          if (forward_kernel < 0 || forward_kernel > 2)
            throw std::invalid_argument("forward_kernel must be 0 (auto), 1 (portable) or 2 (hopper)");
          p.forward_kernel = static_cast<haloattn::KernelChoice>(forward_kernel);
          std::string error;
          {
            py::gil_scoped_release release;
            error = haloattn::forward(p);
          }
          raise_if(error);
        },
        py::arg("dtype"), py::arg("pattern"), py::arg("batch"), py::arg("heads"), py::arg("kv_heads"),
        py::arg("head_dim"), py::arg("value_dim"), py::arg("axes"), py::arg("scale"), py::arg("query"),
        py::arg("key"), py::arg("value"), py::arg("out"), py::arg("lse"), py::arg("device"), py::arg("stream"),
        py::arg("forward_kernel") = 0,
        "Fused forward: writes out [B, *spatial, H, D] and the float32 LSE [B, *spatial, H] (contiguous). "
        "forward_kernel: 0 auto (the Hopper wgmma kernel on sm_90 for scale > 0 where its TMA copies can read the "
        "layout, else the portable one), "
        "1 portable, 2 hopper.");

  m.def("backward",
        [](int dtype, int pattern, int batch, int heads, int kv_heads, int head_dim, int value_dim,
           const std::vector<AxisTuple>& axes, double scale, const TensorTuple& query, const TensorTuple& key,
           const TensorTuple& value, const TensorTuple& out, int64_t lse, const TensorTuple& grad_out,
           int64_t grad_lse, const TensorTuple& grad_query, const TensorTuple& grad_key,
           const TensorTuple& grad_value, int64_t delta, int device, int64_t stream, int backward_kernel) {
          AttentionParams p = make_params(dtype, pattern, batch, heads, kv_heads, head_dim, value_dim, axes, scale, device, stream);
          p.query = token_tensor(query);
          p.key = token_tensor(key);
          p.value = token_tensor(value);
          p.out = token_tensor(out);
          p.lse = lse;
          p.grad_out = token_tensor(grad_out);
          p.grad_lse = grad_lse;
          p.grad_query = token_tensor(grad_query);
          p.grad_key = token_tensor(grad_key);
          p.grad_value = token_tensor(grad_value);
          p.delta = delta;
          if (backward_kernel < 0 || backward_kernel > 2)
            throw std::invalid_argument("backward_kernel must be 0 (auto), 1 (portable) or 2 (hopper)");
          p.backward_kernel = static_cast<haloattn::KernelChoice>(backward_kernel);
          std::string error;
          {
            py::gil_scoped_release release;
            error = haloattn::backward(p);
          }
          raise_if(error);
        },
        py::arg("dtype"), py::arg("pattern"), py::arg("batch"), py::arg("heads"), py::arg("kv_heads"),
        py::arg("head_dim"), py::arg("value_dim"), py::arg("axes"), py::arg("scale"), py::arg("query"),
        py::arg("key"), py::arg("value"), py::arg("out"), py::arg("lse"), py::arg("grad_out"), py::arg("grad_lse"),
        py::arg("grad_query"), py::arg("grad_key"), py::arg("grad_value"), py::arg("delta"), py::arg("device"), py::arg("stream"),
        py::arg("backward_kernel") = 0,
        "Deterministic backward: writes grad_query/grad_key/grad_value; delta is float32 scratch "
        "[B, *spatial, H]; grad_lse is 0 when absent. backward_kernel: 0 auto (the Hopper wgmma kernels on sm_90 "
        "where their TMA copies can read the layout, else the portable ones), 1 portable, 2 hopper.");
}
