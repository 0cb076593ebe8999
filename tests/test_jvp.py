"""Forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) and torch.func's grad / vjp through
haloattn.attention, against torch.func.jvp of the float64 oracle (plain PyTorch ops, which have
their own forward-mode rules): the reference backend on every feature, the triton backend's
fused JVP kernel in Triton's interpreter, and the dispatcher's choice of a backend with a rule."""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import forward_ad

import haloattn
from delegating_backend import ReferenceDelegate
from haloattn.dispatch import DISPATCHER, BackendUnavailableError

import oracle

# torch.func's first use scripts helpers with torch.jit, which torch 2.13 reports as deprecated.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script:DeprecationWarning")


def _per_axis(v, rank):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * rank


def make_primals(spatial, window, *, heads=2, kv_heads=None, head_dim=8, value_dim=None, batch=1, rpb=False,
                 extra=0, kq_conv=None, seed=0):
    """Fresh random float64 inputs by name (what the problem has)."""
    gen = torch.Generator().manual_seed(seed)
    kv_heads = kv_heads or heads
    value_dim = value_dim or head_dim

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    primals = {
        "query": randn(batch, *spatial, heads, head_dim),
        "key": randn(batch, *spatial, kv_heads, head_dim),
        "value": randn(batch, *spatial, kv_heads, value_dim),
    }
    if rpb:
        primals["rpb"] = randn(heads, *(2 * w - 1 for w in _per_axis(window, len(spatial))), scale=0.5)
    if extra:
        primals["additional_keys"] = randn(batch, extra, kv_heads, head_dim)
        primals["additional_values"] = randn(batch, extra, kv_heads, value_dim)
    if kq_conv:
        primals["kq_conv"] = randn(heads, *kq_conv, scale=0.5)
    return primals, gen


def jvp_both(primals, gen, moving, window, *, dtype=torch.float64, backend="reference", device="cpu", **options):
    """(haloattn's (out, lse) and their tangents on ``device``, the oracle's) for random tangents of
    the inputs named in ``moving``."""
    tangents = {n: torch.randn(primals[n].shape, generator=gen, dtype=torch.float64) for n in moving}

    def call(attention, cast, **extra_options):
        def run(*moved):
            tensors = {n: cast(t) for n, t in primals.items()}
            tensors.update({n: cast(t) for n, t in zip(moving, moved)})
            q, k, v = (tensors.pop(n) for n in ("query", "key", "value"))
            return attention(q, k, v, window, **tensors, **options, **extra_options)
        return run

    ours = torch.func.jvp(
        call(haloattn.attention, lambda t: t.to(device, dtype), return_lse=True, backend=backend),
        tuple(primals[n].to(device, dtype) for n in moving), tuple(tangents[n].to(device, dtype) for n in moving),
    )
    ours = tuple(tuple(t.cpu() for t in pair) for pair in ours)
    ref = torch.func.jvp(call(oracle.attention, lambda t: t), tuple(primals[n] for n in moving),
                         tuple(tangents[n] for n in moving))
    return ours, ref


def assert_close(ours, ref, dtype, tf32=False):
    (out, lse), (t_out, t_lse) = ours
    (ref_out, ref_lse), (ref_t_out, ref_t_lse) = ref
    tol, lse_tol = oracle.TOLERANCE[dtype], oracle.LSE_TOLERANCE[dtype]
    if tf32:  # SEMANTICS 7: tf32 3e-3, its LSE error that of 16-bit inputs
        tol, lse_tol = 3e-3, oracle.LSE_TOLERANCE[torch.float16]
    errors = {"out": oracle.rel_error(out, ref_out), "tangent of out": oracle.rel_error(t_out, ref_t_out),
              "tangent of lse": oracle.rel_error(t_lse, ref_t_lse)}
    assert all(e <= tol for e in errors.values()), f"relative errors above {tol}: {errors}"
    assert (lse.double() - ref_lse).abs().max().item() <= lse_tol
    assert t_out.dtype == out.dtype and t_lse.dtype == lse.dtype


# ----------------------------------------------------------------------------------------------
# The reference backend: every feature, float64 (and the rules' float32 / 16-bit compute paths).

