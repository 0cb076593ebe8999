"""Backend ``cuda`` (haloattn_cuda._C) on a Hopper GPU, against the float64 oracle.

Random problems across ranks, both patterns, per-axis window / stride / dilation / causal / shift,
GQA/MQA, float16 / bfloat16, head_dim 64 and 128, with the LSE and its gradient; larger grids
(several tiles and key chunks per CTA) against the reference backend; each forward and each
backward kernel (portable, Hopper) forced in turn; a bitwise-repeatable backward. Run with
``pytest -m gpu``; skipped where the backend cannot run.
"""

import os
import random

import pytest
import torch

import haloattn
import oracle
from large_offsets import check_past_int32_offsets
from haloattn.dispatch import DISPATCHER

pytestmark = pytest.mark.gpu


def _cuda_reasons():
    if not torch.cuda.is_available():
        return ["no CUDA device"]
    DISPATCHER.ensure_loaded()
    backend = DISPATCHER.get("cuda")
    reasons = backend.available()
    if not reasons and torch.cuda.get_device_capability() != (9, 0):
        reasons = ["the cuda backend is built for Hopper (9.0)"]
    return reasons


requires_cuda_backend = pytest.mark.skipif(bool(_cuda_reasons()), reason="; ".join(_cuda_reasons()))


def _inputs(spatial, heads, kv_heads, head_dim, dtype, batch, gen):
    def leaf(h):
        t = torch.randn(batch, *spatial, h, head_dim, generator=gen).to(dtype).cuda()
        return t.requires_grad_(True)

    return leaf(heads), leaf(kv_heads), leaf(kv_heads)


def _run(backend, q, k, v, window, grad_out, grad_lse, options):
    out, lse = haloattn.attention(q, k, v, window, return_lse=True, backend=backend, **options)
    grads = torch.autograd.grad((out.float() * grad_out.float()).sum() + (lse * grad_lse).sum(), [q, k, v])
    return out, lse, grads


