"""Second derivatives through haloattn.attention: gradients taken with create_graph=True and
differentiated again (gradient penalties, Hessian-vector products). The reference backend records
its backward and must match the float64 dense oracle differentiated twice by autograd, and
torch.autograd.gradgradcheck's finite differences; a first-order backend must raise, by name,
when a second derivative reaches it, and never drop its share silently."""

from __future__ import annotations

import pytest
import torch

import haloattn
from haloattn.dispatch import DISPATCHER

import oracle
from test_jvp import _NoRule as FirstOrderBackend

pytestmark = pytest.mark.usefixtures("plain_cpu_environment")


def rnd(gen, *shape, requires_grad=True):
    return torch.randn(*shape, dtype=torch.float64, generator=gen).requires_grad_(requires_grad)


def score_mod(score, b, h, q_idx, kv_idx):
    return score * (1.0 + 0.25 * h) - 0.1 * (q_idx - kv_idx).abs()


# (spatial, window, heads, kv_heads, extras, options)
CASES = {
    "1d_causal_dilated": ((11,), 3, 2, 2, (), dict(dilation=2, causal=True)),
    "2d_gqa_rpb_softcap_stride": ((5, 6), (3, 3), 4, 2, ("rpb",), dict(softcap=3.0, stride=(2, 1))),
    "2d_window_shift": ((4, 6), (2, 3), 2, 1, ("rpb",), dict(pattern="window", shift=(1, 1))),
    "3d_additional_tokens": ((3, 4, 3), (3, 3, 1), 2, 2, ("extra",), dict(causal=(True, False, False))),
    "1d_kq_conv": ((9,), 5, 2, 2, ("kq_conv",), {}),
    "2d_score_mod": ((4, 5), 3, 2, 1, (), dict(score_mod=score_mod)),
}


def make(name, seed, batch=2):
    spatial, window, heads, kv_heads, extras, options = CASES[name]
    gen = torch.Generator().manual_seed(seed)
    D, Dv = (2, 2) if batch == 1 else (3, 2)
    tensors = {"query": rnd(gen, batch, *spatial, heads, D), "key": rnd(gen, batch, *spatial, kv_heads, D),
               "value": rnd(gen, batch, *spatial, kv_heads, Dv)}
    K = window if isinstance(window, tuple) else (window,) * len(spatial)
    if "rpb" in extras:
        tensors["rpb"] = rnd(gen, heads, *(2 * k - 1 for k in K))
    if "kq_conv" in extras:
        tensors["kq_conv"] = (0.5 * torch.randn(heads, 2, 3, dtype=torch.float64, generator=gen)).requires_grad_()
    if "extra" in extras:
        tensors["additional_keys"] = rnd(gen, batch, 2, kv_heads, D)
        tensors["additional_values"] = rnd(gen, batch, 2, kv_heads, Dv)
    return window, options, tensors, gen


def loss(attend, window, options, tensors, gen_weights):
    """A loss whose dO depends on the output (so dO itself needs a gradient) and that reads the LSE."""
    out, lse = attend(window, options, tensors)
    w_out, w_lse = gen_weights(out.shape), gen_weights(lse.shape)
    return (out.pow(2) * w_out).sum() + (lse * w_lse).sum()


def haloattn_call(window, options, tensors):
    t = dict(tensors)
    return haloattn.attention(t.pop("query"), t.pop("key"), t.pop("value"), window, return_lse=True,
                              backend="reference", **t, **options)


def oracle_call(window, options, tensors):
    t = dict(tensors)
    return oracle.attention(t.pop("query"), t.pop("key"), t.pop("value"), window, **t, **options)


def hessian_vector_products(attend, window, options, tensors, seed):
    """(first-order gradients taken with create_graph=True, the gradient of <those, R>) for fixed
    random weights and directions R."""
    weights = torch.Generator().manual_seed(seed)
    names = list(tensors)
    grads = torch.autograd.grad(
        loss(attend, window, options, tensors, lambda s: torch.randn(s, dtype=torch.float64, generator=weights)),
        [tensors[n] for n in names], create_graph=True)
    directions = [torch.randn(g.shape, dtype=torch.float64, generator=weights) for g in grads]
    second = torch.autograd.grad(sum((g * r).sum() for g, r in zip(grads, directions)), [tensors[n] for n in names])
    return [g.detach() for g in grads], list(second)


@pytest.mark.parametrize("name", list(CASES))
def test_reference_second_derivatives_match_the_oracle(name):
    window, options, tensors, _ = make(name, seed=len(name))
    first, second = hessian_vector_products(haloattn_call, window, options, tensors, seed=3)
    ref_first, ref_second = hessian_vector_products(oracle_call, window, options, tensors, seed=3)
    for which, got, ref in (("first", first, ref_first), ("second", second, ref_second)):
        for n, g, r in zip(tensors, got, ref):
            assert oracle.rel_error(g, r) <= oracle.TOLERANCE[torch.float64], (which, n)


