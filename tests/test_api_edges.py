"""The public API on unusual-but-valid and on invalid inputs, through the reference backend and the
Triton backends (``triton``, ``triton_window``) on CPU under Triton's interpreter.

Valid inputs (strided, permuted, expanded and overlapping views; stride-0 and transposed output
gradients; grids of extent 1, windows as long as the axis, even windows, ragged strides and
dilations; gradients for only some inputs) must give the float64 oracle's answer within
SEMANTICS.md section 7, forward and gradients. Invalid inputs must raise a ValueError/TypeError
naming the argument before any backend runs, and the caches that let repeated calls skip
validation must never let an invalid argument through (or make a valid one fail).

The interpreter is switched on only around the tests that run a Triton backend (as in
test_triton_neighborhood.py), so the reference tests here run as on a plain CPU machine.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import haloattn
import haloattn.nn as hnn
from haloattn.dispatch import BACKEND_ENV, DISPATCHER, BackendUnavailableError

import oracle

TRITON_BACKENDS = ("triton", "triton_window")


@pytest.fixture
def backend(request, monkeypatch):
    """The backend a test forces; the Triton ones run in the interpreter."""
    name = request.param
    if name in TRITON_BACKENDS:
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    return name


def with_backends(*names):
    return pytest.mark.parametrize("backend", names, indirect=True)


# ---------------------------------------------------------------------------------------------
# valid inputs against the oracle


def check(backend, make, leaf_shapes, window, *, dtype=torch.float32, seed=0, grad="random",
          no_grad=(), device="cpu", **options):
    """Fresh random leaves (float64 draws, cast to ``dtype``); ``make(leaves)`` builds
    ``(query, key, value, extra_kwargs)`` from them (views, expansions, slices); the same ``make``
    on float64 copies of the leaves gives the oracle's inputs. Compares output, LSE and the
    gradient of every leaf that requires one (all but those named in ``no_grad``).

    ``grad``: "random" (random output and LSE weights), "sum" (``out.sum() + lse.sum()``: the
    backward receives expanded, stride-0 gradients), "expanded" (an expanded random dO),
    "transposed" (dO and dLSE stored transposed), "strided" (dO a slice with step 2), or "lse"
    (a loss on the LSE only, so autograd passes no dO)."""
    gen = torch.Generator().manual_seed(seed)
    names = list(leaf_shapes)
    draws = {n: torch.randn(*leaf_shapes[n], generator=gen, dtype=torch.float64) for n in names}
    leaves = {n: draws[n].to(device=device, dtype=dtype).requires_grad_(n not in no_grad) for n in names}
    ref_leaves = {n: leaves[n].detach().cpu().double().requires_grad_(n not in no_grad) for n in names}

    q, k, v, extra = make(leaves)
    out, lse = haloattn.attention(q, k, v, window, return_lse=True, backend=backend, **extra, **options)
    out, lse = out.cpu(), lse.cpu()  # differentiable copies: the oracle and the comparisons run on the CPU
    rq, rk, rv, rextra = make(ref_leaves)
    ref_out, ref_lse = oracle.attention(rq, rk, rv, window, **rextra, **options)
    assert out.shape == ref_out.shape and out.dtype == dtype

    tol, lse_tol = oracle.TOLERANCE[dtype], oracle.LSE_TOLERANCE[dtype]
    err = oracle.rel_error(out, ref_out)
    assert err <= tol, f"output relative error {err} > {tol}"
    lse_err = (lse.double() - ref_lse).abs().max().item()
    assert lse_err <= lse_tol, f"lse max abs error {lse_err} > {lse_tol}"

    want = [n for n in names if n not in no_grad]
    if not want:
        return
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    d_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
    if grad == "sum":
        loss, ref_loss = out.sum() + lse.sum(), ref_out.sum() + ref_lse.sum()
    elif grad == "lse":
        loss, ref_loss = (lse * d_lse.float()).sum(), (ref_lse * d_lse).sum()
    else:
        d_out_t = d_out.to(dtype)
        if grad == "expanded":  # one value per row, stride 0 along the channels (cast first: .to copies)
            d_out_t = d_out_t[..., :1].expand(out.shape)
        elif grad == "transposed":
            d_out_t = d_out_t.transpose(0, -2).contiguous().transpose(0, -2)
        elif grad == "strided":
            d_out_t = torch.stack([d_out_t, torch.zeros_like(d_out_t)], dim=-1).flatten(-2)[..., ::2]
        d_out = d_out_t.double()
        # out * dO through a custom Function would see dO's layout; here autograd.grad gets it
        # directly as the gradient of the output
        loss_grads = (d_out_t, d_lse.float().transpose(0, -1).contiguous().transpose(0, -1)
                      if grad == "transposed" else d_lse.float())
        grads = torch.autograd.grad((out, lse), [leaves[n] for n in want], loss_grads)
        ref_grads = torch.autograd.grad((ref_out, ref_lse), [ref_leaves[n] for n in want], (d_out, d_lse))
        _compare_grads(want, grads, ref_grads, tol)
        return
    # a loss on the LSE alone does not reach the value
    grads = torch.autograd.grad(loss, [leaves[n] for n in want], allow_unused=True)
    ref_grads = torch.autograd.grad(ref_loss, [ref_leaves[n] for n in want], allow_unused=True)
    _compare_grads(want, grads, ref_grads, tol)


# A gradient that is exactly 0 (a window of one key: the softmax is constant) is computed as
# rounding noise of |dO| |V| size; for it the absolute norm is bounded instead.
ZERO_GRADIENT_NOISE = 1e-4


def _compare_grads(names, grads, ref_grads, tol):
    bad = {}
    for n, g, rg in zip(names, grads, ref_grads):
        if rg is None:  # not reached: no gradient, or an exact zero one
            assert g is None or not g.any(), n
            continue
        assert g is not None and g.shape == rg.shape, n
        g = g.cpu()
        if rg.norm() == 0:
            if not g.double().norm().item() <= ZERO_GRADIENT_NOISE:
                bad[n] = g.double().norm().item()
            continue
        e = oracle.rel_error(g, rg)
        if not e <= tol:
            bad[n] = e
    assert not bad, f"gradient relative errors above {tol}: {bad}"


def plain(spatial, heads=2, kv_heads=None, dim=16, value_dim=None, batch=1):
    """Leaf shapes and a ``make`` for ordinary contiguous q, k, v."""
    kv_heads, value_dim = kv_heads or heads, value_dim or dim
    shapes = dict(q=(batch, *spatial, heads, dim), k=(batch, *spatial, kv_heads, dim),
                  v=(batch, *spatial, kv_heads, value_dim))
    return (lambda t: (t["q"], t["k"], t["v"], {})), shapes


# (id, make, leaf shapes, window, options); each runs on every backend that can run it.
def _layouts():
    cases = []

    def add(name, make, shapes, window, **options):
        cases.append(pytest.param(make, shapes, window, options, id=name))

    add("query-permuted-from-BHLD", lambda t: (t["q"].permute(0, 2, 1, 3), t["k"], t["v"], {}),
        dict(q=(2, 3, 10, 16), k=(2, 10, 3, 16), v=(2, 10, 3, 16)), 3)
    add("key-head-dim-not-unit-stride", lambda t: (t["q"], t["k"].transpose(-1, -2), t["v"], {}),
        dict(q=(2, 10, 3, 16), k=(2, 10, 16, 3), v=(2, 10, 3, 16)), 3)
    add("query-step-slices", lambda t: (t["q"][:, ::2, :, ::2], t["k"], t["v"], {}),
        dict(q=(2, 20, 3, 32), k=(2, 10, 3, 16), v=(2, 10, 3, 16)), 5)
    add("query-expanded-batch", lambda t: (t["q"].expand(2, -1, -1, -1), t["k"], t["v"], {}),
        dict(q=(1, 10, 3, 16), k=(2, 10, 3, 16), v=(2, 10, 3, 16)), 3)
    add("kv-expanded-heads", lambda t: (t["q"], t["k"].expand(-1, -1, 3, -1), t["v"].expand(-1, -1, 3, -1), {}),
        dict(q=(2, 10, 3, 16), k=(2, 10, 1, 16), v=(2, 10, 1, 16)), 3)
    add("query-expanded-tokens", lambda t: (t["q"].expand(2, 10, 3, 16), t["k"], t["v"], {}),
        dict(q=(1, 1, 1, 16), k=(2, 10, 3, 16), v=(2, 10, 3, 16)), 3)
    add("query-from-NCHW-channels-last", lambda t: (t["q"].permute(0, 2, 3, 1).unflatten(-1, (2, 8)), t["k"], t["v"], {}),
        dict(q=(2, 16, 6, 7), k=(2, 6, 7, 2, 8), v=(2, 6, 7, 2, 8)), (3, 3))
    add("packed-qkv-projection", lambda t: (*t["x"].unflatten(-1, (3, 2, 16)).unbind(-3), {}),
        dict(x=(2, 6, 7, 96)), (3, 5))
    add("offset-odd-head-stride-transposed-value",
        lambda t: (t["q"][..., 1:6], t["k"], t["v"].transpose(1, 2), {}),
        dict(q=(2, 6, 7, 2, 7), k=(2, 6, 7, 2, 5), v=(2, 7, 6, 2, 5)), (3, 3))
    add("overlapping-kv-views",
        lambda t: (t["q"], t["s"].as_strided((1, 6, 6, 2, 8), (100, 12, 2, 8, 1)),
                   t["s"].as_strided((1, 6, 6, 2, 8), (100, 12, 2, 8, 1), 3), {}),
        dict(q=(1, 6, 6, 2, 8), s=(200,)), (2, 3))
    add("rpb-transposed", lambda t: (t["q"], t["k"], t["v"], dict(rpb=t["r"].t())),
        dict(q=(1, 10, 3, 16), k=(1, 10, 3, 16), v=(1, 10, 3, 16), r=(5, 3)), 3)
    add("rpb-expanded-heads", lambda t: (t["q"], t["k"], t["v"], dict(rpb=t["r"].expand(3, 5, 7))),
        dict(q=(1, 6, 8, 3, 16), k=(1, 6, 8, 3, 16), v=(1, 6, 8, 3, 16), r=(1, 5, 7)), (3, 4))
    return cases


LAYOUTS = _layouts()


@with_backends("reference", "triton", "triton_window")
@pytest.mark.parametrize("make,shapes,window,options", LAYOUTS)
def test_layouts(backend, make, shapes, window, options):
    if backend == "triton_window":
        options = dict(options, pattern="window")
    check(backend, make, shapes, window, **options)


# The same kind of layouts at a 16-bit head dim of 128, for the compiled kernels on a GPU: there
# K/V tiles come through tensor descriptors (TMA) where every stride allows it and by pointer
# where not (a 2-byte offset, a zero stride), and the cuda backend builds tensor maps from the
# tensors' own strides; the CPU interpreter never takes the descriptors' alignment decisions.
def _wide_layouts():
    def qkv(spatial, heads=2, kv_heads=2):
        return dict(q=(2, *spatial, heads, 128), k=(2, *spatial, kv_heads, 128), v=(2, *spatial, kv_heads, 128))

    return [
        pytest.param(lambda t: (*t["x"].unflatten(-1, (3, 2, 128)).unbind(-3), {}), dict(x=(2, 12, 13, 768)),
                     (5, 7), id="packed-qkv-projection"),
        pytest.param(lambda t: (t["q"], t["k"].expand(-1, -1, -1, 4, -1), t["v"].expand(-1, -1, -1, 4, -1), {}),
                     qkv((12, 13), 4, 1), (5, 7), id="kv-expanded-heads"),
        pytest.param(lambda t: (t["q"].expand(2, -1, -1, -1, -1), t["k"], t["v"], {}),
                     dict(qkv((12, 13)), q=(1, 12, 13, 2, 128)), (5, 7), id="query-expanded-batch"),
        pytest.param(lambda t: (t["q"], t["k"], t["v"].transpose(1, 2), {}),
                     dict(qkv((12, 13)), v=(2, 13, 12, 2, 128)), (5, 7), id="value-axes-swapped"),
        pytest.param(lambda t: (t["q"][..., 1:129], t["k"][..., 1:129], t["v"], {}),
                     dict(qkv((12, 13)), q=(2, 12, 13, 2, 130), k=(2, 12, 13, 2, 130)), (5, 7),
                     id="qk-2-byte-offset"),
        pytest.param(lambda t: (t["q"], t["k"][:, ::2], t["v"][:, ::2], {}),
                     dict(qkv((12, 13)), k=(2, 24, 13, 2, 128), v=(2, 24, 13, 2, 128)), (5, 7),
                     id="kv-every-other-row"),
        pytest.param(lambda t: (t["q"].permute(0, 2, 1, 3), t["k"].permute(0, 2, 1, 3), t["v"], {}),
                     dict(qkv((300,)), q=(2, 2, 300, 128), k=(2, 2, 300, 128)), 65, id="qk-from-BHLD"),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("backend_name", ["triton", "cuda"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("make,shapes,window", _wide_layouts())
def test_wide_layouts_compiled(backend_name, dtype, make, shapes, window, monkeypatch):
    """Strided, expanded, offset and permuted inputs at head dim 128 through the compiled kernels
    (Triton, and the cuda backend where it is built), forward, LSE and every gradient against
    the float64 oracle."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    unavailable = DISPATCHER.get(backend_name).available()
    if unavailable:  # the cuda module not built on this machine, say
        pytest.skip(f"{backend_name}: {'; '.join(unavailable)}")
    check(backend_name, make, shapes, window, dtype=dtype, device="cuda", seed=4)