REFERENCE_CASES = [
    ((11,), 4, dict(heads=4, kv_heads=2, head_dim=6, value_dim=5), dict(stride=2, dilation=2, causal=True)),
    ((6, 7), (3, 3), dict(rpb=True), dict(dilation=(1, 2), causal=(True, False), softcap=3.0)),
    ((4, 5, 6), (3, 2, 3), dict(rpb=True, extra=3, kv_heads=1),
     dict(stride=(1, 2, 3), dilation=(1, 2, 1), causal=(True, False, False))),
    ((9, 8), (3, 4), dict(rpb=True, extra=2), dict(pattern="window", shift=(1, 2), causal=(False, True))),
    ((10,), 5, dict(kq_conv=(2, 3)), dict(scale=0.7)),
    ((7, 6), (3, 3), dict(extra=2, batch=2),
     dict(score_mod=lambda s, b, h, q, kv: s * (1 + 0.25 * h) - 0.01 * (q - kv).abs(),
          mask_mod=lambda b, h, q, kv: (q + kv + h) % 3 != 0)),
]


@pytest.mark.parametrize("spatial,window,shape,options", REFERENCE_CASES,
                         ids=["1d-gqa-stride-dil-causal", "2d-rpb-softcap", "3d-extra-gqa", "2d-window-shift",
                              "1d-kq-conv", "2d-mods-batch"])
def test_reference_tangents_match_the_oracle(spatial, window, shape, options):
    primals, gen = make_primals(spatial, window, **shape)
    ours, ref = jvp_both(primals, gen, tuple(primals), window, **options)
    assert_close(ours, ref, torch.float64)


def test_rows_that_see_no_key_have_zero_tangents():
    # A mask_mod that empties whole rows: their out is 0 and lse -inf, and so stays their tangent
    # (0, not NaN), while the other rows' tangents match the oracle.
    primals, gen = make_primals((8,), 3)
    mask_mod = lambda b, h, q, kv: q % 3 != 1  # noqa: E731
    ours, ref = jvp_both(primals, gen, ("query", "key", "value"), 3, mask_mod=mask_mod)
    (_, lse), (t_out, t_lse) = ours
    empty = torch.isinf(lse)
    assert empty.any() and not torch.isnan(t_out).any() and not torch.isnan(t_lse).any()
    assert torch.all(t_lse[empty] == 0) and torch.all(t_out[empty] == 0)
    (_, _), (ref_t_out, _) = ref
    assert oracle.rel_error(t_out, torch.nan_to_num(ref_t_out)) <= oracle.TOLERANCE[torch.float64]


