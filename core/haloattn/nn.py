"""Attention blocks built on :func:`haloattn.attention`: a qkv projection, local attention over the
token grid, an output projection. Inputs and outputs are channels-last ``[B, *spatial, C]``, the
layout of Swin, NATTEN and timm blocks, so the q/k/v heads are strided views of the projection and
reach the kernels without a permute or copy.

* :class:`NeighborhoodAttention1d` / ``2d`` / ``3d``: NATTEN-style neighbourhood attention.
* :class:`WindowAttention`: Swin-style window attention (W-MSA, and SW-MSA with ``shift``), MaxViT
  grid attention with ``dilation``; 1-D, 2-D or 3-D.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .api import attention
from .problem import build_problem, check_window

PerAxis = Union[int, Sequence[int]]

__all__ = ["NeighborhoodAttention1d", "NeighborhoodAttention2d", "NeighborhoodAttention3d", "WindowAttention"]


def _per_axis(name: str, value, rank: int) -> tuple:
    if isinstance(value, (tuple, list)):
        if len(value) != rank:
            raise ValueError(f"{name}={tuple(value)!r} needs {rank} entries, one per spatial axis")
        return tuple(value)
    return (value,) * rank


class _LocalAttention(nn.Module):
    """Shared body: projections, optional relative position bias, the haloattn call."""

    pattern = "neighborhood"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window: PerAxis,
        *,
        rank: int,
        stride: PerAxis = 1,
        dilation: PerAxis = 1,
        causal: Union[bool, Sequence[bool]] = False,
        shift: PerAxis = 0,
        rpb: bool = False,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        head_dim: Optional[int] = None,
        scale: Optional[float] = None,
        softcap: Optional[float] = None,
        proj_drop: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        if not 1 <= rank <= 3:
            raise ValueError(f"window={window!r} gives {rank} spatial axes; allowed: 1, 2 or 3")
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads={num_heads!r}; expected an int >= 1")
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}; pass head_dim")
            head_dim = dim // num_heads
        self.dim, self.num_heads, self.head_dim, self.rank = dim, num_heads, head_dim, rank
        self.window = check_window(window, rank)  # before it sizes the rpb table
        self.stride = _per_axis("stride", stride, rank)
        self.dilation = _per_axis("dilation", dilation, rank)
        self.causal = _per_axis("causal", causal, rank)
        self.shift = _per_axis("shift", shift, rank)
        self.scale, self.softcap = scale, softcap
        self._check_options(head_dim)
        inner = num_heads * head_dim
        self.qkv = nn.Linear(dim, 3 * inner, bias=qkv_bias, **factory)
        self.proj = nn.Linear(inner, dim, bias=proj_bias, **factory)
        self.proj_drop = nn.Dropout(proj_drop)
        if rpb:
            # [H, 2K-1 per axis], NATTEN's orientation (key minus query); Swin's init.
            self.rpb = nn.Parameter(torch.empty(num_heads, *(2 * k - 1 for k in self.window), **factory))
            nn.init.trunc_normal_(self.rpb, std=0.02)
        else:
            self.register_parameter("rpb", None)

    def _check_options(self, head_dim: int) -> None:
        """Validate every option that does not depend on the grid now, as ``attention`` would, so
        that a bad shift, stride, dilation, causal, scale or softcap fails when the block is built
        (with attention's message naming the argument, axis, value and range) instead of at its
        first forward: a probe problem on the smallest grid the window and dilation allow."""
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
            raise ValueError(f"head_dim={head_dim!r}; expected an int >= 1")
        lengths = [
            k * d if type(d) is int and d >= 1 else k  # a bad dilation is reported by build_problem
            for k, d in zip(self.window, self.dilation)
        ]
        probe = torch.empty(1, *lengths, self.num_heads, head_dim, device="meta")
        build_problem(
            probe, probe, probe, self.window, stride=self.stride, dilation=self.dilation, causal=self.causal,
            pattern=self.pattern, shift=self.shift, scale=self.scale, softcap=self.softcap,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[B, *spatial, dim]`` -> ``[B, *spatial, dim]``."""
        if x.dim() != self.rank + 2:
            raise ValueError(
                f"{type(self).__name__} expects [B, *spatial, C] with {self.rank} spatial axes; "
                f"got shape {tuple(x.shape)}"
            )
        # [B, *spatial, 3, H, D]: q, k and v are strided views, read in place by the kernels.
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(-3)
        out = attention(
            q, k, v, self.window, stride=self.stride, dilation=self.dilation, causal=self.causal,
            pattern=self.pattern, shift=self.shift, scale=self.scale, softcap=self.softcap, rpb=self.rpb,
        )
        return self.proj_drop(self.proj(out.flatten(-2)))

    def extra_repr(self) -> str:
        parts = [f"dim={self.dim}", f"num_heads={self.num_heads}", f"head_dim={self.head_dim}",
                 f"window={self.window}"]
        for name, default in (("stride", 1), ("dilation", 1), ("causal", False), ("shift", 0)):
            value = getattr(self, name)
            if any(v != default for v in value):
                parts.append(f"{name}={value}")
        parts.append(f"rpb={self.rpb is not None}")
        return ", ".join(parts)


class NeighborhoodAttention1d(_LocalAttention):
    """Neighbourhood attention over ``[B, L, C]`` (SEMANTICS.md section 3)."""

    def __init__(self, dim: int, num_heads: int, window: PerAxis, **kwargs):
        super().__init__(dim, num_heads, window, rank=1, **kwargs)


class NeighborhoodAttention2d(_LocalAttention):
    """Neighbourhood attention over ``[B, H, W, C]`` (SEMANTICS.md section 3)."""

    def __init__(self, dim: int, num_heads: int, window: PerAxis, **kwargs):
        super().__init__(dim, num_heads, window, rank=2, **kwargs)


class NeighborhoodAttention3d(_LocalAttention):
    """Neighbourhood attention over ``[B, T, H, W, C]`` (SEMANTICS.md section 3)."""

    def __init__(self, dim: int, num_heads: int, window: PerAxis, **kwargs):
        super().__init__(dim, num_heads, window, rank=3, **kwargs)


class WindowAttention(_LocalAttention):
    """Swin window attention over ``[B, *spatial, C]`` (SEMANTICS.md section 4), without roll,
    padding or partition copies: ``shift`` gives Swin's shifted windows (SW-MSA, partial edge
    windows instead of the roll-and-mask), grids need not be divisible by the window, and
    ``dilation`` gives MaxViT grid attention. The rank is ``len(window)``, or 2 for an int window.
    ``rpb`` defaults to True, as in Swin; its table is NATTEN-oriented (Swin's flipped on every
    axis, see :func:`swin_table_to_rpb`)."""

    pattern = "window"

    def __init__(self, dim: int, num_heads: int, window: PerAxis, *, shift: PerAxis = 0,
                 dilation: PerAxis = 1, rpb: bool = True, **kwargs):
        rank = len(window) if isinstance(window, (tuple, list)) else 2
        super().__init__(dim, num_heads, window, rank=rank, shift=shift, dilation=dilation, rpb=rpb, **kwargs)


def swin_table_to_rpb(table: torch.Tensor, window: Tuple[int, ...]) -> torch.Tensor:
    """Swin's ``relative_position_bias_table`` ``[prod(2W-1), H]`` (index = query minus key) as a
    haloattn rpb ``[H, 2W-1, ...]`` (key minus query): a differentiable view-and-flip, so
    gradients reach the original parameter."""
    sizes = tuple(2 * w - 1 for w in window)
    if table.dim() != 2 or table.shape[0] != math.prod(sizes):
        raise ValueError(
            f"relative_position_bias_table has shape {tuple(table.shape)}; expected [{math.prod(sizes)}, H] "
            f"for window {tuple(window)}"
        )
    rank = len(window)
    return table.t().reshape(table.shape[1], *sizes).flip(tuple(range(1, rank + 1)))