def _additional(t):
    return (t["q"], t["k"], t["v"], dict(additional_keys=t["ak"].transpose(1, 2)[:, ::2],
                                         additional_values=t["av"].permute(0, 3, 2, 1)))


@with_backends("reference", "triton")
def test_additional_tokens_as_views(backend):
    check(backend, _additional, dict(q=(1, 8, 2, 16), k=(1, 8, 2, 16), v=(1, 8, 2, 8), ak=(1, 2, 6, 16),
                                     av=(1, 8, 2, 3)), 3)


@with_backends("reference", "triton", "triton_window")
@pytest.mark.parametrize("grad", ["sum", "expanded", "transposed", "strided", "lse"])
def test_output_gradient_layouts(backend, grad):
    make, shapes = plain((7, 5))
    pattern = "window" if backend == "triton_window" else "neighborhood"
    check(backend, make, shapes, (3, 3), grad=grad, pattern=pattern, seed=1)


# (id, spatial, window, options, plain() kwargs)
SIZES = [
    ("extent-1-axis", (1, 7), (1, 3), {}, {}),
    ("extent-1-rank-1", (1,), 1, {}, {}),
    ("extent-1-two-axes-3d", (1, 9, 1), (1, 3, 1), dict(causal=(True, False, False)), {}),
    ("window-equals-extent", (6, 5), (6, 5), {}, {}),
    ("window-equals-extent-causal", (6, 5), (6, 5), dict(causal=(True, False)), {}),
    ("even-window", (8,), 4, {}, {}),
    ("even-window-stride", (9,), 4, dict(stride=2), {}),
    ("window-times-dilation-equals-extent", (9,), 3, dict(dilation=3), {}),
    ("dilation-not-dividing", (10,), 3, dict(dilation=3), {}),
    ("stride-not-dividing", (10,), 4, dict(stride=4), {}),
    ("stride-equals-window-equals-extent", (5,), 5, dict(stride=5), {}),
    ("causal-window-1", (7, 3), 1, dict(causal=True), {}),
    ("window-1", (5,), 1, {}, {}),
    ("dilation-stride-causal", (11,), 3, dict(dilation=2, stride=3, causal=True), {}),
    ("mqa-dv", (8,), 3, {}, dict(heads=4, kv_heads=1, value_dim=24, dim=8)),
    ("head-dim-1", (8,), 3, {}, dict(dim=1, value_dim=1)),
    ("head-dim-3-dv-5", (8,), 3, {}, dict(dim=3, value_dim=5)),
    ("scale-0-negative", (8,), 3, dict(scale=0.0), {}),
    ("swin-window-equals-extent-shift", (6,), 6, dict(pattern="window", shift=5), {}),
    ("swin-not-dividing", (7, 5), (3, 2), dict(pattern="window"), {}),
    ("swin-window-1", (7,), 1, dict(pattern="window"), {}),
    ("swin-dilation-equals-extent", (8, 6), (2, 3), dict(pattern="window", dilation=(4, 2), shift=(1, 0)), {}),
    ("swin-causal-even", (8,), 4, dict(pattern="window", causal=True, shift=2), {}),
    ("swin-extent-1-shift", (1, 5, 1), (1, 4, 1), dict(pattern="window", shift=(0, 3, 0)), {}),
]


