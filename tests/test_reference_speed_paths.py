"""The reference backend's fast paths (backends/reference/tiled.py) against the float64 oracle:
several compute steps per block, chosen and forced tile shapes, the explicit backward (with and
without the forward's out/lse), the pattern mask applied as a factor after a clamped exp."""

from __future__ import annotations

import math

import pytest
import torch

import haloattn
from haloattn.backend import AttentionInputs
from haloattn.backends.reference import attend, blocks, tiled
from haloattn.problem import build_problem

import oracle

pytestmark = pytest.mark.usefixtures("plain_cpu_environment")


def _grads(out, lse, leaves, go, gl):
    return torch.autograd.grad((out.double() * go).sum() + (lse.double() * gl).sum(), leaves)


CASES = {
    "2d_gqa_rpb_softcap_extra": dict(spatial=(9, 11), window=(5, 3), heads=4, kv_heads=2, rpb=True, extra=2,
                                     kw=dict(softcap=3.0, dilation=(1, 2))),
    "1d_causal_stride": dict(spatial=(37,), window=9, kw=dict(causal=True, stride=2)),
    "3d_window_shift": dict(spatial=(4, 6, 5), window=(2, 3, 4), rpb=True, kw=dict(pattern="window", shift=(1, 2, 3))),
    "2d_score_mod_mask_mod": dict(
        spatial=(7, 8), window=3, extra=1,
        kw=dict(score_mod=lambda s, b, h, qi, ki: s - 0.1 * h + 0.01 * (qi - ki).float(),
                mask_mod=lambda b, h, qi, ki: (qi + ki + h) % 4 != 0),
    ),
}


def _inputs(case, dtype, B=2, D=8, Dv=6):
    g = torch.Generator().manual_seed(3)
    H, Hkv = case.get("heads", 2), case.get("kv_heads", 2)
    sp, window = case["spatial"], case["window"]
    Ks = window if isinstance(window, tuple) else (window,) * len(sp)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)

    q, k, v = rnd(B, *sp, H, D), rnd(B, *sp, Hkv, D), rnd(B, *sp, Hkv, Dv)
    kw = dict(case["kw"])
    if case.get("rpb"):
        kw["rpb"] = rnd(H, *(2 * K - 1 for K in Ks))
    if case.get("extra"):
        kw["additional_keys"] = rnd(B, case["extra"], Hkv, D)
        kw["additional_values"] = rnd(B, case["extra"], Hkv, Dv)
    return (q, k, v), kw


@pytest.mark.parametrize("step_bytes", [1, 4096, 2**20])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(CASES))
def test_steps_match_oracle(monkeypatch, name, dtype, step_bytes):
    monkeypatch.setattr(tiled, "STEP_BYTES", step_bytes)
    case = CASES[name]
    (q, k, v), kw = _inputs(case, dtype)
    out, lse = haloattn.attention(q, k, v, case["window"], return_lse=True, backend="reference", **kw)
    ref_out, ref_lse = oracle.attention(q, k, v, case["window"], **kw)
    tol = 1e-10 if dtype == torch.float64 else oracle.TOLERANCE[dtype]
    assert oracle.rel_error(out, ref_out) <= tol
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse.double()[finite] - ref_lse[finite]).abs().max() <= (1e-10 if dtype == torch.float64 else 1e-4)
    leaves = [q, k, v] + [t for t in kw.values() if torch.is_tensor(t)]
    go = torch.randn(out.shape, dtype=torch.float64)
    gl = torch.randn(lse.shape, dtype=torch.float64).masked_fill(~finite, 0.0)
    got = _grads(out, lse.masked_fill(~torch.isfinite(lse), 0.0), leaves, go, gl)
    want = _grads(ref_out, ref_lse.masked_fill(~finite, 0.0), leaves, go, gl)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        assert oracle.rel_error(a, b) <= tol


