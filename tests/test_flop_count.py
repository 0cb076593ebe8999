"""Calls that something watches or that carry no data: meta tensors give shapes (and gradients'
shapes), FakeTensorMode gives fake outputs, and FlopCounterMode counts each call's attended pairs
(counted here from the oracle's dense mask) while the outputs stay those of an unwatched call."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import haloattn
from oracle import pattern_mask

pytestmark = pytest.mark.usefixtures("plain_cpu_environment")

# (spatial, window, options, heads, kv heads, D, D_v, additional tokens)
CASES = [
    ((11,), 5, dict(causal=True, dilation=2), 4, 2, 8, 8, 0),
    ((7, 9), (3, 5), dict(stride=(1, 2)), 2, 1, 8, 12, 3),
    ((4, 5, 6), 3, dict(pattern="window", shift=1), 3, 3, 4, 4, 0),
]


def _inputs(spatial, heads, kv_heads, dim, value_dim, extra, device="cpu", grad=False):
    g = torch.Generator().manual_seed(sum(spatial) + heads + dim + extra)
    shape = (2, *spatial)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(device).requires_grad_(grad)  # noqa: E731
    q, k, v = make(*shape, heads, dim), make(*shape, kv_heads, dim), make(*shape, kv_heads, value_dim)
    ak = av = None
    if extra:
        ak, av = make(2, extra, kv_heads, dim), make(2, extra, kv_heads, value_dim)
    return q, k, v, ak, av


def _expected_flops(spatial, window, options, heads, dim, value_dim, extra):
    """Pairs counted from the dense mask (and every query's additional tokens), 2(D + D_v) a pair
    forward, 2(3D + 2D_v) backward, over batch 2 and every head."""
    mask = pattern_mask(spatial, window, **options)
    pairs = 2 * heads * (int(mask.sum()) + mask.shape[0] * extra)
    return pairs * 2 * (dim + value_dim), pairs * 2 * (3 * dim + 2 * value_dim)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"rank{len(c[0])}")
def test_flop_counter_counts_attended_pairs_and_outputs_are_unchanged(case):
    spatial, window, options, heads, kv_heads, dim, value_dim, extra = case
    q, k, v, ak, av = _inputs(spatial, heads, kv_heads, dim, value_dim, extra, grad=True)
    call = lambda: haloattn.attention(q, k, v, window, additional_keys=ak, additional_values=av,  # noqa: E731
                                      return_lse=True, **options)
    out, lse = call()
    grads = torch.autograd.grad(out.sum() + lse.sum(), (q, k, v))
    with FlopCounterMode(display=False) as counter:
        watched_out, watched_lse = call()
        watched_grads = torch.autograd.grad(watched_out.sum() + watched_lse.sum(), (q, k, v))
    counts = counter.get_flop_counts()["Global"]
    forward, backward = _expected_flops(spatial, window, options, heads, dim, value_dim, extra)
    assert counts[torch.ops.haloattn.attention] == forward
    assert counts[torch.ops.haloattn.attention_backward] == backward
    torch.testing.assert_close(watched_out, out, rtol=0, atol=0)
    torch.testing.assert_close(watched_lse, lse, rtol=0, atol=0)
    for watched, plain in zip(watched_grads, grads):
        torch.testing.assert_close(watched, plain, rtol=0, atol=0)


def test_meta_tensors_give_shapes_gradient_shapes_and_flops():
    spatial, window, options, heads, kv_heads, dim, value_dim, extra = CASES[1]
    q, k, v, ak, av = _inputs(spatial, heads, kv_heads, dim, value_dim, extra, device="meta", grad=True)
    with FlopCounterMode(display=False) as counter:
        out, lse = haloattn.attention(q, k, v, window, additional_keys=ak, additional_values=av, return_lse=True,
                                      **options)
    assert out.is_meta and out.shape == (2, *spatial, heads, value_dim) and out.dtype == torch.float64
    assert lse.is_meta and lse.shape == (2, *spatial, heads) and lse.dtype == torch.float64
    (out.sum() + lse.sum()).backward()
    assert [t.grad.shape for t in (q, k, v, ak, av)] == [t.shape for t in (q, k, v, ak, av)]
    forward, _ = _expected_flops(spatial, window, options, heads, dim, value_dim, extra)
    assert counter.get_total_flops() == forward


def test_meta_tensors_are_validated_like_real_ones():
    q = torch.empty(1, 6, 7, 2, 8, device="meta")
    with pytest.raises(ValueError, match="window 9 x dilation 1 = 9 on axis 0 exceeds the axis length 6"):
        haloattn.attention(q, q, q, 9)
    with pytest.raises(ValueError, match="stride on axis 1 is 4"):
        haloattn.attention(q, q, q, 3, stride=(1, 4))


def test_fake_tensor_mode_gives_fake_outputs():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        q = torch.randn(2, 6, 7, 4, 8)
        kv = torch.randn(2, 6, 7, 2, 8)
        out, lse = haloattn.attention(q, kv, kv, (3, 5), return_lse=True)
    assert isinstance(out, FakeTensor) and out.shape == (2, 6, 7, 4, 8)
    assert isinstance(lse, FakeTensor) and lse.shape == (2, 6, 7, 4) and lse.dtype == torch.float32


def test_selective_activation_checkpointing_saves_the_op():
    """Selective activation checkpointing runs its policy in a dispatch mode: the call reaches it
    as one op, which a policy can save (as torch's own SDPA), and the gradients are unchanged."""
    import functools

    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    seen = []

    def policy(ctx, op, *args, **kwargs):
        seen.append(op)
        return CheckpointPolicy.MUST_SAVE if op == torch.ops.haloattn.attention.default else CheckpointPolicy.PREFER_RECOMPUTE

    gen = torch.Generator().manual_seed(5)
    projection = torch.nn.Linear(16, 48, dtype=torch.float64)
    x = torch.randn(2, 6, 7, 16, generator=gen, dtype=torch.float64, requires_grad=True)

    def block(x):
        q, k, v = projection(x).reshape(*x.shape[:-1], 3, 2, 8).unbind(-3)
        return (haloattn.attention(q, k, v, (3, 5), dilation=(2, 1)) ** 2).sum()

    plain = torch.autograd.grad(block(x), (x, projection.weight))
    context = functools.partial(create_selective_checkpoint_contexts, policy)
    checkpointed = torch.autograd.grad(checkpoint(block, x, use_reentrant=False, context_fn=context),
                                       (x, projection.weight))
    assert torch.ops.haloattn.attention.default in seen
    for a, b in zip(checkpointed, plain):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