@with_backends("reference", "triton", "triton_window")
@pytest.mark.parametrize("spatial,window,options,shape", [pytest.param(*c[1:], id=c[0]) for c in SIZES])
def test_sizes_at_the_edges(backend, spatial, window, options, shape):
    if backend == "triton_window" and options.get("pattern") != "window":
        pytest.skip("triton_window runs pattern 'window' only")
    make, shapes = plain(spatial, **shape)
    check(backend, make, shapes, window, seed=len(spatial), **options)


@with_backends("reference", "triton", "triton_window")
@pytest.mark.parametrize("no_grad", [("q", "k"), ("q", "v"), ("k", "v"), ("q", "k", "v"), ("r",)],
                         ids=["only-value", "only-key", "only-query", "only-rpb", "all-but-rpb"])
def test_gradients_for_some_inputs(backend, no_grad):
    make, shapes = plain((6, 6))
    shapes["r"] = (2, 5, 5)
    pattern = "window" if backend == "triton_window" else "neighborhood"
    check(backend, lambda t: (t["q"], t["k"], t["v"], dict(rpb=t["r"])), shapes, (3, 3), no_grad=no_grad,
          pattern=pattern, seed=2)


@with_backends("reference", "triton", "triton_window")
def test_one_tensor_as_query_key_and_value(backend):
    pattern = "window" if backend == "triton_window" else "neighborhood"
    check(backend, lambda t: (t["x"], t["x"], t["x"], {}), dict(x=(1, 6, 7, 2, 16)), (3, 3), pattern=pattern)


