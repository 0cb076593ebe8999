"""haloattn.attention under torch.autocast casts its token tensors as autocast casts
F.scaled_dot_product_attention's: float32 (or the other 16-bit type) to autocast's dtype, float64
left alone, learned tables (rpb) untouched; outside autocast the inputs' dtypes decide."""

from __future__ import annotations

import pytest
import torch

import haloattn

import oracle

pytestmark = pytest.mark.usefixtures("plain_cpu_environment")


def tensors(seed, *dtypes, shape=(2, 6, 7, 2, 8)):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen).to(d).requires_grad_() for d in dtypes]


def test_float32_query_beside_bfloat16_keys_runs_in_bfloat16():
    """A float32 query (after a float32 rotary embedding, say) with bfloat16 keys and values: the
    call is the bfloat16 one, forward and backward, and its gradients come back in each input's dtype."""
    q, k, v = tensors(1, torch.float32, torch.bfloat16, torch.bfloat16)
    gen = torch.Generator().manual_seed(2)
    rpb = torch.randn(2, 5, 5, generator=gen, requires_grad=True)  # a float32 parameter stays float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = haloattn.attention(q, k, v, 3, rpb=rpb)
    assert out.dtype == torch.bfloat16
    grad = torch.randn(out.shape, generator=gen).bfloat16()
    grads = torch.autograd.grad(out, (q, k, v, rpb), grad)
    assert [g.dtype for g in grads] == [torch.float32, torch.bfloat16, torch.bfloat16, torch.float32]

    cast = q.detach().bfloat16().requires_grad_()
    explicit = haloattn.attention(cast, k, v, 3, rpb=rpb)
    expected = torch.autograd.grad(explicit, (cast, k, v, rpb), grad)
    assert torch.equal(out, explicit)
    assert torch.equal(grads[0], expected[0].float()) and all(torch.equal(a, b) for a, b in zip(grads[1:], expected[1:]))

    ref, _ = oracle.attention(q, k, v, 3, rpb=rpb)
    assert oracle.rel_error(out, ref) <= oracle.TOLERANCE[torch.bfloat16]


def test_float64_and_plain_calls_are_left_alone():
    q, k, v = tensors(3, torch.float64, torch.float64, torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert haloattn.attention(q, k, v, 3).dtype == torch.float64
    q32, kbf = tensors(4, torch.float32, torch.bfloat16)
    with pytest.raises(TypeError, match="must share one dtype"):  # no autocast: the dtypes must agree
        haloattn.attention(q32, kbf, kbf, 3)


def test_compiled_call_under_autocast():
    q, k = tensors(5, torch.float32, torch.bfloat16)

    @torch.compile(fullgraph=True, backend="eager")
    def f(q, k):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return haloattn.attention(q, k, k, (3, 5))

    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = haloattn.attention(q, k, k, (3, 5))
    compiled = f(q, k)
    assert compiled.dtype == torch.bfloat16 and torch.equal(compiled, eager)


@pytest.mark.parametrize("in_autocast", [False, True], ids=["plain", "autocast"])
def test_compiles_where_dynamo_cannot_trace_the_autocast_query(monkeypatch, in_autocast):
    """torch 2.11's dynamo cannot trace torch.amp.is_autocast_available, and a fullgraph compile of
    any model calling attention() failed on it (2026-11-29, on the GPU machine's torch); a graph
    break inside it stands in for that here: attention() must ask it outside the traced code."""
    original = torch.amp.is_autocast_available

    def untraceable(device_type):
        torch._dynamo.graph_break()
        return original(device_type)

    monkeypatch.setattr(torch.amp, "is_autocast_available", untraceable)
    torch._dynamo.reset()
    q, k = tensors(6, torch.float32, torch.bfloat16)
    q = q if in_autocast else q.detach().bfloat16()

    @torch.compile(fullgraph=True, backend="eager")
    def f(q, k):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=in_autocast):
            return haloattn.attention(q, k, k, (3, 5))

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=in_autocast):
        eager = haloattn.attention(q, k, k, (3, 5))
    assert torch.equal(f(q, k), eager)
