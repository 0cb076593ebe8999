"""Dilated problems on the Gluon forward, as undilated ones over views of the same memory.

With dilation ``d`` on an axis of length ``L`` (a multiple of ``d``), token ``x = y * d + g`` is
token ``y`` of dilation group ``g``, and a query attends only keys of its own group, by the
undilated rule on group coordinates. Split the axis in two, ``(L / d, d)`` (strides ``d * s``
and ``s``): the first is an undilated axis with the same window, stride, shift and causal flag,
the second an axis of window 1 (each query sees its own group's coordinate, so groups never mix).
On the last spatial axis the group coordinate merges with the heads instead, ``g * H + h``, as
long as the tokens of that axis are back to back with their heads (stride ``H * W``): one more
axis per dilated axis but the last, and the Gluon kernel takes three. GQA stays right:
``(g * H + h) // (H / H_kv) = g * H_kv + h // (H / H_kv)``, the same group's key head.

So a 2-D problem dilated on both axes becomes the 3-D problem ``(L0 / d0, d0, L1 / d1)`` with
``d1 * H`` heads, over views of q, k, v, the output and the LSE: no copy, and the Gluon kernel
runs unchanged. (The Triton kernels take dilation natively, by strided loads.)
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Tuple

import torch

from haloattn.geometry import Axis
from haloattn.problem import Problem

MAX_RANK = 3  # spatial axes of the Gluon kernel's descriptors ([B, X0, X1, X2, H * W])


@dataclasses.dataclass(frozen=True)
class Regrouping:
    """An undilated problem equivalent to a dilated one, and how its tensors view the original's:
    ``spatial`` the new spatial shape and ``heads_factor`` the last axis' dilation folded into
    the heads."""
    problem: Problem
    spatial: Tuple[int, ...]
    heads_factor: int

    def view(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        """``t`` ([B, *spatial, H, W]) on the regrouped axes, or None where its strides allow no
        such view (the last axis' tokens not back to back with their heads)."""
        return self._view(t, t.shape[-1:])

    def view_rows(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        """The same for a per-row tensor ([B, *spatial, H], the LSE)."""
        return self._view(t, ())

    def _view(self, t: torch.Tensor, tail) -> Optional[torch.Tensor]:
        heads = t.shape[-1 - len(tail)] * self.heads_factor
        try:
            return t.view(t.shape[0], *self.spatial, heads, *tail)
        except RuntimeError:  # strides that cannot merge the last axis' groups with the heads
            return None


def regrouped(problem: Problem) -> Optional[Regrouping]:
    """The undilated equivalent of ``problem`` on at most MAX_RANK axes (``problem`` itself where
    nothing is dilated), or None: an axis length not a multiple of its dilation, or too many
    dilated axes."""
    if all(a.dilation == 1 for a in problem.axes):
        return Regrouping(problem, problem.spatial, 1)
    if any(a.length % a.dilation for a in problem.axes):
        return None
    axes: List[Axis] = []
    last = problem.rank - 1
    for index, axis in enumerate(problem.axes):
        d = axis.dilation
        axes.append(dataclasses.replace(axis, length=axis.length // d, dilation=1))
        if d > 1 and index != last:
            axes.append(Axis(length=d, window=1))
    if len(axes) > MAX_RANK:
        return None
    factor = problem.axes[last].dilation
    spatial = tuple(a.length for a in axes)
    regrouped_problem = dataclasses.replace(problem, spatial=spatial, axes=tuple(axes), heads=problem.heads * factor,
                                            kv_heads=problem.kv_heads * factor)
    return Regrouping(regrouped_problem, spatial, factor)


def dilation_groups(problem: Problem) -> int:
    """How many dilation groups a problem's cost (tiles.forward_cost: group 0's walks) stands for."""
    return math.prod(a.dilation for a in problem.axes)