@with_backends("reference", "triton", "triton_window")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_float32_rpb_beside_16_bit_tokens(backend, dtype):
    make, shapes = plain((6, 6))
    shapes["r"] = (2, 5, 5)
    pattern = "window" if backend == "triton_window" else "neighborhood"

    def with_rpb(t):
        q, k, v, _ = make(t)
        return q, k, v, dict(rpb=t["r"].float())  # a float32 table, as autocast leaves it

    check(backend, with_rpb, shapes, (3, 3), dtype=dtype, pattern=pattern, seed=3)


# ---------------------------------------------------------------------------------------------
# invalid inputs: a clear error before any backend runs


def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=torch.float64).to(
        dtype=dtype, device=device)


def _qkv(spatial=(8,), H=2, Hkv=2, D=16, Dv=16, B=1, dtype=torch.float32):
    return (_t(B, *spatial, H, D, dtype=dtype), _t(B, *spatial, Hkv, D, dtype=dtype),
            _t(B, *spatial, Hkv, Dv, dtype=dtype))


@dataclasses.dataclass
class ScaledScores:
    """A callable score_mod as a @dataclass: its generated __eq__ makes it unhashable."""

    factor: float

    def __call__(self, s, b, h, q_idx, kv_idx):
        return s * self.factor


@dataclasses.dataclass(eq=False)
class HashableScaledScores:
    """The same as a @dataclass(eq=False): hashed by identity, a valid score_mod."""

    factor: float

    def __call__(self, s, b, h, q_idx, kv_idx):
        return s * self.factor


