"""Host-built descriptors of the Gluon kernels: a ``[B, *spatial, H, W]`` tensor read by the copy
engine as ``[B, X0, X1, X2, H * W]`` (heads merged, as host_descriptors.py does at rank 3), in
boxes of tokens and one head's ``W`` columns."""

from __future__ import annotations

from typing import Sequence

import torch

from .launch import needs_int64
from .plugin import interpreting

try:  # Gluon is experimental: a Triton that moved it leaves the Gluon kernels out
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except (ImportError, AttributeError):  # pragma: no cover - depends on the installed Triton
    gl = TensorDescriptor = None

GLUON_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def descriptor_ready(t: torch.Tensor) -> bool:
    """Whether ``t`` ([B, *spatial, H, W]) can be read as ``[B, X0, X1, X2, H * W]`` by the copy
    engine: columns contiguous, heads back to back, a 16-byte aligned base, every other stride
    a nonzero multiple of 16 bytes and the whole span addressable with int32 coordinates."""
    if t.stride(-1) != 1 or t.stride(-2) != t.shape[-1] or t.data_ptr() % 16:
        return False
    if any(s == 0 or (s * t.element_size()) % 16 for s in t.stride()[:-2]):
        return False
    return not needs_int64(t)


def grid_descriptor(t: torch.Tensor, rank: int, box: Sequence[int]) -> "TensorDescriptor":
    """``t`` as ``[B, X0, X1, X2, H * W]`` in boxes of ``box`` (rank 3) tokens and one head. An
    axis a problem of rank < 3 lacks has length 1 and the stride a contiguous tensor would give
    it (the copy engine wants every stride a multiple of 16 bytes; it never steps along it)."""
    batch, *spatial, heads, width = t.shape
    strides = list(t.stride()[1:1 + rank])
    lengths = list(spatial)
    while len(lengths) < 3:
        strides.insert(0, strides[0] * lengths[0])
        lengths.insert(0, 1)
    block = [1, *box, width]
    layout = gl.NVMMASharedLayout.get_default_for(block, getattr(gl, GLUON_DTYPES[t.dtype]))
    return TensorDescriptor(t, [batch, *lengths, heads * width], [t.stride(0), *strides, 1], block, layout)


def tensors_fit(*tensors: torch.Tensor) -> bool:
    """Whether a Gluon kernel can run on these tensors: on an sm_90 GPU (Gluon has no interpreter),
    each readable through such a descriptor."""
    return (not interpreting() and tensors[0].is_cuda and torch.cuda.get_device_capability(tensors[0].device)[0] == 9
            and all(descriptor_ready(t) for t in tensors))