@pytest.mark.parametrize("moving", [("value",), ("additional_values",), ("rpb",)])
def test_reference_tangents_when_some_outputs_do_not_move(moving):
    # With only values moving the LSE does not depend on any moving input (its tangent is 0), and
    # with scale 0 the scores do not depend on the keys or queries at all.
    primals, gen = make_primals((9,), 3, rpb=True, extra=2)
    for scale in (None, 0.0):
        ours, ref = jvp_both(primals, gen, moving, 3, scale=scale)
        assert_close(ours, ref, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_tangents_in_lower_precision(dtype):
    primals, gen = make_primals((6, 7), (3, 5), rpb=True, extra=2, head_dim=16)
    ours, ref = jvp_both(primals, gen, ("query", "value", "rpb", "additional_keys"), (3, 5), dtype=dtype,
                         softcap=4.0)
    assert_close(ours, ref, dtype)


def test_forward_ad_dual_tensors_and_partial_tangents():
    """torch.autograd.forward_ad's dual tensors give the same tangents as torch.func.jvp; an input
    without a tangent is a constant; a call without any tangent inside a dual level is plain."""
    primals, gen = make_primals((9,), 3)
    q, k, v = primals["query"], primals["key"], primals["value"]
    t_k = torch.randn(k.shape, generator=gen, dtype=torch.float64)
    with forward_ad.dual_level():
        out = haloattn.attention(q, forward_ad.make_dual(k, t_k), v, 3)
        _, tangent = forward_ad.unpack_dual(out)
        plain = haloattn.attention(q, k, v, 3)
        assert forward_ad.unpack_dual(plain).tangent is None
    _, ref_tangent = torch.func.jvp(lambda k: oracle.attention(q, k, v, 3)[0], (k,), (t_k,))
    assert oracle.rel_error(tangent, ref_tangent) <= oracle.TOLERANCE[torch.float64]


def test_func_grad_vjp_and_backward_through_a_jvp_primal():
    """torch.func.grad / vjp run the backward; MeanFlow-style training (torch.func.jvp, then a loss
    on the primal output with the tangent detached) gets the primal's gradient."""
    primals, gen = make_primals((7, 6), (3, 3), rpb=True)
    q, k, v, rpb = (primals[n] for n in ("query", "key", "value", "rpb"))

    def ours(q, k, v):
        return haloattn.attention(q, k, v, (3, 3), rpb=rpb, causal=(False, True))

    def ref(q, k, v):
        return oracle.attention(q, k, v, (3, 3), rpb=rpb, causal=(False, True))[0]

    weight = torch.randn(ours(q, k, v).shape, generator=gen, dtype=torch.float64)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    expected = torch.autograd.grad((ref(*leaves) * weight).sum(), leaves)
    tol = oracle.TOLERANCE[torch.float64]
    grads = torch.func.grad(lambda *x: (ours(*x) * weight).sum(), argnums=(0, 1, 2))(q, k, v)
    _, pull_back = torch.func.vjp(ours, q, k, v)
    for got in (grads, pull_back(weight)):
        assert all(oracle.rel_error(g, e) <= tol for g, e in zip(got, expected))

    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    tangents = tuple(torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in leaves)
    out, tangent = torch.func.jvp(ours, tuple(leaves), tangents)
    target = (out + 0.5 * tangent).detach()
    ((out - target) * weight).sum().backward()
    for leaf, e in zip(leaves, expected):
        assert oracle.rel_error(leaf.grad, e) <= tol


def test_backward_through_a_tangent_raises():
    """The rules are first order: a backward that reaches a tangent (forward_ad's or
    torch.func.jvp's) raises instead of adding nothing."""
    primals, gen = make_primals((8,), 3)
    q = primals["query"].clone().requires_grad_(True)

    def call(q):
        return haloattn.attention(q, primals["key"], primals["value"], 3)

    with forward_ad.dual_level():
        primal, tangent = forward_ad.unpack_dual(call(forward_ad.make_dual(q, torch.randn_like(q))))
        with pytest.raises(NotImplementedError, match="tangent of a JVP .* not differentiable"):
            (primal.sum() + tangent.sum()).backward()
    primal, tangent = torch.func.jvp(call, (q,), (torch.randn_like(q),))
    with pytest.raises(NotImplementedError, match="tangent of a JVP .* not differentiable"):
        (primal.sum() + tangent.sum()).backward()


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_vmap_folds_into_the_batch(backend, monkeypatch):
    """torch.func.vmap of a call equals the calls stacked: vmapped on any dimension, inputs left
    unbatched, nested vmaps, a vmapped bias table (run index by index), the LSE, and gradients
    taken from outside the vmap."""
    if backend == "triton":
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    gen = torch.Generator().manual_seed(4)
    dtype = torch.float64 if backend == "reference" else torch.float32

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    V = 3
    q, k, v = randn(V, 2, 6, 5, 2, 16), randn(V, 2, 6, 5, 1, 16), randn(V, 2, 6, 5, 1, 8)
    tables = randn(V, 2, 5, 5)

    def call(q, k, v, rpb=tables[0]):
        return haloattn.attention(q, k, v, (3, 3), rpb=rpb, causal=(True, False), return_lse=True, backend=backend)

    def stacked(fn, *per_index):
        outs = [fn(*args) for args in zip(*per_index)]
        return tuple(torch.stack(parts) for parts in zip(*outs))

    tol = oracle.TOLERANCE[dtype]
    for got, expected in (
        (torch.func.vmap(call)(q, k, v), stacked(call, q, k, v)),
        (torch.func.vmap(call, in_dims=(1, None, 0))(q.movedim(0, 1), k[0], v),
         stacked(lambda q, v: call(q, k[0], v), q, v)),
        (torch.func.vmap(call)(q, k, v, tables), stacked(call, q, k, v, tables)),
        # nested: [V, 2] vmapped, a batch of 1 inside
        (torch.func.vmap(torch.func.vmap(call))(*(t.unsqueeze(2) for t in (q, k, v))),
         tuple(t.unflatten(0, (V, 2)) for t in stacked(call, *(t.flatten(0, 1).unsqueeze(1) for t in (q, k, v))))),
    ):
        assert all(oracle.rel_error(g, e) <= tol for g, e in zip(got, expected))
        assert all(g.shape == e.shape for g, e in zip(got, expected))

    weight = randn(V, 2, 6, 5, 2, 8)
    grads = []
    for vmapped in (True, False):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = torch.func.vmap(call)(*leaves)[0] if vmapped else stacked(call, *leaves)[0]
        grads.append(torch.autograd.grad((out * weight).sum(), leaves))
    assert all(oracle.rel_error(g, e) <= tol for g, e in zip(*grads))


def test_per_sample_gradients_and_jacobians():
    """vmap over grad (per-sample gradients, the bias table's included), jacrev and jacfwd match
    the oracle's; second derivatives (hessian, a gradient of a gradient) raise and say why."""
    primals, gen = make_primals((6, 5), (3, 3), batch=4, rpb=True)
    q, k, v, rpb = (primals[n] for n in ("query", "key", "value", "rpb"))

    def loss(attention):
        def f(q, k, v, rpb):
            out = attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), (3, 3), rpb=rpb, causal=(False, True))
            return out[0].pow(2).sum() if isinstance(out, tuple) else out.pow(2).sum()
        return f

    tol = oracle.TOLERANCE[torch.float64]
    per_sample = torch.func.vmap(torch.func.grad(loss(haloattn.attention), argnums=(0, 1, 2, 3)), in_dims=(0, 0, 0, None))
    expected = torch.func.vmap(torch.func.grad(loss(oracle.attention), argnums=(0, 1, 2, 3)), in_dims=(0, 0, 0, None))
    got, ref = per_sample(q, k, v, rpb), expected(q, k, v, rpb)
    assert got[3].shape == (4, *rpb.shape)
    assert all(oracle.rel_error(g, r) <= tol for g, r in zip(got, ref))

    def call(q):
        return haloattn.attention(q, k[:1], v[:1], (3, 3), rpb=rpb)

    def reference(q):
        return oracle.attention(q, k[:1], v[:1], (3, 3), rpb=rpb)[0]

    for jacobian in (torch.func.jacrev, torch.func.jacfwd):
        assert oracle.rel_error(jacobian(call)(q[:1]), jacobian(reference)(q[:1])) <= tol
    second_order = (
        lambda: torch.func.hessian(lambda q: call(q).sum())(q[:1]),
        lambda: torch.func.grad(lambda q: torch.func.grad(lambda q: call(q).pow(2).sum())(q).sum())(q[:1]),
    )
    for run in second_order:
        with pytest.raises(NotImplementedError, match="derivatives are first order"):
            run()