@dataclasses.dataclass
class CausalMask:
    def __call__(self, b, h, q_idx, kv_idx):
        return q_idx >= kv_idx


# (id, exception, builder of (args, kwargs), substrings of the message)
BAD = [
    ("batch-0", ValueError, lambda: (_qkv(B=0) + (3,), {}), ["empty batch axis", "length 0"]),
    ("spatial-0", ValueError, lambda: (_qkv((4, 0)) + (1,), {}), ["axis 1", "empty", "length 0"]),
    ("window-larger-than-axis", ValueError, lambda: (_qkv((8,)) + (9,), {}), ["window 9", "axis 0", "8"]),
    ("swin-window-larger-than-axis", ValueError, lambda: (_qkv((6, 6)) + ((3, 7),), dict(pattern="window")),
     ["window 7", "axis 1", "6"]),
    ("window-negative", ValueError, lambda: (_qkv() + (-1,), {}), ["window", "axis 0", "-1", ">= 1"]),
    ("dilation-negative", ValueError, lambda: (_qkv() + (3,), dict(dilation=-1)), ["dilation", "axis 0", "-1", ">= 1"]),
    ("stride-negative", ValueError, lambda: (_qkv() + (3,), dict(stride=-2)), ["stride", "axis 0", "-2"]),
    ("window-numpy-int", TypeError, lambda: (_qkv() + (np.int64(3),), {}), ["window", "axis 0", "int64", "int"]),
    ("window-tensor", TypeError, lambda: (_qkv() + ((torch.tensor(3),),), {}), ["window", "axis 0", "Tensor"]),
    ("window-wrong-rank", ValueError, lambda: (_qkv((6, 6)) + ((3,),), {}), ["window", "1 entries", "rank 2"]),
    ("causal-list-wrong-length", ValueError, lambda: (_qkv() + (3,), dict(causal=[True, False])),
     ["causal", "2 entries", "rank 1"]),
    ("causal-numpy-bool", TypeError, lambda: (_qkv() + (3,), dict(causal=np.True_)), ["causal", "axis 0", "bool"]),
    ("causal-none", TypeError, lambda: (_qkv() + (3,), dict(causal=None)), ["causal", "axis 0", "None", "bool"]),
    ("pattern-case", ValueError, lambda: (_qkv() + (3,), dict(pattern="Window")), ["pattern", "'Window'", "'window'"]),
    ("pattern-none", ValueError, lambda: (_qkv() + (3,), dict(pattern=None)), ["pattern", "None"]),
    ("bool-tensors", TypeError, lambda: (tuple(x > 0 for x in _qkv()) + (3,), {}), ["query", "torch.bool", "float32"]),
    ("complex-tensors", TypeError, lambda: (tuple(x.to(torch.complex64) for x in _qkv()) + (3,), {}),
     ["query", "complex64"]),
    ("float8-tensors", TypeError, lambda: (tuple(x.to(torch.float8_e4m3fn) for x in _qkv()) + (3,), {}),
     ["query", "float8_e4m3fn"]),
    ("value-dtype", TypeError, lambda: (_qkv()[:2] + (_qkv(dtype=torch.float64)[2], 3), {}),
     ["share one dtype", "float64"]),
    ("value-device", ValueError, lambda: (_qkv()[:2] + (_qkv()[2].to("meta"), 3), {}), ["one device", "meta"]),
    ("rpb-int", TypeError, lambda: (_qkv() + (3,), dict(rpb=torch.ones(2, 5, dtype=torch.int64))), ["rpb", "int64"]),
    ("rpb-float16-beside-float32", TypeError, lambda: (_qkv() + (3,), dict(rpb=_t(2, 5, dtype=torch.float16))),
     ["rpb", "float16", "float32"]),
    ("rpb-kv-heads", ValueError, lambda: (_qkv(H=4, Hkv=2) + (3,), dict(rpb=_t(2, 5))), ["rpb", "(2, 5)", "(4, 5)"]),
    ("rpb-rank", ValueError, lambda: (_qkv((6, 6)) + (3,), dict(rpb=_t(2, 5))), ["rpb", "(2, 5)", "(2, 5, 5)"]),
    ("rpb-device", ValueError, lambda: (_qkv() + (3,), dict(rpb=_t(2, 5, device="meta"))), ["rpb", "meta", "cpu"]),
    ("kv-heads-above-heads", ValueError, lambda: (_qkv(H=2, Hkv=4) + (3,), {}), ["heads 2", "4", "H % H_kv"]),
    ("gqa-not-divisible", ValueError, lambda: (_qkv(H=4, Hkv=3) + (3,), {}), ["heads 4", "3", "divisible"]),
    ("softcap-string", ValueError, lambda: (_qkv() + (3,), dict(softcap="2")), ["softcap", "'2'"]),
    ("scale-int-beyond-float", TypeError, lambda: (_qkv() + (3,), dict(scale=10 ** 400)), ["scale=1000", "finite float"]),
    ("softcap-int-beyond-float", ValueError, lambda: (_qkv() + (3,), dict(softcap=10 ** 400)),
     ["softcap=1000", "finite float > 0"]),
    ("scale-tensor", TypeError, lambda: (_qkv() + (3,), dict(scale=torch.tensor(0.5))), ["scale", "finite float"]),
    ("unhashable-score-mod", TypeError, lambda: (_qkv() + (3,), dict(score_mod=ScaledScores(0.5))),
     ["score_mod", "ScaledScores", "not hashable", "eq=False"]),
    ("unhashable-mask-mod", TypeError, lambda: (_qkv() + (3,), dict(mask_mod=CausalMask())),
     ["mask_mod", "CausalMask", "not hashable"]),
    ("backend-list", TypeError, lambda: (_qkv() + (3,), dict(backend=["reference"])),
     ["backend=['reference']", "backend name"]),
    ("backend-set", TypeError, lambda: (_qkv() + (3,), dict(backend={"triton"})), ["backend={'triton'}"]),
    ("backend-case", ValueError, lambda: (_qkv() + (3,), dict(backend="Triton")), ["'Triton'", "does not exist"]),
    ("window-nested-list", TypeError, lambda: (_qkv() + ([[3]],), {}), ["window on axis 0 is [3]", "int"]),
    ("stride-set", TypeError, lambda: (_qkv() + (3,), dict(stride={1})), ["stride on axis 0 is {1}", "int"]),
]


