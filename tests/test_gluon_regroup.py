"""Dilated problems regrouped for the Gluon forward (backends/triton/gluon_regroup.py), on CPU: the
regrouped problem over views of the tensors is the same attention (float64 reference on both
sides, fresh random inputs), the views address the original memory, and the rule says which
problems have a regrouping. The Gluon kernel runs regrouped problems on the GPU
(test_gluon_forward_gpu.py)."""

import random

import pytest
import torch

import haloattn
from haloattn.backends.triton.gluon_regroup import regrouped
from haloattn.problem import build_problem


def _problem(q, k, window, **options):
    return build_problem(q, k, k, window, **options)


def _regrouped_attention(q, k, v, window, **options):
    """The regrouped problem's attention over views of q, k, v, mapped back to q's shape."""
    problem = _problem(q, k, window, **options)
    regrouping = regrouped(problem)
    axes = regrouping.problem.axes
    views = [regrouping.view(t) for t in (q, k, v)]
    out, lse = haloattn.attention(*views, tuple(a.window for a in axes), stride=tuple(a.stride for a in axes),
                                  causal=tuple(a.causal for a in axes), pattern=problem.pattern,
                                  shift=tuple(a.shift for a in axes), scale=problem.scale, return_lse=True,
                                  backend="reference")
    return out.reshape(*q.shape[:-1], out.shape[-1]), lse.reshape(q.shape[:-1])


def _random_dilated(rng: random.Random):
    """A random dilated problem with a regrouping: lengths multiples of their dilations."""
    rank = rng.choice((1, 2, 3))
    pattern = rng.choice(("neighborhood", "neighborhood", "window"))
    while True:
        dilation = [rng.choice((1, 2, 3)) for _ in range(rank)]
        if any(d > 1 for d in dilation) and sum(d > 1 for d in dilation[:-1]) + rank <= 3:
            break
    groups = [rng.randint(3, 9) for _ in range(rank)]
    spatial = [g * d for g, d in zip(groups, dilation)]
    window = [rng.randint(1 if pattern == "window" else 2, g) for g in groups]
    options = dict(dilation=tuple(dilation), causal=tuple(rng.random() < 0.3 for _ in spatial), pattern=pattern)
    if pattern == "window":
        options["shift"] = tuple(rng.randint(0, K - 1) for K in window)
    else:
        options["stride"] = tuple(rng.randint(1, K) for K in window)
    return spatial, tuple(window), options


@pytest.mark.parametrize("seed", range(10))
def test_regrouped_problem_is_the_same_attention(seed):
    rng = random.Random(seed)
    spatial, window, options = _random_dilated(rng)
    heads, kv_heads = rng.choice(((2, 2), (4, 2), (3, 1)))
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, *spatial, heads, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, *spatial, kv_heads, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    out, lse = haloattn.attention(q, k, v, window, return_lse=True, backend="reference", **options)
    regrouped_out, regrouped_lse = _regrouped_attention(q, k, v, window, **options)
    torch.testing.assert_close(regrouped_out, out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(regrouped_lse, lse, rtol=1e-12, atol=1e-12)


def test_views_address_the_original_tokens():
    q = torch.randn(1, 6, 8, 3, 4)  # axes dilated by 2 and 4
    problem = _problem(q, q, (3, 2), dilation=(2, 4))
    regrouping = regrouped(problem)
    assert regrouping.spatial == (3, 2, 2) and regrouping.problem.heads == 12
    view = regrouping.view(q)
    assert view.data_ptr() == q.data_ptr()
    for y0, g0, y1, g1, h in [(0, 0, 0, 0, 0), (2, 1, 1, 3, 2), (1, 0, 1, 2, 1)]:
        assert torch.equal(view[0, y0, g0, y1, g1 * 3 + h], q[0, y0 * 2 + g0, y1 * 4 + g1, h])


def test_problems_without_a_regrouping():
    q = torch.empty(1, 10, 12, 2, 8, device="meta")
    assert regrouped(_problem(q, q, 3, dilation=(3, 1))) is None  # 10 tokens, dilation 3
    q3 = torch.empty(1, 4, 6, 8, 2, 8, device="meta")
    assert regrouped(_problem(q3, q3, 2, dilation=(2, 1, 1))) is None  # a fourth axis
    undilated = _problem(q, q, 3)
    assert regrouped(undilated).problem is undilated


def test_last_axis_groups_need_heads_back_to_back():
    """Where the last axis' tokens are not laid out right before their heads, no view merges them:
    the launch then runs the Triton forward."""
    q = torch.randn(1, 8, 4, 6, 2).transpose(1, 2)  # [B, 4, 8, H, D] with the axes swapped in memory
    problem = _problem(q, q, 2, dilation=2)
    assert regrouped(problem).view(q) is None
