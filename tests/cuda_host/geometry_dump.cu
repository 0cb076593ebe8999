// Host-side dump of csrc/window_geometry.cuh for tests/test_cuda_build.py: for each axis read from
// stdin ("pattern length window stride dilation causal shift"), print every coordinate's key range
// and query range per dilation group, so the test compares them with core/haloattn/geometry.py.
#include <cstdio>

#include "window_geometry.cuh"

int main() {
  int pattern, length, window, stride, dilation, causal, shift;
  while (std::scanf("%d %d %d %d %d %d %d", &pattern, &length, &window, &stride, &dilation, &causal, &shift) == 7) {
    const haloattn::AxisParams a = haloattn::with_divisors({length, window, stride, dilation, causal, shift});
    const auto p = static_cast<haloattn::Pattern>(pattern);
    for (int i = 0; i < length; ++i) {
      const int group = i % dilation, len = haloattn::group_length(a, group);
      const haloattn::Range k = haloattn::key_range(a, p, i / dilation, len);
      const haloattn::Range q = haloattn::query_range(a, p, i / dilation, len);
      std::printf("%d %d %d %d %d\n", i, k.lo, k.hi, q.lo, q.hi);
    }
  }
  return 0;
}