@pytest.fixture
def no_backend_may_run(monkeypatch):
    """Every backend's forward and backward raise: validation errors must come before them."""
    def ran(*args, **kwargs):
        raise AssertionError("a backend ran on invalid input")

    for b in DISPATCHER.backends():
        for method in ("forward", "backward", "forward_with_state", "jvp"):
            monkeypatch.setattr(b, method, ran)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv(BACKEND_ENV, raising=False)


@pytest.mark.parametrize("forced", [None, "reference", "triton"])
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_raises_before_any_backend(case, forced, no_backend_may_run):
    name, exc, build, needles = case
    args, kwargs = build()
    if forced is not None and "backend" not in kwargs:
        kwargs = dict(kwargs, backend=forced)
    elif forced is not None:
        pytest.skip("the case is about the backend argument")
    with pytest.raises(exc) as info:
        haloattn.attention(*args, **kwargs)
    for needle in needles:
        assert needle in str(info.value), f"{needle!r} missing from {str(info.value)!r}"


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_raises_the_same_on_meta_tensors(case, no_backend_may_run):
    """Meta tensors (shape inference; the path torch.compile's fake implementation takes) validate
    exactly as real ones: same exception, same message."""
    name, exc, build, needles = case
    if name in ("value-device", "rpb-device"):
        pytest.skip("on meta tensors every tensor is on the query's device")
    args, kwargs = build()

    def to_meta(a):
        return a.to("meta") if isinstance(a, torch.Tensor) else a

    with pytest.raises(exc) as info:
        haloattn.attention(*map(to_meta, args), **{n: to_meta(a) for n, a in kwargs.items()})
    for needle in needles:
        assert needle in str(info.value), f"{needle!r} missing from {str(info.value)!r}"


