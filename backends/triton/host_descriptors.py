"""Tile descriptors (K/V; the backward's Q, dO and statistics rows) built once per call on the
host, instead of once per program on the device.

A descriptor a kernel builds itself (descriptors.group_descriptor) costs every program a write of
128 bytes to global memory and a proxy fence before its first copy: about 0.8 us a program on the
H100, measured as the gap between descriptor and pointer loads on walks of 4 key tiles (RESULTS.md,
"Packed forward programs"). A call of the 2-D benchmark problems runs 4096 such programs. A
descriptor made on the host describes the whole tensor, every batch element and head, and goes
to the kernel as a launch parameter: no program writes or fences anything.

One descriptor per tensor rules out what a per-program descriptor absorbs in its base address:

* dilation: a program reads one dilation group, tokens ``g + Dl * x``. Only undilated problems
  take host descriptors.
* the copy engine's five dimensions: ``[B, *spatial, H, D]`` has six at rank 3. There the head
  and channel axes merge into one of ``H * D`` channels (head h's channels start at ``h * D``),
  which needs the heads packed back to back (head stride = D) and no padded channels: a padded
  column would read the next head's channels, which a zero query column multiplies, but
  ``0 * inf`` is not 0.

A box's channel coordinate is then the head's first channel plus the box's at rank 3, the box's
alone at rank 1 and 2 (descriptors.load_host_box).
"""

from __future__ import annotations

import copy
from typing import List, Optional, Sequence, Tuple

import torch

try:  # Triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: device descriptors only
    TensorDescriptor = None

# Whether kernels that read K/V through descriptors take them from the host where the problem
# allows (see above). The device-built descriptors remain for dilated problems.
HOST_DESCRIPTORS = True

MAX_DIMS = 5  # the copy engine's limit


def _layout(t: torch.Tensor, rank: int, merge_heads: bool) -> Tuple[List[int], List[int]]:
    """Shape and strides of ``t`` ([B, *spatial, H, D]) as the descriptor sees it."""
    shape, strides = list(t.shape), list(t.stride())
    if merge_heads:
        return shape[:1 + rank] + [shape[-2] * shape[-1]], strides[:1 + rank] + [1]
    return shape, strides


def _block(tile: Sequence[int], rank: int, width: int, merge_heads: bool) -> List[int]:
    """The copy box: one batch element, the key tile's extents on the problem's axes, one head."""
    spatial = list(tile)[3 - rank:]
    return [1] + spatial + ([width] if merge_heads else [1, width])


def host_descriptors_fit(rank: int, dilations: Sequence[int], t: torch.Tensor, block: int, tail: int) -> bool:
    """Whether ``t`` (already cleared for descriptor loads: launch.use_descriptors), read in boxes of
    ``block`` channels and a ``tail`` of boxes after them, can come through one host descriptor
    (see the module's docstring)."""
    if not HOST_DESCRIPTORS or TensorDescriptor is None or any(d != 1 for d in dilations):
        return False
    if rank + 3 <= MAX_DIMS:
        return True
    return block + tail == t.shape[-1] and t.stride(-2) == t.shape[-1]


def token_descriptors(t: torch.Tensor, rank: int, tile: Sequence[int], block: int,
                      tail: int) -> Tuple["TensorDescriptor", Optional["TensorDescriptor"]]:
    """The descriptor of ``t``'s channels in ``tile``-shaped boxes (tile padded to rank 3) of
    ``block`` channels, and with ``tail`` > 0 one of ``tail``-channel boxes over the same tensor
    (the kernels read the tail at channel coordinate ``block``), else None. Host descriptors must
    fit (host_descriptors_fit)."""
    merge_heads = rank + 3 > MAX_DIMS
    shape, strides = _layout(t, rank, merge_heads)
    head = TensorDescriptor(t, shape, strides, _block(tile, rank, block, merge_heads))
    if tail == 0:
        return head, None
    return head, TensorDescriptor(t, shape, strides, _block(tile, rank, tail, merge_heads))


def rebased(template: "TensorDescriptor", t: torch.Tensor) -> "TensorDescriptor":
    """``template`` over tensor ``t`` of the same layout (a launch plan's later calls): the
    template's shape, strides and box were validated when the plan was built."""
    desc = copy.copy(template)
    desc.base = t
    return desc


def is_host_descriptor(value) -> bool:
    return TensorDescriptor is not None and isinstance(value, TensorDescriptor)