@pytest.mark.parametrize("edges", [(1, 1), (2, 8), (5, 3), (16, 16)])
def test_forced_tile_shapes(monkeypatch, edges):
    monkeypatch.setattr(blocks, "tile_edges", lambda problem: list(edges))
    case = CASES["2d_gqa_rpb_softcap_extra"]
    (q, k, v), kw = _inputs(case, torch.float64)
    out, lse = haloattn.attention(q, k, v, case["window"], return_lse=True, backend="reference", **kw)
    ref_out, ref_lse = oracle.attention(q, k, v, case["window"], **kw)
    assert oracle.rel_error(out, ref_out) <= 1e-10
    leaves = [q, k, v, kw["rpb"], kw["additional_keys"], kw["additional_values"]]
    go, gl = torch.randn(out.shape, dtype=torch.float64), torch.randn(lse.shape, dtype=torch.float64)
    for a, b in zip(_grads(out, lse, leaves, go, gl), _grads(ref_out, ref_lse, leaves, go, gl)):
        assert oracle.rel_error(a, b) <= 1e-10


def test_chosen_tiles():
    """The cost model's picks for the benchmarked shapes (benchmarks/bench_reference_cpu.py)."""
    def edges(spatial, window, **kw):
        q = torch.zeros(1, *spatial, 4, 8)
        return blocks.tile_edges(build_problem(q, q, q, window, **kw))

    assert edges((64, 64), 7) == [4, 4]
    assert edges((4096,), 127) == [32]
    assert edges((56, 56), 7, pattern="window") == [7, 7]
    assert all(1 <= e <= blocks.MAX_EDGE for e in edges((8, 16, 16), (3, 5, 5)))


def test_minus_inf_rpb_and_far_masked_scores():
    """Kept pairs with a -inf bias get weight exactly 0 (a row with only those is empty); masked
    pairs with huge scores never leak (the pattern mask is a factor after a clamped exp)."""
    L, K = 12, 3
    q, k, v = (torch.randn(1, L, 1, 4, dtype=torch.float64) for _ in range(3))
    k[0, ::4] *= 1e3  # huge scores on some keys, masked for most queries
    rpb = torch.zeros(1, 2 * K - 1, dtype=torch.float64)
    rpb[0, K - 1] = -math.inf  # a query never attends itself
    out, lse = haloattn.attention(q, k, v, K, rpb=rpb, return_lse=True, backend="reference")
    ref_out, ref_lse = oracle.attention(q, k, v, K, rpb=rpb)
    assert torch.isfinite(out).all()
    assert oracle.rel_error(out, ref_out) <= 1e-10
    assert (lse - ref_lse).abs().max() <= 1e-9


def test_backward_without_forward_results():
    """attend.backward recomputes out/lse when a caller (an older plugin) does not pass them."""
    case = CASES["1d_causal_stride"]
    (q, k, v), kw = _inputs(case, torch.float64)
    problem = build_problem(q, k, v, case["window"], **kw)
    inputs = AttentionInputs(q.detach(), k.detach(), v.detach())
    out, lse = attend.forward(problem, inputs)
    go = torch.randn_like(out)
    needs = (True, True, True, False, False, False, False)
    with_results = attend.backward(problem, inputs, go, None, needs, out=out, lse=lse)
    without = attend.backward(problem, inputs, go, None, needs)
    for a, b in zip(with_results, without):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("total_gib,expected", [(139, 2**30), (16, 2**29), (4, attend.CHUNK_BYTES)])
def test_blocks_are_larger_on_cuda_devices(monkeypatch, total_gib, expected):
    """On CUDA devices the block bound is GPU_CHUNK_BYTES, at most a GPU_MEMORY_SHARE-th of the
    device's memory and never below the CPU's CHUNK_BYTES (blocks there are launched op by op from
    the host); elsewhere CHUNK_BYTES."""
    class Properties:
        total_memory = total_gib * 2**30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties())
    assert attend.chunk_bytes(torch.device("cuda", 0)) == expected
    assert attend.chunk_bytes(torch.device("cpu")) == attend.chunk_bytes("meta") == attend.CHUNK_BYTES