# (valid options, invalid options that compare equal to them, exception, message substrings)
LOOKALIKES = [
    (dict(window=3), dict(window=3.0), TypeError, ["window on axis 0 is 3.0"]),
    (dict(window=(3,)), dict(window=(3.0,)), TypeError, ["window on axis 0 is 3.0"]),
    (dict(window=3), dict(window=np.int64(3)), TypeError, ["window on axis 0", "int64"]),
    (dict(window=3, dilation=1), dict(window=3, dilation=True), TypeError, ["dilation on axis 0 is True"]),
    (dict(window=3, stride=1), dict(window=3, stride=1.0), TypeError, ["stride on axis 0 is 1.0"]),
    (dict(window=3, causal=True), dict(window=3, causal=1), TypeError, ["causal on axis 0 is 1"]),
    (dict(window=3, causal=[False]), dict(window=3, causal=[0]), TypeError, ["causal on axis 0 is 0"]),
    (dict(window=3, pattern="window", shift=1), dict(window=3, pattern="window", shift=1.0), TypeError,
     ["shift on axis 0 is 1.0"]),
    (dict(window=3, scale=1), dict(window=3, scale=True), TypeError, ["scale=True"]),
    (dict(window=3, softcap=1), dict(window=3, softcap=True), ValueError, ["softcap=True"]),
    (dict(window=3, return_lse=True), dict(window=3, return_lse=1), TypeError, ["return_lse", "bool"]),
]


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("good,bad,exc,needles", LOOKALIKES,
                         ids=[f"{list(c[1].items())[-1][0]}={list(c[1].items())[-1][1]!r}" for c in LOOKALIKES])
