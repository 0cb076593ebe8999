"""Tensors -> the integer arguments of ``haloattn_cuda._C`` (pointers, element strides, padded
shapes, the current stream), and the output buffers the kernels write."""

from __future__ import annotations

import os
from typing import Optional

import torch

from haloattn.backend import AttentionInputs
from haloattn.problem import Problem

from .module import load

RANK = 3  # the kernels see every grid as rank 3, padded with leading unit axes
DTYPE_CODE = {torch.float16: 0, torch.bfloat16: 1}
PATTERN_CODE = {"neighborhood": 0, "window": 1}


# HALOATTN_CUDA_FORWARD and HALOATTN_CUDA_BACKWARD pick the kernels of each pass: auto (the
# Hopper wgmma kernels on sm_90 devices where their TMA copies can read the layout, and for the
# forward scale > 0; else the portable mma.sync ones), or force portable / hopper (benchmarks and
# tests compare them).
KERNEL_CHOICE_CODE = {"auto": 0, "portable": 1, "hopper": 2}


def _kernel_choice(variable: str) -> int:
    name = os.environ.get(variable, "auto")
    if name not in KERNEL_CHOICE_CODE:
        raise ValueError(f"{variable}={name!r}; allowed: {', '.join(KERNEL_CHOICE_CODE)}")
    return KERNEL_CHOICE_CODE[name]


def forward_kernel_code() -> int:
    return _kernel_choice("HALOATTN_CUDA_FORWARD")


def backward_kernel_code() -> int:
    return _kernel_choice("HALOATTN_CUDA_BACKWARD")


def _kernel_ready(t: torch.Tensor) -> torch.Tensor:
    """The kernels copy rows in 16-byte pieces: contiguous head dim, 16-byte aligned rows."""
    item = t.element_size()
    aligned = t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all((s * item) % 16 == 0 for s in t.stride()[:-1])
    return t if aligned else t.contiguous()


def _tensor_arg(t: torch.Tensor, rank: int):
    strides = t.stride()
    axis_strides = (0,) * (RANK - rank) + tuple(strides[1 : 1 + rank])
    return (t.data_ptr(), strides[0], axis_strides, strides[-2])


def _common(problem: Problem):
    axes = [(1, 1, 1, 1, 0, 0)] * (RANK - problem.rank) + [
        (a.length, a.window, a.stride, a.dilation, int(a.causal), a.shift) for a in problem.axes
    ]
    device = problem.device.index if problem.device.index is not None else torch.cuda.current_device()
    return dict(
        dtype=DTYPE_CODE[problem.dtype],
        pattern=PATTERN_CODE[problem.pattern],
        batch=problem.batch,
        heads=problem.heads,
        kv_heads=problem.kv_heads,
        head_dim=problem.head_dim,
        value_dim=problem.value_dim,
        axes=axes,
        scale=problem.scale,
        device=device,
        stream=torch.cuda.current_stream(device).cuda_stream,
    )


def forward(problem: Problem, inputs: AttentionInputs):
    module, _ = load()
    q, k, v = (_kernel_ready(t) for t in (inputs.query, inputs.key, inputs.value))
    out = torch.empty(*q.shape[:-1], problem.value_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    r = problem.rank
    module.forward(
        **_common(problem),
        query=_tensor_arg(q, r), key=_tensor_arg(k, r), value=_tensor_arg(v, r), out=_tensor_arg(out, r),
        lse=lse.data_ptr(), forward_kernel=forward_kernel_code(),
    )
    return out, lse


def backward(problem: Problem, inputs: AttentionInputs, out, lse, grad_out, grad_lse: Optional[torch.Tensor], needs_grad):
    module, _ = load()
    q, k, v, out, grad_out = (_kernel_ready(t) for t in (inputs.query, inputs.key, inputs.value, out, grad_out))
    lse = lse.float().contiguous()
    grad_lse = grad_lse.float().contiguous() if grad_lse is not None else None
    grad_q, grad_k, grad_v = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    delta = torch.empty_like(lse)
    r = problem.rank
    module.backward(
        **_common(problem),
        query=_tensor_arg(q, r), key=_tensor_arg(k, r), value=_tensor_arg(v, r), out=_tensor_arg(out, r),
        lse=lse.data_ptr(), grad_out=_tensor_arg(grad_out, r),
        grad_lse=grad_lse.data_ptr() if grad_lse is not None else 0,
        grad_query=_tensor_arg(grad_q, r), grad_key=_tensor_arg(grad_k, r), grad_value=_tensor_arg(grad_v, r),
        delta=delta.data_ptr(), backward_kernel=backward_kernel_code(),
    )
    grads = (grad_q, grad_k, grad_v) + (None,) * (len(AttentionInputs._fields) - 3)
    return tuple(g if need else None for g, need in zip(grads, needs_grad))
