// Per-axis index rules of SEMANTICS.md sections 3 and 4, in dilation-group units; a device
// mirror of core/haloattn/geometry.py (key_range and the inverse rule query_range).
#pragma once

#include "attention_params.h"

namespace haloattn {

struct Range {
  int lo;
  int hi;  // exclusive
};

__host__ __device__ inline int group_length(const AxisParams& a, int group) {
  return a.by_dilation.ceil_div(a.length - group);
}

// Keys [lo, hi) that query x sees. Both ends are non-decreasing in x, so the keys of a run of
// queries [x0, x1] lie in [range(x0).lo, range(x1).hi): the box a query tile loads.
__host__ __device__ inline Range key_range(const AxisParams& a, Pattern pattern, int x, int group_len) {
  const int K = a.window;
  if (pattern == Pattern::kWindow) {
    const int s = a.shift;
    const int raw_start = s > 0 ? a.by_window.div(x + K - s) * K - (K - s) : a.by_window.div(x) * K;
    int hi = min(raw_start + K, group_len);
    if (a.causal) hi = min(hi, x + 1);
    return {max(raw_start, 0), hi};
  }
  const int S = a.stride;
  if (a.causal) {
    const int leader = min(a.by_stride.div(x) * S + S - 1, group_len - 1);
    return {max(leader - K + 1, 0), x + 1};
  }
  const int leader = min(a.by_stride.div(x) * S + S / 2, group_len - 1);
  const int start = min(max(leader - K / 2, 0), group_len - K);
  return {start, start + K};
}

// Inverse rule: queries [lo, hi) that see key y. Non-decreasing in y like key_range, so a key
// tile's queries lie in one box too (the KV-major backward walks it).
__host__ __device__ inline Range query_range(const AxisParams& a, Pattern pattern, int y, int group_len) {
  const int K = a.window;
  if (pattern == Pattern::kWindow) {
    AxisParams plain = a;
    plain.causal = 0;
    Range r = key_range(plain, pattern, y, group_len);
    if (a.causal) r.lo = y;
    return r;
  }
  const int S = a.stride;
  if (a.causal) {
    const int overflow = y + K >= group_len ? 1 : 0;
    return {y, min((a.by_stride.div(y + K) + overflow) * S, group_len)};
  }
  const int left = K / 2, right = K / 2 + K % 2 - 1, off = S - S / 2 - 1;
  const int lo = y >= K ? a.by_stride.div(y - right + off) * S : 0;
  const int hi = y >= group_len - K ? group_len : min(a.by_stride.div(y + left + off + 1) * S, group_len);
  return {lo, hi};
}

}  // namespace haloattn
