"""The core's eager paths on a GPU (pytest -m gpu): gradients taken with create_graph=True through
the fused triton backend, torch.autocast on CUDA, and torch.jit.trace of a CUDA call. Each is
checked against the same call made the plain way, or against the float64 oracle."""

from __future__ import annotations

import pytest
import torch

import haloattn
from haloattn.dispatch import SlowPathWarning

import oracle

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def randn(seed, *shape, dtype=torch.bfloat16):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=gen).to(dtype).requires_grad_()


def test_triton_gradients_under_create_graph_are_exact_and_refuse_a_second_derivative():
    q, k, v = (randn(s, 2, 24, 20, 4, 64) for s in range(3))
    assert haloattn.explain(q, k, v, (5, 7), verbose=False).chosen == "triton"
    grad = randn(3, 2, 24, 20, 4, 64).detach()
    plain = torch.autograd.grad(haloattn.attention(q, k, v, (5, 7)), (q, k, v), grad)
    graphed = torch.autograd.grad(haloattn.attention(q, k, v, (5, 7)), (q, k, v), grad, create_graph=True)
    assert all(g.requires_grad and torch.equal(g, p) for g, p in zip(graphed, plain))
    with pytest.raises(RuntimeError, match="backend 'triton'.*backend='reference'"):
        torch.autograd.grad(graphed[0].float().pow(2).sum(), (q, k, v))


def test_reference_second_derivatives_on_cuda_match_the_oracle():
    cuda = [randn(s, 1, 9, 8, 2, 8, dtype=torch.float64) for s in range(3)]
    cpu = [t.detach().cpu().requires_grad_() for t in cuda]  # the oracle builds its masks on the CPU

    def hvp(attend, inputs):
        grads = torch.autograd.grad(attend(*inputs).pow(2).sum(), inputs, create_graph=True)
        return [g.cpu() for g in (*grads, *torch.autograd.grad(sum(g.sin().sum() for g in grads), inputs))]

    got = hvp(lambda q, k, v: haloattn.attention(q, k, v, 3, dilation=(1, 2), backend="reference"), cuda)
    ref = hvp(lambda q, k, v: oracle.attention(q, k, v, 3, dilation=(1, 2))[0], cpu)
    for a, b in zip(got, ref):
        assert oracle.rel_error(a, b) <= oracle.TOLERANCE[torch.float64]


def test_cuda_autocast_runs_a_float32_query_in_bfloat16_on_triton():
    q = randn(4, 2, 16, 16, 4, 64, dtype=torch.float32)
    k, v = randn(5, 2, 16, 16, 4, 64), randn(6, 2, 16, 16, 4, 64)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = haloattn.attention(q, k, v, 7)
    explicit = haloattn.attention(q.detach().bfloat16(), k, v, 7)
    assert out.dtype == torch.bfloat16 and torch.equal(out, explicit)
    assert haloattn.explain(q.detach().bfloat16(), k, v, 7, verbose=False).chosen == "triton"


def test_trace_of_a_cuda_call_warns_and_computes_the_contract():
    q, k, v = (randn(7 + s, 1, 12, 10, 2, 32, dtype=torch.float32).detach() for s in range(3))
    with pytest.warns(SlowPathWarning, match="traced"):
        traced = torch.jit.trace(lambda q, k, v: haloattn.attention(q, k, v, (3, 5), causal=(True, False)), (q, k, v))
    fresh = [randn(20 + s, 1, 12, 10, 2, 32, dtype=torch.float32).detach() for s in range(3)]
    ref, _ = oracle.attention(*(t.cpu() for t in fresh), (3, 5), causal=(True, False))
    assert oracle.rel_error(traced(*fresh).cpu(), ref) <= oracle.TOLERANCE[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("options", [dict(causal=True), dict(dilation=2, stride=3), dict(pattern="window", shift=3)])
def test_key_query_convolution_on_cuda_matches_the_oracle(dtype, options):
    """kq_conv on the reference backend's tiles (forced: on CUDA the dispatcher picks triton's fused
    kernels, tests/test_triton_kq_conv_gpu.py); off CPUs its grouped conv2d gives every plane a
    channel of its own, so CUDA takes PyTorch's depthwise kernel (exact float32 products) rather
    than cuDNN's TF32. Output and every gradient, kernel included, against the float64 oracle on
    the CPU."""
    L, K, H, Hkv, D = 75, 12, 4, 2, 16
    q, k, v = randn(31, 2, L, H, D, dtype=dtype), randn(32, 2, L, Hkv, D, dtype=dtype), randn(33, 2, L, Hkv, D, dtype=dtype)
    conv = (0.5 * randn(34, H, 4, 7, dtype=torch.float64)).detach().to(dtype).requires_grad_()
    kw = dict(options, kq_conv=conv, softcap=8.0)
    out = haloattn.attention(q, k, v, K, backend="reference", **kw)
    grad = randn(35, *out.shape, dtype=dtype).detach()
    got = [out, *torch.autograd.grad(out, (q, k, v, conv), grad)]
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v, conv)]
    ref_out, _ = oracle.attention(*leaves[:3], K, **dict(options, kq_conv=leaves[3], softcap=8.0))
    ref = [ref_out, *torch.autograd.grad(ref_out, leaves, grad.cpu().double())]
    # bfloat16 gradients pass through bfloat16 scores: the output's tolerance, doubled
    tolerance = oracle.TOLERANCE[dtype] * (2 if dtype == torch.bfloat16 else 1)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dconv"), got, ref):
        assert oracle.rel_error(a.cpu(), b) <= tolerance, name
