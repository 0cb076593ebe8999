"""The window index math of SEMANTICS.md, one axis at a time.

Every pattern reduces, per axis, to the same shape: query coordinate ``i`` sees the keys
``base(i) + p`` (in dilation-group units) for ``p < count(i)``, with ``count(i) <= K``. Backends
gather or tile with that description; kernels mirror these formulas and the tests check them
against brute force. All functions accept Python ints or integer torch tensors (elementwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Axis:
    """One spatial axis of a problem: its length and the per-axis attention parameters."""

    length: int
    window: int
    stride: int = 1
    dilation: int = 1
    causal: bool = False
    shift: int = 0

    def group_length(self, group):
        """Tokens in dilation group ``group`` (``L_g = ceil((L - g) / Dl)``)."""
        return (self.length - group + self.dilation - 1) // self.dilation


def _minimum(a, b):
    return torch.minimum(a, torch.as_tensor(b, device=a.device)) if torch.is_tensor(a) else min(a, b)


def _maximum(a, b):
    return torch.maximum(a, torch.as_tensor(b, device=a.device)) if torch.is_tensor(a) else max(a, b)


def neighborhood_range(axis: Axis, x, group_len):
    """Keys ``[lo, hi)`` (group units) that group coordinate ``x`` sees, pattern "neighborhood"."""
    K, S = axis.window, axis.stride
    if axis.causal:
        leader = _minimum((x // S) * S + S - 1, group_len - 1)
        return _maximum(leader - K + 1, 0), x + 1
    leader = _minimum((x // S) * S + S // 2, group_len - 1)
    start = _minimum(_maximum(leader - K // 2, 0), group_len - K)
    return start, start + K


def window_range(axis: Axis, x, group_len):
    """Keys ``[lo, hi)`` (group units) in the Swin window that holds ``x``, pattern "window"."""
    W, s = axis.window, axis.shift
    if s > 0:
        raw_start = ((x + W - s) // W) * W - (W - s)
    else:
        raw_start = (x // W) * W
    lo = _maximum(raw_start, 0)
    hi = _minimum(raw_start + W, group_len)
    if axis.causal:
        hi = _minimum(hi, x + 1)
    return lo, hi


def key_range(axis: Axis, pattern: str, i):
    """For query coordinate ``i`` return ``(group, lo, hi)``: the keys it sees on this axis are
    the coordinates ``y * dilation + group`` for ``lo <= y < hi`` (at most ``window`` of them)."""
    group = i % axis.dilation
    x = i // axis.dilation
    group_len = axis.group_length(group)
    if pattern == "window":
        lo, hi = window_range(axis, x, group_len)
    else:
        lo, hi = neighborhood_range(axis, x, group_len)
    return group, lo, hi


def attends(axis: Axis, pattern: str, i, j):
    """True where query coordinate ``i`` sees key coordinate ``j`` on this axis."""
    group, lo, hi = key_range(axis, pattern, i)
    y = j // axis.dilation
    return (j % axis.dilation == group) & (lo <= y) & (y < hi)


def query_range(axis: Axis, y, group_len):
    """Inverse rule, pattern "neighborhood": queries ``[qstart, qend)`` (group units) that see key
    ``y``. Exact; kernels use it to walk KV-major in the backward pass."""
    K, S = axis.window, axis.stride
    if torch.is_tensor(y):
        where = torch.where
    else:
        def where(c, a, b):
            return a if c else b
    if axis.causal:
        overflow = where(y + K >= group_len, 1, 0)
        return y, _minimum(((y + K) // S + overflow) * S, group_len)
    left, right, off = K // 2, K // 2 + K % 2 - 1, S - S // 2 - 1
    qstart = where(y >= K, ((y - right + off) // S) * S, 0)
    qend = where(y >= group_len - K, group_len, ((y + left + off + 1) // S) * S)
    return qstart, qend


def window_query_range(axis: Axis, y, group_len):
    """Inverse rule, pattern "window": the queries sharing key ``y``'s window (causal keeps
    only queries at or after ``y``)."""
    lo, hi = window_range(Axis(axis.length, axis.window, shift=axis.shift), y, group_len)
    if axis.causal:
        lo = y
    return lo, hi


def relative_index(axis: Axis, i, j):
    """Relative-position-bias index on this axis: key minus query in group units, plus K - 1."""
    return j // axis.dilation - i // axis.dilation + axis.window - 1


def unravel(flat, shape):
    """Row-major coordinates of flat token indices (last axis fastest)."""
    coords = []
    for extent in reversed(shape):
        coords.append(flat % extent)
        flat = flat // extent
    return tuple(reversed(coords))


def ravel(coords, shape):
    """Flat row-major index of per-axis coordinates."""
    flat = 0
    for c, extent in zip(coords, shape):
        flat = flat * extent + c
    return flat


def axis_pairs(axis: Axis, pattern: str) -> int:
    """Attended (query, key) pairs on one axis: the sum of every coordinate's key count."""
    coords = torch.arange(axis.length)
    _, lo, hi = key_range(axis, pattern, coords)
    return int((hi - lo).clamp(min=0).sum())


def attended_pairs(axes, pattern: str) -> int:
    """Attended pairs of the whole grid (per batch and head). The N-D pattern is the AND of the
    per-axis ones, so the count factorises over axes."""
    total = 1
    for axis in axes:
        total *= axis_pairs(axis, pattern)
    return total
