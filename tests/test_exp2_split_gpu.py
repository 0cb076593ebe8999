"""exp2_split's inline PTX on a CUDA GPU: its values against float64, and the Triton forward with
each split against the float64 oracle (lazy rescaling's scores above a stale maximum, causal
axes, rows a mask leaves without a key). Run with ``pytest -m gpu``; tests/test_exp2_split.py
holds the host-side arithmetic to the same bounds on the CPU."""

from __future__ import annotations

import pytest
import torch

import oracle
from mods_check import sparse_rows

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = [gpu, needs_cuda]


def _exp2_split_on_gpu(x: torch.Tensor, every: int) -> torch.Tensor:
    import triton
    import triton.language as tl

    from haloattn.backends.triton.exp2_split import exp2_split

    @triton.jit
    def kernel(X, Y, C: tl.constexpr, EVERY: tl.constexpr):
        rows = tl.program_id(0) * 64 + tl.arange(0, 64)[:, None]
        offsets = rows * C + tl.arange(0, C)[None, :]
        tl.store(Y + offsets, exp2_split(tl.load(X + offsets), EVERY))

    y = torch.empty_like(x)
    kernel[(x.shape[0] // 64, )](x, y, C=x.shape[1], EVERY=every)
    return y


@pytest.mark.parametrize("every", [0, 2, 4])
def test_values_against_float64(every):
    from haloattn.backends.triton.exp2_split import MAX_RELATIVE_ERROR

    gen = torch.Generator().manual_seed(every)
    x = torch.rand(256, 128, generator=gen) * 134 - 126  # a tile's range under lazy rescaling
    got = _exp2_split_on_gpu(x.cuda(), every).cpu().double()
    exact = torch.exp2(x.double())
    relative = (got - exact).abs() / exact
    assert relative.max().item() <= MAX_RELATIVE_ERROR + 4 * 2.0**-24
    # the FMA pipe's share: the polynomial's error is well above ex2.approx's 2 ulp
    share = (relative > 2.0**-19).double().mean().item()
    assert (0.6 / every <= share <= 1.0 / every) if every else share == 0.0


@pytest.mark.parametrize("every", [2, 4])
def test_masked_and_maximal_scores_are_exact(every):
    x = torch.tensor([0.0, -float("inf"), -127.0, -1000.0]).repeat(64 * 32).reshape(64, 128)
    got = _exp2_split_on_gpu(x.cuda(), every).cpu()
    assert (got[:, 0::4] == 1.0).all() and (got[:, 1::4] == 0.0).all() and (got[:, 2::4] == 0.0).all()
    assert (got[:, 3::4] == 0.0).all() and not torch.signbit(got).any()


def _forward(q, k, v, window, every, lazy=False, **options):
    from haloattn.backend import AttentionInputs
    from haloattn.backends.triton import launch
    from haloattn.problem import build_problem

    problem = build_problem(q, k, v, window, **options)
    config = {"fwd": {"exp2_split": every, "lazy_rescale": lazy}}
    return launch.forward(problem, AttentionInputs(q, k, v), config)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("every", [0, 2, 4])
@pytest.mark.parametrize("lazy, spatial, window, options", [
    (False, (24, 30), (7, 9), {}), (True, (24, 30), (7, 9), {"causal": (True, False)}),
    (True, (700,), 129, {}), (False, (5, 12, 10), (3, 5, 5), {"dilation": (1, 2, 1)})])
def test_forward_against_the_oracle(dtype, head_dim, every, lazy, spatial, window, options):
    gen = torch.Generator().manual_seed(head_dim + every)
    # keys that grow along the grid make later tiles raise the row maxima (lazy: by up to 2^8)
    ramp = torch.linspace(0, 3, spatial[-1]).reshape(*([1] * len(spatial)), spatial[-1], 1, 1)
    q, k, v = (torch.randn(2, *spatial, 2, head_dim, generator=gen) * 2 + (ramp if i == 1 else 0)
               for i in range(3))
    out, lse = _forward(*(t.to(dtype).cuda() for t in (q, k, v)), window, every, lazy, **options)
    ref, ref_lse = oracle.attention(*(t.to(dtype).double() for t in (q, k, v)), window, **options)
    assert oracle.rel_error(out.cpu(), ref) <= oracle.TOLERANCE[dtype]
    assert (lse.cpu().double() - ref_lse).abs().max().item() <= oracle.LSE_TOLERANCE[dtype]


@pytest.mark.parametrize("every", [2, 4])
def test_rows_without_keys_stay_empty(every):
    gen = torch.Generator().manual_seed(every)
    q, k, v = (torch.randn(1, 16, 20, 3, 64, generator=gen).to(torch.bfloat16).cuda() for _ in range(3))
    out, lse = _forward(q, k, v, 7, every, mask_mod=sparse_rows)
    ref, ref_lse = oracle.attention(*(t.cpu().double() for t in (q, k, v)), 7, mask_mod=sparse_rows)
    empty = torch.isinf(ref_lse)
    assert empty.any()
    assert (lse.cpu()[empty] == -float("inf")).all() and (out.cpu()[empty] == 0).all()
    assert oracle.rel_error(out.cpu(), ref) <= oracle.TOLERANCE[torch.bfloat16]