def test_one_tensor_as_query_key_and_value_gets_each_roles_gradient():
    """Self-attention passes one tensor three times; recorded per role, its gradient is the sum of
    the three (a first version took the total thrice)."""
    gen = torch.Generator().manual_seed(7)
    x = rnd(gen, 1, 6, 7, 2, 4)
    w = rnd(gen, 4, requires_grad=True)

    def f(attend):
        out, _ = attend(3, {}, {"query": x, "key": x, "value": x})
        return out.pow(2).sum() + (x * w).sum()

    for attend in (haloattn_call, oracle_call):
        g, = torch.autograd.grad(f(attend), x, create_graph=True)
        h = torch.autograd.grad(g.pow(2).sum(), (x, w))
        if attend is haloattn_call:
            got = (g.detach(), *h)
        else:
            ref = (g.detach(), *h)
    for a, b in zip(got, ref):
        assert oracle.rel_error(a, b) <= oracle.TOLERANCE[torch.float64]
    plain, = torch.autograd.grad(f(haloattn_call), x)  # the first-order backward agrees
    assert oracle.rel_error(plain, ref[0]) <= oracle.TOLERANCE[torch.float64]


# Small enough for finite differences of second order over every input element.
SMALL_CASES = {
    "2d_gqa_rpb_softcap": ((3, 4), (3, 2), 2, 1, ("rpb",), dict(softcap=3.0, causal=(False, True))),
    "3d_additional_tokens": ((2, 3, 2), (2, 2, 1), 1, 1, ("extra",), dict(dilation=(1, 1, 2))),
    "1d_kq_conv": ((7,), 3, 1, 1, ("kq_conv",), {}),
}


@pytest.mark.parametrize("name", list(SMALL_CASES))
def test_reference_passes_gradgradcheck(name, monkeypatch):
    monkeypatch.setitem(CASES, name, SMALL_CASES[name])
    window, options, tensors, _ = make(name, seed=11, batch=1)
    names = list(tensors)

    def fn(*ts):
        return haloattn_call(window, options, dict(zip(names, ts)))

    assert torch.autograd.gradgradcheck(fn, tuple(tensors.values()), eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.fixture
def first_order_backend():
    backend = FirstOrderBackend()  # a fused backend's stand-in: the reference's first-order backward
    haloattn.register_backend(backend)
    yield backend
    DISPATCHER.registry.backends.pop(backend.name, None)
    haloattn.clear_caches()


def test_first_order_backend_refuses_a_second_derivative_by_name(first_order_backend):
    """dO of ``out.sum()`` needs no gradient, yet the gradient depends on the inputs: it must carry
    a node that raises, not come back detached (which would drop this call's share silently)."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (rnd(gen, 1, 8, 2, 4) for _ in range(3))
    out = haloattn.attention(q, k, v, 3, backend=FirstOrderBackend.name)
    grads = torch.autograd.grad(out.sum(), (q, k, v), create_graph=True)
    ref_out, _ = oracle.attention(q, k, v, 3)
    ref = torch.autograd.grad(ref_out.sum(), (q, k, v))
    for g, r in zip(grads, ref):  # the first derivatives are right, and marked
        assert g.requires_grad
        assert oracle.rel_error(g, r) <= oracle.TOLERANCE[torch.float64]
    with pytest.raises(RuntimeError, match=rf"backend '{FirstOrderBackend.name}'.*first order.*backend='reference'"):
        torch.autograd.grad(grads[0].pow(2).sum(), q)
    # dO that needs a gradient itself (a loss not linear in the output), the penalty asked of the
    # inputs alone: it raises too.
    penalty, = torch.autograd.grad(haloattn.attention(q, k, v, 3, backend=FirstOrderBackend.name).pow(2).sum(), q,
                                   create_graph=True)
    with pytest.raises(RuntimeError, match=f"backend '{FirstOrderBackend.name}'"):
        torch.autograd.grad(penalty.pow(2).sum(), (k,))
    # Without create_graph nothing changes: plain gradients, no graph.
    plain = torch.autograd.grad(haloattn.attention(q, k, v, 3, backend=FirstOrderBackend.name).sum(), q)[0]
    assert not plain.requires_grad and oracle.rel_error(plain, ref[0]) <= oracle.TOLERANCE[torch.float64]


def test_custom_op_path_refuses_a_second_derivative():
    """Under a dispatch mode the call is the custom op (ops.compiled_attention): its gradients are
    first order too, and say so rather than come back detached."""
    from torch.utils.flop_counter import FlopCounterMode

    gen = torch.Generator().manual_seed(4)
    q, k, v = (rnd(gen, 1, 6, 5, 1, 2) for _ in range(3))
    with FlopCounterMode(display=False):
        out = haloattn.attention(q, k, v, 3, backend="reference")
        g, = torch.autograd.grad(out.sum(), q, create_graph=True)
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="custom op haloattn::attention"):
        torch.autograd.grad(g.pow(2).sum(), q)