# ----------------------------------------------------------------------------------------------
# The dispatcher: calls with tangents go to backends that have a JVP rule.

class _NoRule(ReferenceDelegate):
    """Runs every problem (through the reference), faster than anything by priority, no JVP rule."""

    name = "test_no_jvp_rule"
    priority = 10_000


@pytest.fixture
def backend_without_rule(monkeypatch):
    monkeypatch.delenv("HALOATTN_BACKEND", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    backend = _NoRule()
    haloattn.register_backend(backend)
    yield backend
    DISPATCHER.registry.backends.pop(backend.name, None)
    haloattn.clear_caches()


def test_tangents_go_to_a_backend_with_a_rule(backend_without_rule, monkeypatch):
    primals, gen = make_primals((8,), 3)
    q, k, v = primals["query"], primals["key"], primals["value"]
    assert haloattn.explain(q, k, v, 3, verbose=False).chosen == backend_without_rule.name
    explanation = haloattn.explain(q, k, v, 3, verbose=False, jvp=True)
    assert explanation.chosen == "reference"
    assert "forward-mode AD: no JVP rule" in str(explanation)

    chosen = []
    real = DISPATCHER.get("reference").jvp
    monkeypatch.setattr(DISPATCHER.get("reference"), "jvp", lambda *a, **kw: chosen.append(1) or real(*a, **kw))
    torch.func.jvp(lambda q: haloattn.attention(q, k, v, 3), (q,), (torch.randn_like(q),))
    assert chosen, "the tangents did not reach the reference backend's rule"
    with pytest.raises(BackendUnavailableError, match="forward-mode AD: no JVP rule"):
        torch.func.jvp(lambda q: haloattn.attention(q, k, v, 3, backend=backend_without_rule.name), (q,),
                       (torch.randn_like(q),))
    # torch.func.grad needs no rule: the fastest backend runs it.
    torch.func.grad(lambda q: haloattn.attention(q, k, v, 3, backend=backend_without_rule.name).sum())(q)


# ----------------------------------------------------------------------------------------------
# The triton backend's fused JVP kernel, in Triton's interpreter.

TRITON_CASES = [
    ((12,), 5, dict(heads=4, kv_heads=2, head_dim=20, value_dim=32), dict(), None),
    ((13,), 4, dict(), dict(stride=2, dilation=2, causal=True), None),
    ((10,), 4, dict(heads=3, kv_heads=1, extra=7), dict(stride=4, softcap=2.0), None),
    ((9, 11), (3, 5), dict(rpb=True, heads=4, kv_heads=2, value_dim=24, extra=5),
     dict(stride=(1, 2), dilation=(2, 1), causal=(True, False), softcap=3.0), None),
    ((9, 11), (3, 4), dict(rpb=True, extra=3), dict(pattern="window", shift=(1, 2), dilation=(1, 2),
                                                    causal=(False, True)), None),
    ((4, 5, 6), (3, 2, 3), dict(kv_heads=1, rpb=True, extra=2),
     dict(stride=(1, 2, 3), dilation=(1, 2, 1), causal=(True, False, False)), None),
    ((9, 11), (3, 5), dict(rpb=True, extra=3), dict(), ("value",)),
    ((9, 11), (3, 5), dict(rpb=True, extra=3), dict(softcap=2.5), ("key", "additional_values")),
    ((9, 11), (3, 5), dict(rpb=True, extra=3), dict(), ("rpb", "additional_keys")),
]


@pytest.mark.parametrize("spatial,window,shape,options,moving", TRITON_CASES,
                         ids=["1d-gqa-dv", "1d-stride-dil-causal", "1d-blocked-softcap-extra", "2d-mixed-all",
                              "2d-window-shift", "3d-mixed-rpb", "only-value", "key-and-extra-value",
                              "rpb-and-extra-key"])
def test_triton_tangents_match_the_oracle(monkeypatch, spatial, window, shape, options, moving):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    primals, gen = make_primals(spatial, window, head_dim=shape.pop("head_dim", 16), **shape)
    ours, ref = jvp_both(primals, gen, moving or tuple(primals), window, dtype=torch.float32, backend="triton",
                         **options)
    assert_close(ours, ref, torch.float32)


def test_triton_tangents_in_bfloat16(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    primals, gen = make_primals((7, 9), (3, 5), heads=2, kv_heads=1, head_dim=32, rpb=True, extra=2)
    ours, ref = jvp_both(primals, gen, tuple(primals), (3, 5), dtype=torch.bfloat16, backend="triton",
                         causal=(False, True), softcap=4.0)
    assert_close(ours, ref, torch.bfloat16)


def test_triton_rule_runs_under_forward_ad_and_in_batch_slices(monkeypatch):
    """The dual-tensor API reaches the fused kernel too, and a batch larger than one launch holds
    runs slice by slice (MAX_GRID_BATCH lowered to make three slices of a batch of 5)."""
    pytest.importorskip("triton")
    from haloattn.backends.triton import batch_slices

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(batch_slices, "MAX_GRID_BATCH", 2)
    primals, gen = make_primals((6, 5), (3, 3), batch=5, head_dim=16)
    q, k, v = (primals[n].float() for n in ("query", "key", "value"))
    t_q, t_v = torch.randn(q.shape, generator=gen), torch.randn(v.shape, generator=gen)
    with forward_ad.dual_level():
        out = haloattn.attention(forward_ad.make_dual(q, t_q), k, forward_ad.make_dual(v, t_v), (3, 3),
                                 backend="triton")
        tangent = forward_ad.unpack_dual(out).tangent
    _, ref = torch.func.jvp(lambda q, v: oracle.attention(q, k.double(), v, (3, 3))[0], (q.double(), v.double()),
                            (t_q.double(), t_v.double()))
    assert oracle.rel_error(tangent, ref) <= oracle.TOLERANCE[torch.float32]
    assert math.isfinite(tangent.abs().max().item())


# ----------------------------------------------------------------------------------------------
# On a GPU (pytest -m gpu): the fused kernel on random problems across features and dtypes.

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def seeds():
    """10 by default; HALOATTN_JVP_SEEDS="start:stop" runs a longer sweep on demand."""
    import os

    start, _, stop = os.environ.get("HALOATTN_JVP_SEEDS", "0:10").partition(":")
    return range(int(start), int(stop))


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("seed", seeds())
def test_triton_tangents_on_random_problems(dtype, seed):
    """Random problems of tests/test_triton_gpu.py's generator (every per-axis option, GQA, D_v,
    rpb, softcap, additional tokens, head dims 16-128), a random subset of the inputs moving."""
    import random

    from test_triton_gpu import random_problem

    rng = random.Random(7000 + 3 * seed + (torch.bfloat16, torch.float16, torch.float32).index(dtype))
    options = random_problem(rng)
    spatial, window = options.pop("spatial"), options.pop("window")
    shape = {n: options.pop(n) for n in ("heads", "kv_heads", "head_dim", "value_dim", "rpb", "extra", "batch")}
    primals, gen = make_primals(spatial, window, seed=seed, **shape)
    moving = [n for n in primals if rng.random() < 0.7] or ["query"]
    ours, ref = jvp_both(primals, gen, tuple(moving), window, dtype=dtype, backend="triton", device="cuda",
                         **options)
    assert_close(ours, ref, dtype, tf32=dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32)


@gpu
@needs_cuda
@pytest.mark.parametrize("head_dim", [32, 64, 128, 192, 256])
def test_triton_tangents_per_head_dim(head_dim):
    """Each head-dim class (the kernel switches to 8 warps at value tiles of 128 and more; from 192
    its key tile is fitted to its own shared memory, tiles.jvp_tiles)."""
    primals, gen = make_primals((24, 20), (7, 9), heads=2, head_dim=head_dim, rpb=True, seed=head_dim)
    ours, ref = jvp_both(primals, gen, tuple(primals), (7, 9), dtype=torch.bfloat16, backend="triton",
                         device="cuda", dilation=(2, 1), causal=(False, True))
    assert_close(ours, ref, torch.bfloat16)


@gpu
@needs_cuda
def test_triton_tangents_with_int64_offsets():
    """A query of 2.16e9 elements (B=2, L=66000, H=128, D=128): the kernel's offsets need int64.
    The tangents of the second batch's last queries are checked against the reference on a
    slice (a slice's own border moves windows only within K of its start)."""
    B, L, H, D, K = 2, 66_000, 128, 128, 9
    assert B * L * H * D > 2**31
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v, t_q, t_v = (torch.randn(B, L, H, D, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(5))
    _, tangent = torch.func.jvp(lambda q, v: haloattn.attention(q, k, v, K, backend="triton"), (q, v), (t_q, t_v))
    tail = 256
    sl = slice(L - tail, L)
    _, ref = torch.func.jvp(lambda q, v: haloattn.attention(q, k[1:, sl].float(), v, K, backend="reference"),
                            (q[1:, sl].float(), v[1:, sl].float()), (t_q[1:, sl].float(), t_v[1:, sl].float()))
    err = oracle.rel_error(tangent[1:, L - tail + K:].float(), ref[:, K:])
    assert err <= oracle.TOLERANCE[torch.bfloat16], err



def test_profile_reports_the_jvp_of_each_backend_with_a_rule(backend_without_rule, capsys):
    """``haloattn profile --jvp``: time and error of every rule, 'no rule' for the others."""
    from haloattn.cli import main

    assert main(["profile", "--shape", "6x7", "--window", "3", "--batch", "1", "--heads", "2", "--head-dim", "8",
                 "--jvp", "--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("backend"))
    assert "jvp ms" in header and "jvp rel err" in header
    reference = next(line for line in lines if line.startswith("reference")).split()
    assert float(reference[-1]) <= 1e-5  # float32 inputs against the float64 reference's tangent
    norule = next(line for line in lines if line.startswith(backend_without_rule.name)).split()
    assert norule[-3:] == ["-", "no", "rule"]


@gpu
@needs_cuda
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_torch_func_transforms_on_the_fused_kernels(backend):
    """vmap (folded into the batch), per-sample gradients (vmap over grad, the bias table's
    included) and jacfwd / jacrev through a fused backend on the GPU, against the float64 oracle
    on the CPU: the transform wiring (ops.py, batching.py) around the kernels that run in models."""
    unavailable = DISPATCHER.get(backend).available()
    if unavailable:
        pytest.skip(f"backend {backend} is not available here: {unavailable}")
    primals, _ = make_primals((10, 9), (5, 3), heads=2, head_dim=64, batch=3, rpb=backend == "triton", seed=11)
    q, k, v = (primals[n] for n in ("query", "key", "value"))
    rpb = primals.get("rpb")
    dtype, tol = torch.bfloat16, oracle.TOLERANCE[torch.bfloat16]
    options = dict(dilation=(2, 1), causal=(False, True))

    def on_gpu(t):
        return None if t is None else t.to("cuda", dtype)

    def ours(q, k, v, rpb=on_gpu(rpb)):
        return haloattn.attention(q, k, v, (5, 3), rpb=rpb, backend=backend, **options)

    def theirs(q, k, v, rpb=rpb):
        return oracle.attention(q, k, v, (5, 3), rpb=rpb, **options)[0]

    # vmap over the batch axis of a batch of one, against the oracle on the whole batch
    got = torch.func.vmap(ours)(*(on_gpu(t).unsqueeze(1) for t in (q, k, v))).squeeze(1)
    assert oracle.rel_error(got.cpu(), theirs(q, k, v)) <= tol

    def per_sample(attention, cast, with_rpb):
        def loss(q, k, v, rpb):
            out = attention(*(t.unsqueeze(0) for t in (q, k, v)), rpb=rpb)
            return out.float().pow(2).sum()
        argnums = (0, 1, 2, 3) if with_rpb else (0, 1, 2)
        return torch.func.vmap(torch.func.grad(loss, argnums=argnums), in_dims=(0, 0, 0, None))(
            *(cast(t) for t in (q, k, v)), cast(rpb))

    with_rpb = rpb is not None
    for got, ref in zip(per_sample(ours, on_gpu, with_rpb), per_sample(theirs, lambda t: t, with_rpb)):
        assert oracle.rel_error(got.double().cpu(), ref) <= tol

    jacobians = (torch.func.jacrev, torch.func.jacfwd) if backend == "triton" else (torch.func.jacrev,)
    small = tuple(t[:1, :4, :3, :1] for t in (q, k, v))  # a 4x3 grid, one head

    def small_ours(q):
        return haloattn.attention(q, on_gpu(small[1]), on_gpu(small[2]), 3, backend=backend)

    def small_theirs(q):
        return oracle.attention(q, small[1], small[2], 3)[0]

    for jacobian in jacobians:
        got = jacobian(small_ours)(on_gpu(small[0]))
        assert oracle.rel_error(got.double().cpu(), jacobian(small_theirs)(small[0])) <= tol


def test_wide_heads_fit_the_jvp_kernels_own_shared_memory():
    """The JVP kernel streams four tiles a step where dQ streams two: from head dim 192 (16-bit)
    its tiles shrink until its own estimate fits Hopper's shared memory (32 x 32 here, as fast as
    the runtime refit on the H100 without the refused first compile); narrower heads and float32
    keep the dQ tiles."""
    from haloattn.backends.triton import tiles
    from haloattn.problem import build_problem

    def jvp_and_dq(head_dim, dtype):
        q = torch.empty(1, 64, 64, 4, head_dim, dtype=dtype)
        problem = build_problem(q, q, q, 13)
        dq = tiles.default_config(problem)["dq"]
        return problem, dq, tiles.jvp_tiles(problem, dq)

    for head_dim in (192, 256):
        problem, dq, jvp = jvp_and_dq(head_dim, torch.bfloat16)
        item, d, dv = tiles._operand_sizes(problem, "jvp")
        assert (math.prod(jvp["q"]), math.prod(jvp["kv"])) == (32, 32), (dq, jvp)
        assert jvp["stages"] == dq["stages"] >= 2
        need = tiles._shared_bytes("jvp", math.prod(jvp["q"]), math.prod(jvp["kv"]), jvp["stages"], d, dv, item)
        assert need <= tiles.tile_shared_budget(problem.device)
    for head_dim, dtype in ((64, torch.bfloat16), (128, torch.float16), (128, torch.float32), (256, torch.float32)):
        _, dq, jvp = jvp_and_dq(head_dim, dtype)
        assert jvp == dq, (head_dim, dtype)
