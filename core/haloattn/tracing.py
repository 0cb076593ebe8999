"""Calls under ``torch.jit.trace`` and the TorchScript-based ``torch.onnx.export``.

A trace records the torch operations a call runs. A fused backend's kernel launch is not one: the
trace would hold no attention at all. Under tracing the call therefore runs the reference
backend's forward, whose gathers, products and softmax are torch operations, so the trace (and an
ONNX graph made from it) computes the contract. Like every trace it is specialised to the traced
shapes: the key indices of each query are computed in Python from them. ``torch.compile`` and
``torch.export`` keep the fused kernels (one custom op per call) and are the way to deploy them.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Optional, Sequence

import torch

from .backend import AttentionInputs
from .dispatch import DISPATCHER, SlowPathWarning
from .problem import build_problem

TRACED_BACKEND = "reference"


@contextlib.contextmanager
def paused():
    """Nothing in the block is recorded by an active torch.jit trace: its tensors enter the trace
    as constants. For values computed once from a problem's sizes and cached across calls (a
    cached tensor recorded by one trace would be an unknown value to the next)."""
    state = torch._C._get_tracing_state()
    if state is None:
        yield
        return
    torch._C._set_tracing_state(None)
    try:
        yield
    finally:
        torch._C._set_tracing_state(state)


def untraced(fn):
    """``fn`` run outside any active trace (see :func:`paused`)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with paused():
            return fn(*args, **kwargs)
    return run


def attention(tensors: Sequence[Optional[torch.Tensor]], options: dict, backend: Optional[str]):
    """(out, lse) of a traced call, through the reference backend's torch operations."""
    force = DISPATCHER._forced(backend)  # validates the names as an untraced call would
    if force is not None and TRACED_BACKEND not in force[1]:
        source, names = force
        raise ValueError(
            f"haloattn.attention: backend {','.join(names)!r} cannot be traced by torch.jit.trace / "
            f"torch.onnx.export (forced by {source}): a trace records torch operations, and a fused backend's kernel "
            f"launches are none; traced calls run backend '{TRACED_BACKEND}' (torch.compile and torch.export keep "
            "the fused kernels)")
    query = tensors[0]
    with paused():  # sizes read as Python ints, not traced values: the trace is shape-specialised anyway
        q, k, v, rpb, kq_conv, additional_keys, additional_values = tensors
        problem = build_problem(q, k, v, rpb=rpb, kq_conv=kq_conv, additional_keys=additional_keys,
                                additional_values=additional_values, **options)
    if query.device.type != "cpu":
        warnings.warn(
            f"haloattn: {problem.describe()} is traced (torch.jit.trace / torch.onnx.export) through the "
            f"pure-PyTorch reference backend on {query.device}: a trace records torch operations, which a fused "
            "kernel launch is not. torch.compile and torch.export keep the fused kernels.",
            SlowPathWarning, stacklevel=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return DISPATCHER.get(TRACED_BACKEND).forward_for_trace(problem, AttentionInputs(*tensors))
