// Device queries for the Python side's availability checks, through this module's own
// (statically linked) CUDA runtime, so they report what the kernels will see.
#include <cuda_runtime.h>

#include <string>

#include "attention_params.h"

namespace haloattn {

int device_count(std::string& error) {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    error = cudaGetErrorString(status);
    return -1;
  }
  return n;
}

int device_capability(int device, std::string& error) {
  cudaDeviceProp prop;
  const cudaError_t status = cudaGetDeviceProperties(&prop, device);
  if (status != cudaSuccess) {
    error = cudaGetErrorString(status);
    return -1;
  }
  return prop.major * 10 + prop.minor;
}

}  // namespace haloattn
