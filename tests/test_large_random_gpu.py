"""Random mid-size problems on a GPU, through every fused backend that accepts them, against the
reference backend in float64.

The random problems of test_triton_gpu.py / test_cuda_gpu.py are small enough for the quadratic
oracle, so most fit in one query tile and one key tile. Here grids span several query and key
tiles per axis, with ragged edges, windows of every size relative to the tiles, dilation groups
of unequal lengths, strides that do not divide the axis, head sizes off the fast path and
features mixed at random: the places where tile bounds, partial-tile masks and the inverse rule
of the backward can go wrong only at scale. The reference backend is checked against the oracle
elsewhere (test_reference_oracle.py), and float64 on the GPU keeps it exact at these sizes.
Run with ``pytest -m gpu``.
"""

import math
import os
import random

import pytest
import torch

import haloattn
import oracle

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FUSED = ("triton", "triton_window", "cuda")
# Token counts per rank: large enough for several tiles per axis, small enough for the float64
# reference's gathers to stay a few seconds.
AXIS_LENGTHS = {1: (150, 3000), 2: (17, 70), 3: (5, 19)}
MAX_TOKENS = 6000
# Which seeds run: 40 by default; HALOATTN_RANDOM_SEEDS="start:stop" runs a longer sweep on demand
# (e.g. "40:400" once a kernel changes), each seed still its own test.
SEEDS_ENV = "HALOATTN_RANDOM_SEEDS"


def seeds():
    start, _, stop = os.environ.get(SEEDS_ENV, "0:40").partition(":")
    return range(int(start), int(stop))