def check_problem(spatial, window, *, dtype=torch.bfloat16, heads=2, kv_heads=None, head_dim=64, batch=1,
                  against="oracle", seed=0, **options):
    """Fresh random inputs -> backend ``cuda`` and the oracle (or the reference backend on grids
    too large for the quadratic oracle); compares out, LSE and dq/dk/dv at SEMANTICS.md's tolerances."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _inputs(spatial, heads, kv_heads or heads, head_dim, dtype, batch, gen)
    grad_out = torch.randn(*q.shape, generator=gen).to(dtype).cuda()
    grad_lse = torch.randn(*q.shape[:-1], generator=gen).cuda()
    out, lse, grads = _run("cuda", q, k, v, window, grad_out, grad_lse, options)

    if against == "oracle":
        ref = [t.detach().cpu().double().requires_grad_(True) for t in (q, k, v)]
        ref_out, ref_lse = oracle.attention(*ref, window, **options)
        ref_grads = torch.autograd.grad(
            (ref_out * grad_out.cpu().double()).sum() + (ref_lse * grad_lse.cpu().double()).sum(), ref
        )
    else:
        ref = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
        ref_out, ref_lse, ref_grads = _run("reference", *ref, window, grad_out.float(), grad_lse, options)

    tol = oracle.TOLERANCE[dtype]
    errors = {"out": oracle.rel_error(out.cpu(), ref_out.cpu())}
    for name, g, rg in zip(("dq", "dk", "dv"), grads, ref_grads):
        errors[name] = oracle.rel_error(g.cpu(), rg.cpu())
    bad = {n: e for n, e in errors.items() if not e <= tol}
    lse_err = (lse.cpu().double() - ref_lse.cpu().double()).abs().max().item()
    assert not bad, f"relative errors above {tol}: {bad} (all: {errors})"
    assert lse_err <= oracle.LSE_TOLERANCE[dtype], f"lse max abs error {lse_err}"


def random_problem(rng: random.Random):
    rank = rng.choice((1, 2, 3))
    pattern = rng.choice(("neighborhood", "neighborhood", "window"))
    limits = {1: 150, 2: 14, 3: 7}[rank]
    spatial, window, stride, dilation, causal, shift = [], [], [], [], [], []
    for _ in range(rank):
        L = rng.randint(3, limits)
        Dl = rng.choice((1, 1, 2, 3))
        Dl = Dl if 2 * Dl <= L else 1
        K = rng.randint(1, max(1, L // Dl))
        spatial.append(L)
        window.append(K)
        dilation.append(Dl)
        stride.append(rng.randint(1, K) if pattern == "neighborhood" else 1)
        causal.append(rng.random() < 0.3)
        shift.append(rng.randint(0, K - 1) if pattern == "window" else 0)
    heads = rng.choice((1, 2, 4))
    options = dict(
        spatial=tuple(spatial), window=tuple(window), dilation=tuple(dilation), causal=tuple(causal),
        pattern=pattern, heads=heads, kv_heads=rng.choice([h for h in (1, 2, 4) if heads % h == 0]),
        head_dim=rng.choice((64, 128)), dtype=rng.choice((torch.float16, torch.bfloat16)),
        batch=rng.choice((1, 2)),
    )
    if pattern == "window":
        options["shift"] = tuple(shift)
    else:
        options["stride"] = tuple(stride)
    if rng.random() < 0.2:
        options["scale"] = rng.choice((0.0, 0.3))
    return options


@requires_cuda_backend
@pytest.mark.parametrize(
    "spatial,window,options",
    [
        ((8,), 3, {}),
        ((100,), 7, {"causal": True}),
        ((16, 16), (5, 7), {}),
        ((12, 13), 4, {"stride": 2, "dilation": (1, 2)}),
        ((6, 7, 8), 3, {"causal": (True, False, False)}),
        ((16, 16), 8, {"stride": 8}),
        ((14, 14), 7, {"pattern": "window", "shift": 3}),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fixed_problems(spatial, window, options, dtype, head_dim):
    check_problem(spatial, window, dtype=dtype, head_dim=head_dim, **options)


@requires_cuda_backend
def test_gqa():
    check_problem((10, 12), 5, heads=8, kv_heads=2, batch=2)
    check_problem((50,), 9, heads=4, kv_heads=1, dtype=torch.float16, head_dim=128)


@requires_cuda_backend
@pytest.mark.parametrize("seed", range(24))
def test_random_problems(seed):
    options = random_problem(random.Random(seed))
    check_problem(options.pop("spatial"), options.pop("window"), seed=seed, **options)


@requires_cuda_backend
@pytest.mark.parametrize(
    "spatial,window,options",
    [
        ((40, 48), 7, {}),
        ((12, 12, 12), 5, {"dilation": (1, 2, 1)}),
        ((1000,), 33, {"causal": True, "stride": 4}),
        ((64, 64), 31, {}),  # 23 key chunks per tile: the Hopper kernel's stage ring wraps 5 times
    ],
)
def test_larger_grids_against_reference(spatial, window, options):
    check_problem(spatial, window, heads=4, kv_heads=2, against="reference", **options)


@requires_cuda_backend
@pytest.mark.parametrize("kernel", ["portable", "hopper"])
@pytest.mark.parametrize("seed", range(100, 108))
def test_each_forward_kernel_on_random_problems(kernel, seed, monkeypatch):
    # On sm_90 the default forward is the Hopper kernel; this keeps the portable one tested too.
    monkeypatch.setenv("HALOATTN_CUDA_FORWARD", kernel)
    options = random_problem(random.Random(seed))
    if kernel == "hopper" and options.get("scale", 1.0) <= 0:
        options["scale"] = 0.3  # the Hopper kernel needs scale > 0 (auto routes the rest to portable)
    check_problem(options.pop("spatial"), options.pop("window"), seed=seed, **options)


# HALOATTN_CUDA_SEEDS="start:stop" sweeps more seeds of the backward kernels on demand (e.g.
# "200:800" once a kernel changes); each seed is its own test.
def backward_seeds():
    start, _, stop = os.environ.get("HALOATTN_CUDA_SEEDS", "200:212").partition(":")
    return range(int(start), int(stop))


@requires_cuda_backend
@pytest.mark.parametrize("kernel", ["portable", "hopper"])
@pytest.mark.parametrize("seed", backward_seeds())
def test_each_backward_kernel_on_random_problems(kernel, seed, monkeypatch):
    # On sm_90 the default backward is the Hopper pair (dQ, then dK/dV); this keeps the portable
    # one tested too, and forces the Hopper one (scale of either sign, GQA, dilation, stride).
    monkeypatch.setenv("HALOATTN_CUDA_BACKWARD", kernel)
    options = random_problem(random.Random(seed))
    check_problem(options.pop("spatial"), options.pop("window"), seed=seed, **options)


@requires_cuda_backend
@pytest.mark.device_memory
@pytest.mark.parametrize("kernel", ["portable", "hopper"])
@pytest.mark.parametrize("spatial,window,tail", [((66_000,), 9, 256), ((257, 257), 7, 24)])
def test_more_than_2_31_elements_in_query(kernel, spatial, window, tail, monkeypatch):
    # B=2, H=128, D=128: 2.16e9 elements per tensor, so the kernels' element offsets (the
    # portable kernels' pointers, the LSE and delta rows, the tensor maps' strides) need 64 bits.
    monkeypatch.setenv("HALOATTN_CUDA_FORWARD", kernel)
    monkeypatch.setenv("HALOATTN_CUDA_BACKWARD", kernel)
    check_past_int32_offsets("cuda", spatial, window, tail=tail)


@requires_cuda_backend
def test_forced_hopper_backward_names_what_it_cannot_read(monkeypatch):
    monkeypatch.setenv("HALOATTN_CUDA_BACKWARD", "hopper")
    gen = torch.Generator().manual_seed(5)
    wide = torch.randn(1, 10, 12, 2, 128, generator=gen).to(torch.bfloat16).cuda()
    q = wide[..., :64].requires_grad_(True)  # head stride 128 for head_dim 64
    k = torch.randn(1, 10, 12, 2, 64, generator=gen).to(torch.bfloat16).cuda()
    out = haloattn.attention(q, k, k, 5, backend="cuda")
    with pytest.raises(RuntimeError, match="backward_kernel='hopper' cannot take this call: query's heads are not adjacent"):
        out.float().sum().backward()


@requires_cuda_backend
def test_forced_hopper_kernel_names_what_it_needs(monkeypatch):
    monkeypatch.setenv("HALOATTN_CUDA_FORWARD", "hopper")
    q = torch.randn(1, 8, 8, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="scale > 0"):
        haloattn.attention(q, q, q, 3, backend="cuda", scale=0.0)


@requires_cuda_backend
def test_unknown_forward_kernel_is_named(monkeypatch):
    monkeypatch.setenv("HALOATTN_CUDA_FORWARD", "fastest")
    q = torch.randn(1, 8, 8, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="HALOATTN_CUDA_FORWARD='fastest'; allowed: auto, portable, hopper"):
        haloattn.attention(q, q, q, 3, backend="cuda")


@requires_cuda_backend
def test_backward_is_bitwise_repeatable():
    gen = torch.Generator().manual_seed(0)
    q, k, v = _inputs((20, 20), 4, 2, 64, torch.bfloat16, 1, gen)
    grad_out = torch.randn(*q.shape, generator=gen).to(torch.bfloat16).cuda()
    grad_lse = torch.zeros(q.shape[:-1], device="cuda")
    first = _run("cuda", q, k, v, 7, grad_out, grad_lse, {})[2]
    second = _run("cuda", q, k, v, 7, grad_out, grad_lse, {})[2]
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@requires_cuda_backend
def test_non_contiguous_inputs():
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(1, 9, 11, 3, 2, 64, generator=gen).to(torch.bfloat16).cuda()
    q, k, v = qkv.unbind(3)  # strided views of one projection
    out = haloattn.attention(q, k, v, 5, backend="cuda")
    ref = haloattn.attention(q.float(), k.float(), v.float(), 5, backend="reference")
    assert oracle.rel_error(out, ref) <= oracle.TOLERANCE[torch.bfloat16]
    shifted = torch.randn(1, 9, 11, 2, 72, generator=gen).to(torch.bfloat16).cuda()[..., 4:68]  # 8-byte rows
    out = haloattn.attention(shifted, k, v, 5, backend="cuda")
    ref = haloattn.attention(shifted.float(), k.float(), v.float(), 5, backend="reference")
    assert oracle.rel_error(out, ref) <= oracle.TOLERANCE[torch.bfloat16]


@requires_cuda_backend
@pytest.mark.parametrize("kernel", ["auto", "hopper"])
def test_layouts_the_hopper_copies_cannot_read(kernel, monkeypatch):
    """The Hopper kernel copies tiles with TMA tensor maps: heads must be adjacent ([..., H, D]
    with head stride D) and a tile times its dilation must fit a copy box. Elsewhere auto runs
    the portable kernel (checked against the reference) and a forced Hopper kernel says why."""
    monkeypatch.setenv("HALOATTN_CUDA_FORWARD", kernel)
    gen = torch.Generator().manual_seed(4)
    wide = torch.randn(1, 10, 12, 2, 128, generator=gen).to(torch.bfloat16).cuda()
    q = wide[..., :64]  # head stride 128 for head_dim 64
    k, v = (torch.randn(1, 10, 12, 2, 64, generator=gen).to(torch.bfloat16).cuda() for _ in range(2))
    line = torch.randn(1, 300, 2, 64, generator=gen).to(torch.bfloat16).cuda()
    cases = [((q, k, v), 5, {}, "heads are not adjacent"), ((line, line, line), 9, {"dilation": 5}, "copy box")]
    for inputs, window, options, reason in cases:
        if kernel == "hopper":
            with pytest.raises(RuntimeError, match=reason):
                haloattn.attention(*inputs, window, backend="cuda", **options)
            continue
        out = haloattn.attention(*inputs, window, backend="cuda", **options)
        ref = haloattn.attention(*(t.float() for t in inputs), window, backend="reference", **options)
        assert oracle.rel_error(out, ref) <= oracle.TOLERANCE[torch.bfloat16]


@requires_cuda_backend
@pytest.mark.parametrize(
    "spatial,window,options",
    [
        ((3, 40, 40), (3, 9, 9), {}),  # 3-D, several key tiles along every axis
        ((8, 24, 24), (5, 7, 7), {"causal": (True, False, False), "dilation": (1, 2, 1)}),
        ((96, 96), (17, 33), {"stride": (1, 3)}),
        ((2048,), 301, {"dilation": 2}),
        # The benchmark's 3-D causal geometry: 2x8x8 pairs in both passes, chosen by the tiling
        # cost's runs and passed-over tiles (csrc/pair_tiling.h).
        ((16, 48, 48), (7, 15, 15), {"causal": (True, False, False)}),
    ],
)
def test_hopper_key_tiles_against_reference(spatial, window, options, monkeypatch):
    # Pairs whose key tiles leave gaps in a half's walk (tiles of the other half between runs),
    # masked and unmasked tiles, the tile grid anchored before the grid's start.
    monkeypatch.setenv("HALOATTN_CUDA_FORWARD", "hopper")
    monkeypatch.setenv("HALOATTN_CUDA_BACKWARD", "hopper")
    check_problem(spatial, window, heads=2, kv_heads=1, head_dim=128, against="reference", **options)


@requires_cuda_backend
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize(
    "spatial,window,options",
    [
        ((3072,), 1201, {"causal": True}),  # pairs walking 2-15 key tiles, then 21: turns in the later ones only
        ((2600,), 1201, {}),  # about 21 key tiles in every pair: turns throughout
    ],
)
def test_hopper_forward_turns_on_long_walks(spatial, window, options, head_dim, monkeypatch):
    # The 1-D forward's consumers take turns at the tensor cores only in pairs walking 16 or more
    # key tiles (neighborhood_forward_sm90.cu, kTurnMinTiles); the random problems' walks are all
    # shorter. Head dim 64 also runs the eight-stage ring.
    monkeypatch.setenv("HALOATTN_CUDA_FORWARD", "hopper")
    check_problem(spatial, window, head_dim=head_dim, **options)


@requires_cuda_backend
def test_hopper_forward_plans_many_pairs_per_cta(monkeypatch):
    # About 6000 pair tiles, so each CTA (one per SM) takes 40 and more: its planning lanes work
    # out two batches of 32 pairs, the ring of plans wraps many times, and the dilation groups of
    # unequal length leave empty pairs that every role must skip alike (pair_plans.cuh).
    monkeypatch.setenv("HALOATTN_CUDA_FORWARD", "hopper")
    check_problem((32, 34), (5, 7), dilation=(1, 2), batch=128, heads=4, kv_heads=2, against="reference")


@requires_cuda_backend
def test_compiles_with_fullgraph():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (t.detach() for t in _inputs((12, 12), 2, 2, 64, torch.float16, 1, gen))

    def f(q, k, v):
        return haloattn.attention(q, k, v, 5, backend="cuda")

    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(q, k, v), f(q, k, v))
