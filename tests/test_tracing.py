"""torch.jit.trace and the TorchScript-based torch.onnx.export: a traced call records the reference
backend's out-of-place torch operations (haloattn.tracing), so the trace, and the ONNX graph made
from it, compute the contract on new inputs of the traced shapes."""

from __future__ import annotations

import io

import pytest
import torch

import haloattn
from haloattn.nn import NeighborhoodAttention2d

import oracle

pytestmark = pytest.mark.usefixtures("plain_cpu_environment")


def randn(gen, *shape):
    return torch.randn(*shape, dtype=torch.float64, generator=gen)


def call(q, k, v, rpb, ak, av):
    return haloattn.attention(q, k, v, (3, 5), dilation=(2, 1), causal=(False, True), rpb=rpb,
                              additional_keys=ak, additional_values=av, softcap=4.0)


def shapes():
    return [(2, 7, 9, 4, 6), (2, 7, 9, 2, 6), (2, 7, 9, 2, 5), (4, 5, 9), (2, 3, 2, 6), (2, 3, 2, 5)]


def test_traced_call_matches_the_oracle_on_new_inputs():
    gen = torch.Generator().manual_seed(1)
    traced = torch.jit.trace(call, tuple(randn(gen, *s) for s in shapes()))  # check_trace: two traces agree
    fresh = [randn(gen, *s) for s in shapes()]
    q, k, v, rpb, ak, av = fresh
    ref, _ = oracle.attention(q, k, v, (3, 5), dilation=(2, 1), causal=(False, True), rpb=rpb,
                              additional_keys=ak, additional_values=av, softcap=4.0)
    assert oracle.rel_error(traced(*fresh), ref) <= oracle.TOLERANCE[torch.float64]


def test_traced_module_matches_eager_and_keeps_gradients():
    torch.manual_seed(2)
    module = NeighborhoodAttention2d(16, 2, 3, rpb=True).double()
    x = torch.randn(2, 6, 7, 16, dtype=torch.float64)
    traced = torch.jit.trace(module, x)
    fresh = torch.randn(2, 6, 7, 16, dtype=torch.float64, requires_grad=True)
    out, eager = traced(fresh), module(fresh)
    assert oracle.rel_error(out, eager) <= oracle.TOLERANCE[torch.float64]
    grads = torch.autograd.grad(out.pow(2).sum(), (fresh, module.rpb))
    expected = torch.autograd.grad(eager.pow(2).sum(), (fresh, module.rpb))
    assert all(oracle.rel_error(g, e) <= oracle.TOLERANCE[torch.float64] for g, e in zip(grads, expected))


def test_a_fused_backend_forced_under_tracing_is_refused_by_name():
    x = torch.randn(1, 8, 2, 4)
    with pytest.raises(ValueError, match="backend 'triton' cannot be traced"):
        torch.jit.trace(lambda q: haloattn.attention(q, q, q, 3, backend="triton"), (x,))


def test_onnx_export_runs_in_onnxruntime():
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(3)
    module = NeighborhoodAttention2d(8, 2, (3, 5), dilation=(2, 1), rpb=True).eval()
    buffer = io.BytesIO()
    torch.onnx.export(module, (torch.randn(2, 7, 9, 8),), buffer, dynamo=False, input_names=["x"])
    session = ort.InferenceSession(buffer.getvalue())
    fresh = torch.randn(2, 7, 9, 8)
    got = torch.from_numpy(session.run(None, {"x": fresh.numpy()})[0])
    assert oracle.rel_error(got, module(fresh).detach()) <= oracle.TOLERANCE[torch.float32]
