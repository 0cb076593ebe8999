// Reads one problem of the host programs' stdin format: "pattern" (0 neighbourhood, 1 window),
// then per axis of the padded rank-3 grid "length window stride dilation causal shift".
// Shared by tests/cuda_host/tiling_check.cu and benchmarks/host/hopper_work.cu.
#pragma once

#include <cstdio>

#include "attention_params.h"

namespace haloattn {

// False at the end of the input.
inline bool read_problem(AttentionParams& p) {
  int pattern;
  if (std::scanf("%d", &pattern) != 1) return false;
  p = AttentionParams{};
  p.pattern = static_cast<Pattern>(pattern);
  for (int a = 0; a < kMaxRank; ++a) {
    AxisParams& x = p.axis[a];
    if (std::scanf("%d %d %d %d %d %d", &x.length, &x.window, &x.stride, &x.dilation, &x.causal, &x.shift) != 6)
      return false;
    x = with_divisors(x);
  }
  return true;
}

}  // namespace haloattn
