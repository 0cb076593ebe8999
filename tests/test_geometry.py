"""SEMANTICS.md section 3/4 worked examples, verbatim, and the geometry helpers against brute force.

Three independent readings of the pattern are compared: ``haloattn.geometry`` (what kernels mirror),
``tests/oracle.py`` (written from the contract's text) and the reference backend's actual
attention weights (scale=0 gives uniform weights over the attended keys, values = identity).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import haloattn
from haloattn.geometry import Axis, attends, key_range, query_range, relative_index, window_query_range

import oracle

# (L, K, S, Dl, causal) -> {query: keys} straight from SEMANTICS.md section 3.
WORKED = [
    ((8, 3, 1, 1, False), {0: [0, 1, 2], 1: [0, 1, 2], 2: [1, 2, 3], 7: [5, 6, 7]}),
    ((8, 4, 1, 1, False), {2: [0, 1, 2, 3], 3: [1, 2, 3, 4], 6: [4, 5, 6, 7]}),
    (
        (8, 4, 2, 1, False),
        {0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [1, 2, 3, 4], 3: [1, 2, 3, 4],
         4: [3, 4, 5, 6], 5: [3, 4, 5, 6], 6: [4, 5, 6, 7], 7: [4, 5, 6, 7]},
    ),
    (
        (10, 4, 4, 1, False),
        {**{q: [0, 1, 2, 3] for q in range(4)}, **{q: [4, 5, 6, 7] for q in range(4, 8)},
         8: [6, 7, 8, 9], 9: [6, 7, 8, 9]},
    ),
    ((10, 3, 1, 2, False), {0: [0, 2, 4], 1: [1, 3, 5], 8: [4, 6, 8], 9: [5, 7, 9]}),
    (
        (8, 4, 2, 1, True),
        {0: [0], 1: [0, 1], 2: [0, 1, 2], 3: [0, 1, 2, 3], 4: [2, 3, 4], 5: [2, 3, 4, 5],
         6: [4, 5, 6], 7: [4, 5, 6, 7]},
    ),
]


def _keys_geometry(axis: Axis, pattern: str, i: int):
    group, lo, hi = key_range(axis, pattern, i)
    return [y * axis.dilation + group for y in range(lo, hi)]


def _keys_reference(spatial, window, **kw):
    """The reference backend's attended keys per query: uniform weights (scale=0) times identity
    values reveal exactly which keys each query attended."""
    N = math.prod(spatial)
    q = torch.randn(1, *spatial, 1, 4, dtype=torch.float64)
    k = torch.randn(1, *spatial, 1, 4, dtype=torch.float64)
    v = torch.eye(N, dtype=torch.float64).reshape(1, *spatial, 1, N)
    out = haloattn.attention(q, k, v, window, scale=0.0, backend="reference", **kw)
    weights = out.reshape(N, N)
    return weights > 0, weights


@pytest.mark.parametrize("params,expected", WORKED, ids=lambda p: str(p) if isinstance(p, tuple) else "")
def test_worked_examples_1d(params, expected):
    L, K, S, Dl, causal = params
    axis = Axis(L, K, S, Dl, causal)
    mask = oracle.pattern_mask((L,), K, S, Dl, causal)
    ref_mask, weights = _keys_reference((L,), K, stride=S, dilation=Dl, causal=causal)
    for query, keys in expected.items():
        assert _keys_geometry(axis, "neighborhood", query) == keys, (params, query)
        assert mask[query].nonzero().flatten().tolist() == keys, (params, query)
        assert ref_mask[query].nonzero().flatten().tolist() == keys, (params, query)
        # uniform weights over exactly those keys
        torch.testing.assert_close(weights[query, keys], torch.full((len(keys),), 1 / len(keys), dtype=torch.float64))


def test_window_pattern_examples():
    # Swin windows of 4 on L=10 without shift: [0,4), [4,8), [8,10) (partial last window).
    axis = Axis(10, 4)
    assert [_keys_geometry(axis, "window", i) for i in (0, 3, 4, 9)] == [
        [0, 1, 2, 3], [0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    # shift 2: windows [0,2), [2,6), [6,10)
    axis = Axis(10, 4, shift=2)
    assert [_keys_geometry(axis, "window", i) for i in (0, 1, 2, 5, 6, 9)] == [
        [0, 1], [0, 1], [2, 3, 4, 5], [2, 3, 4, 5], [6, 7, 8, 9], [6, 7, 8, 9]]
    ref_mask, _ = _keys_reference((10,), 4, pattern="window", shift=2)
    assert torch.equal(ref_mask, oracle.pattern_mask((10,), 4, pattern="window", shift=2))
    assert ref_mask[5].nonzero().flatten().tolist() == [2, 3, 4, 5]
    # causal window
    axis = Axis(10, 4, causal=True, shift=2)
    assert _keys_geometry(axis, "window", 4) == [2, 3, 4]


def test_special_cases_full_and_blocked():
    # K == L everywhere, non-causal, stride 1: full self-attention.
    full, _ = _keys_reference((5, 6), (5, 6))
    assert full.all()
    # K == S with L divisible by K: blocked attention, equals pattern 'window'.
    blocked, _ = _keys_reference((8, 6), (4, 3), stride=(4, 3))
    window, _ = _keys_reference((8, 6), (4, 3), pattern="window")
    assert torch.equal(blocked, window)
    assert blocked.sum().item() == 48 * 12


def _cases(max_L=13):
    for L in range(1, max_L + 1):
        for Dl in range(1, L + 1):
            for K in range(1, L // Dl + 1):
                for S in range(1, K + 1):
                    for causal in (False, True):
                        yield Axis(L, K, S, Dl, causal)


def test_neighborhood_matches_oracle_and_sees_k_keys():
    count = 0
    for axis in _cases():
        L, K = axis.length, axis.window
        mask = oracle.pattern_mask((L,), K, axis.stride, axis.dilation, axis.causal)
        for i in range(L):
            keys = _keys_geometry(axis, "neighborhood", i)
            assert mask[i].nonzero().flatten().tolist() == keys, (axis, i)
            assert len(keys) <= K
            assert all(attends(axis, "neighborhood", i, j) == (j in keys) for j in range(L))
            if not axis.causal:
                assert len(keys) == K, (axis, i)  # windows shift inward, never shrink
            else:
                assert i in keys and max(keys) == i
            for j in keys:
                assert abs(j // axis.dilation - i // axis.dilation) <= K - 1
                r = relative_index(axis, i, j)
                assert 0 <= r <= 2 * K - 2
            count += 1
    assert count > 1000


def test_tensor_and_int_geometry_agree():
    for axis in _cases(9):
        i = torch.arange(axis.length)
        for pattern in ("neighborhood", "window"):
            if pattern == "window" and axis.stride != 1:
                continue
            g, lo, hi = key_range(axis, pattern, i)
            for c in range(axis.length):
                assert (g[c].item(), lo[c].item(), hi[c].item()) == key_range(axis, pattern, c)


def test_inverse_rule_matches_brute_force():
    checked = 0
    for axis in _cases(16):
        Dl = axis.dilation
        for g in range(min(Dl, axis.length)):
            Lg = axis.group_length(g)
            sees = {}
            for x in range(Lg):
                _, lo, hi = key_range(axis, "neighborhood", x * Dl + g)
                for y in range(lo, hi):
                    sees.setdefault(y, []).append(x)
            for y in range(Lg):
                qs = sees.get(y, [])
                qstart, qend = query_range(axis, y, Lg)
                assert qs == list(range(qstart, qend)), (axis, g, y, qs, (qstart, qend))
                # tensor form agrees
                t0, t1 = query_range(axis, torch.tensor([y]), Lg)
                assert (int(t0), int(t1)) == (qstart, qend)
                checked += 1
    assert checked > 5000


def test_window_inverse_rule_matches_brute_force():
    checked = 0
    for L in range(1, 14):
        for Dl in range(1, L + 1):
            for W in range(1, L // Dl + 1):
                for s in range(W):
                    for causal in (False, True):
                        axis = Axis(L, W, 1, Dl, causal, s)
                        for g in range(Dl):
                            Lg = axis.group_length(g)
                            for y in range(Lg):
                                qs = [x for x in range(Lg)
                                      if y in range(*key_range(axis, "window", x * Dl + g)[1:])]
                                lo, hi = window_query_range(axis, y, Lg)
                                assert qs == list(range(lo, hi)), (axis, g, y)
                                checked += 1
    assert checked > 1000


def test_window_matches_oracle_nd():
    for spatial, W, s, Dl, causal in [
        ((7, 9), (3, 4), (1, 2), (1, 2), (False, True)),
        ((4, 5, 6), (2, 2, 3), (1, 0, 2), (2, 1, 1), (True, False, False)),
        ((12,), 5, 3, 2, False),
    ]:
        mask, _ = _keys_reference(spatial, W, pattern="window", shift=s, dilation=Dl, causal=causal)
        assert torch.equal(mask, oracle.pattern_mask(spatial, W, 1, Dl, causal, "window", s))


def test_neighborhood_nd_is_and_of_axes():
    spatial, K, S, Dl, C = (6, 7, 5), (3, 4, 2), (2, 1, 2), (2, 1, 1), (False, True, False)
    mask, _ = _keys_reference(spatial, K, stride=S, dilation=Dl, causal=C)
    expect = oracle.pattern_mask(spatial, K, S, Dl, C)
    assert torch.equal(mask, expect)
    coords = list(itertools.product(*(range(L) for L in spatial)))
    axes = [Axis(L, k, s, d, c) for L, k, s, d, c in zip(spatial, K, S, Dl, C)]
    for qi in (0, 37, len(coords) - 1):
        for ki, kc in enumerate(coords):
            assert bool(mask[qi, ki]) == all(attends(ax, "neighborhood", coords[qi][a], kc[a]) for a, ax in enumerate(axes))