def test_cached_calls_still_validate(device, good, bad, exc, needles, monkeypatch):
    """Repeated calls skip validation through caches keyed on the arguments (api._CALLS, and the
    custom op's specs on meta tensors and under torch.compile). 3 == 3.0 and True == 1 in Python,
    with equal hashes: keyed by value, window=3.0 after window=3 ran unvalidated as 3, and a
    refused window=3.0 first made every later valid window=3 call on meta tensors fail."""
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    haloattn.clear_caches()
    q, k, v = (t.to(device) for t in _qkv((9,)))

    def call(options):
        options = dict(options)
        return haloattn.attention(q, k, v, options.pop("window"), backend="reference", **options)

    for _ in range(2):  # the bad call refused before and after a good one, the good one always run
        with pytest.raises(exc) as info:
            call(bad)
        for needle in needles:
            assert needle in str(info.value)
        call(good)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_forced_backend_checked_on_meta_tensors_too(device, monkeypatch):
    """An unknown forced backend (argument or HALOATTN_BACKEND) raises on meta tensors as on
    real ones; before, the fake implementation ignored it."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v = (t.to(device) for t in _qkv())
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    with pytest.raises(ValueError, match="backend='nope' does not exist"):
        haloattn.attention(q, k, v, 3, backend="nope")
    monkeypatch.setenv(BACKEND_ENV, "reference,nope")
    with pytest.raises(ValueError, match=f"{BACKEND_ENV}='reference,nope': backend='nope' does not exist"):
        haloattn.attention(q, k, v, 3)
    monkeypatch.setenv(BACKEND_ENV, "reference")
    assert haloattn.attention(q, k, v, 3).shape == q.shape


def test_forced_backend_that_cannot_run_says_why(monkeypatch):
    """No silent fallback: a forced backend that cannot run the problem raises with its reasons."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = _qkv(dtype=torch.float64)
    with pytest.raises(BackendUnavailableError, match="float64 runs on the reference backend"):
        haloattn.attention(q, k, v, 3, backend="triton")
    monkeypatch.setenv(BACKEND_ENV, "triton")
    with pytest.raises(BackendUnavailableError, match="forced by HALOATTN_BACKEND"):
        haloattn.attention(q, k, v, 3)


def test_hashable_callable_mods_run():
    """A callable object that hashes (a @dataclass(eq=False)) is a valid score_mod."""
    q, k, v = _qkv()
    mod = HashableScaledScores(0.5)
    out = haloattn.attention(q, k, v, 3, score_mod=mod, backend="reference")
    ref, _ = oracle.attention(q, k, v, 3, score_mod=mod)
    assert oracle.rel_error(out, ref) <= oracle.TOLERANCE[torch.float32]


@pytest.mark.parametrize("window,exc,needle", [
    (0, ValueError, "window on axis 0 is 0; it must be >= 1"),
    ((3, -1), ValueError, "window on axis 1 is -1; it must be >= 1"),
    (3.0, TypeError, "window on axis 0 is 3.0 (float); expected an int"),
    ((3, 3, 3), ValueError, "has 3 entries but the token grid has rank 2"),
])
@pytest.mark.parametrize("block", [hnn.WindowAttention, hnn.NeighborhoodAttention2d])
def test_blocks_check_window_when_built(block, window, exc, needle):
    """nn blocks size their rpb table from the window when built: a bad window gets the same
    message as attention() gives, not torch.empty's negative-dimension error."""
    if block is hnn.WindowAttention and isinstance(window, tuple) and len(window) == 3:
        pytest.skip("WindowAttention takes its rank from the window")
    with pytest.raises(exc) as info:
        block(16, 2, window, rpb=True)
    assert needle in str(info.value)


def test_backend_environment_variable_edges(monkeypatch):
    """HALOATTN_BACKEND: blank means unset, a list of blanks names no backend, an unknown entry of
    a list raises, and the backend= argument wins over it."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v = _qkv()
    monkeypatch.setenv(BACKEND_ENV, "")
    assert haloattn.attention(q, k, v, 3).shape == q.shape
    monkeypatch.setenv(BACKEND_ENV, " , ")
    with pytest.raises(ValueError, match="HALOATTN_BACKEND=' , ' names no backend"):
        haloattn.attention(q, k, v, 3)
    monkeypatch.setenv(BACKEND_ENV, "triton")  # cannot run without the interpreter, but the argument wins
    assert haloattn.explain(q, k, v, 3, backend="reference", verbose=False).chosen == "reference"
    assert haloattn.attention(q, k, v, 3, backend="reference").shape == q.shape