def random_large_problem(rng: random.Random) -> dict:
    rank = rng.choice((1, 2, 2, 3))
    pattern = "window" if rng.random() < 0.25 else "neighborhood"
    low, high = AXIS_LENGTHS[rank]
    spatial, window, dilation, stride, causal, shift = [], [], [], [], [], []
    for _ in range(rank):
        L = rng.randint(low, high)
        while math.prod(spatial) * L > MAX_TOKENS:
            L = max(low, L // 2)
        Dl = rng.choice((1, 1, 1, 2, 3))
        Dl = Dl if 2 * Dl <= L else 1
        cap = {1: 400, 2: 33, 3: 11}[rank]
        K = rng.randint(1 if pattern == "window" else 2, max(2, min(L // Dl, cap)))
        spatial.append(L)
        window.append(K)
        dilation.append(Dl)
        stride.append(rng.randint(1, K) if rng.random() < 0.4 else 1)
        causal.append(rng.random() < 0.3)
        shift.append(rng.randint(0, K - 1) if rng.random() < 0.6 else 0)
    heads = rng.choice((1, 2, 3, 4, 8))
    head_dim = rng.choice((16, 32, 48, 64, 64, 80, 96, 128, 128, 160, 192, 256))
    options = dict(
        spatial=tuple(spatial), window=tuple(window), dilation=tuple(dilation), causal=tuple(causal),
        pattern=pattern, heads=heads, kv_heads=rng.choice([h for h in range(1, heads + 1) if heads % h == 0]),
        head_dim=head_dim, value_dim=rng.choice((head_dim, head_dim, 32, 64, 128)),
        dtype=rng.choice((torch.bfloat16, torch.float16, torch.float32)), batch=rng.choice((1, 2, 3)),
        rpb=rng.random() < 0.3, extra=rng.choice((0, 0, 0, 1, 7, 33)),
    )
    if pattern == "window":
        options["shift"] = tuple(shift)
    else:
        options["stride"] = tuple(stride)
    if rng.random() < 0.25:
        options["softcap"] = rng.choice((3.0, 20.0))
    if rng.random() < 0.15:
        options["scale"] = rng.choice((0.0, 0.2))
    return options


def make_leaves(options, seed):
    """Fresh random inputs and the attention() keyword arguments. The inputs are float64 tensors
    holding values of the problem's dtype: the float64 reference then computes the contract on
    exactly the inputs the fused backends see (rounding the inputs themselves to bfloat16 moves
    the LSE of a problem with large scores by up to ~0.03, more than the tolerance allows for
    the kernel's own error)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    batch, spatial, heads, kv_heads = options["batch"], options["spatial"], options["heads"], options["kv_heads"]
    head_dim, value_dim, extra = options["head_dim"], options["value_dim"], options["extra"]

    def randn(*shape, scale=1.0):
        master = torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float64) * scale
        return master.to(options["dtype"]).double()

    leaves = {"query": randn(batch, *spatial, heads, head_dim), "key": randn(batch, *spatial, kv_heads, head_dim),
              "value": randn(batch, *spatial, kv_heads, value_dim)}
    if options["rpb"]:
        leaves["rpb"] = randn(heads, *(2 * w - 1 for w in options["window"]), scale=0.5)
    if extra:
        leaves["additional_keys"] = randn(batch, extra, kv_heads, head_dim)
        leaves["additional_values"] = randn(batch, extra, kv_heads, value_dim)
    kwargs = {n: options[n] for n in ("window", "dilation", "causal", "pattern", "stride", "shift", "softcap", "scale")
              if n in options}
    return leaves, kwargs


def run_backend(backend, leaves, kwargs, dtype, grad_out, grad_lse):
    inputs = {n: t.to(dtype).requires_grad_(True) for n, t in leaves.items()}
    q, k, v = inputs.pop("query"), inputs.pop("key"), inputs.pop("value")
    out, lse = haloattn.attention(q, k, v, return_lse=True, backend=backend, **kwargs, **inputs)
    names = ["query", "key", "value", *inputs]
    grads = torch.autograd.grad((out.double() * grad_out).sum() + (lse.double() * grad_lse).sum(),
                                [q, k, v, *inputs.values()])
    return out, lse, dict(zip(names, grads))


def runnable_fused_backends(leaves, kwargs, dtype):
    q, k, v = (leaves[n].to(dtype) for n in ("query", "key", "value"))
    others = {n: t.to(dtype) for n, t in leaves.items() if n not in ("query", "key", "value")}
    verdicts = haloattn.explain(q, k, v, verbose=False, **kwargs, **others).verdicts
    return [v.name for v in verdicts if v.can_run and v.name in FUSED]


@pytest.mark.parametrize("seed", seeds())
def test_random_large_problems_against_reference(seed):
    options = random_large_problem(random.Random(7919 * seed + 1))
    dtype = options["dtype"]
    leaves, kwargs = make_leaves(options, seed)
    backends = runnable_fused_backends(leaves, kwargs, dtype)
    assert "triton" in backends, f"triton refused {options}"  # it takes every such problem
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    out_shape = (options["batch"], *options["spatial"], options["heads"], options["value_dim"])
    grad_out = torch.randn(*out_shape, generator=gen, device="cuda", dtype=torch.float64)
    grad_lse = torch.randn(*out_shape[:-1], generator=gen, device="cuda", dtype=torch.float64)
    ref_out, ref_lse, ref_grads = run_backend("reference", leaves, kwargs, torch.float64, grad_out, grad_lse)

    tol, lse_tol = oracle.TOLERANCE[dtype], oracle.LSE_TOLERANCE[dtype]
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        tol, lse_tol = 3e-3, oracle.LSE_TOLERANCE[torch.float16]  # tf32: SEMANTICS 7
    failures = {}
    for backend in backends:
        out, lse, grads = run_backend(backend, leaves, kwargs, dtype, grad_out, grad_lse)
        errors = {"out": oracle.rel_error(out, ref_out)}
        errors.update({"d" + n: oracle.rel_error(g, ref_grads[n]) for n, g in grads.items()})
        bad = {n: e for n, e in errors.items() if not e <= tol}
        lse_err = (lse.double() - ref_lse).abs().max().item()
        if bad or not lse_err <= lse_tol:
            failures[backend] = dict(errors=bad, lse_max_abs_error=lse_err)
    assert not failures, f"{failures} (tolerance {tol}, LSE {lse_tol}) on {options}"
