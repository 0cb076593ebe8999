"""The attention pattern as FlexAttention wants it: lookup tables for the mask_mod, and a
BlockMask built from them without compiling anything.

The mask_mod only loads and compares. Per axis, each key position has a code ``g * G + y``
(dilation group ``g``, group coordinate ``y``, ``G`` the longest group) and each query position
the code range ``[g * G + lo, g * G + hi)`` that ``geometry.key_range`` gives it, so one test per
axis decides the pair; padding keys get code -1, which no range holds. (A mask_mod that redoes
the window arithmetic, divisions and clamps included, made compiled Flex 10x slower to build in
the benchmark's first version; see benchmarks/bench_neighborhood.py.)

The BlockMask needs, per (query tile, key tile), whether some pair attends and whether every pair
does. Tiles are boxes and the pattern is an AND over axes, so both answers factorise: a block
attends somewhere (everywhere) iff it does on every axis, which one small table per axis holds.
"""

from __future__ import annotations

from typing import List, NamedTuple

import torch

from haloattn.geometry import key_range
from haloattn.problem import Problem

from .token_order import BLOCK, AxisSegments, TokenOrder

# query segments per step when classifying blocks of one axis (bounds a [step, side, n] table)
_CLASSIFY_ELEMENTS = 1 << 24


class AxisTables(NamedTuple):
    """Per-position tables of one axis, int32, ``kv_positions`` long (queries use the first
    ``positions`` entries)."""

    code: torch.Tensor  # key code, -1 where the position holds no grid key
    lo: torch.Tensor  # query accepts codes in [lo, hi)
    hi: torch.Tensor
    unit: torch.Tensor  # group coordinate (relative-position-bias index arithmetic)


def axis_tables(problem: Problem, order: TokenOrder, device) -> List[AxisTables]:
    tables = []
    tail = order.kv_positions - order.positions
    for axis, coord in zip(problem.axes, order.coords):
        G = axis.group_length(0)
        group, lo, hi = key_range(axis, problem.pattern, coord)
        unit = coord // axis.dilation
        code = torch.where(order.valid, group * G + unit, -1)
        lo, hi = torch.where(order.valid, group * G + lo, 0), torch.where(order.valid, group * G + hi, 0)

        def extend(t, fill):
            return torch.cat([t, torch.full((tail,), fill, dtype=t.dtype)]).to(device=device, dtype=torch.int32)

        tables.append(AxisTables(extend(code, -1), extend(lo, 0), extend(hi, 0), extend(unit, 0)))
    return tables


def axis_block_classes(axis, pattern: str, segments: AxisSegments):
    """(some, every): [n, n] booleans over (query segment, key segment) of one axis: some valid
    query of the first sees some key of the second / every valid query sees all ``side``
    positions of the second (never true for a key segment with padding)."""
    side, n = segments.side, segments.count
    key_count = segments.valid.sum(1)  # valid positions form a prefix of each segment
    key_lo, key_hi = segments.start, segments.start + key_count
    some = torch.zeros(n, n, dtype=torch.bool)
    every = torch.zeros(n, n, dtype=torch.bool)
    step = max(1, _CLASSIFY_ELEMENTS // (side * n))
    for t0 in range(0, n, step):
        rows = slice(t0, min(t0 + step, n))
        group, lo, hi = key_range(axis, pattern, segments.coord[rows])  # [s, side]
        overlap = torch.minimum(hi[..., None], key_hi) - torch.maximum(lo[..., None], key_lo)
        same_group = group[..., None] == segments.group
        overlap = torch.where(same_group, overlap.clamp(min=0), 0)  # [s, side, n]
        valid = segments.valid[rows][..., None]
        some[rows] = ((overlap > 0) & valid).any(1)
        every[rows] = ((overlap == side) | ~valid).all(1)
    return some, every


def grid_block_classes(problem: Problem, order: TokenOrder):
    """(non-empty, full) over (query tile, key tile) of the grid, tiles numbered in the order's
    row-major segment order."""
    nonempty = full = torch.ones(1, 1, dtype=torch.bool)
    for axis, segments in zip(problem.axes, order.segments):
        some, every = axis_block_classes(axis, problem.pattern, segments)
        n = segments.count
        nonempty = (nonempty[:, None, :, None] & some[None, :, None, :]).reshape(nonempty.shape[0] * n, -1)
        full = (full[:, None, :, None] & every[None, :, None, :]).reshape(full.shape[0] * n, -1)
    return nonempty, full


def block_mask(problem: Problem, order: TokenOrder, mask_mod, device, allow_full: bool):
    """Flex's BlockMask: partial blocks run ``mask_mod``, full blocks skip it (only where
    ``allow_full``: a user mask_mod must see every pair), empty blocks are never visited. Key
    blocks past the grid (additional tokens) are partial for every query tile."""
    from torch.nn.attention.flex_attention import BlockMask

    nonempty, full = grid_block_classes(problem, order)
    if not allow_full:
        full = torch.zeros_like(full)
    extra_blocks = order.kv_positions // BLOCK - order.blocks
    if extra_blocks:
        nonempty = torch.cat([nonempty, torch.ones(order.blocks, extra_blocks, dtype=torch.bool)], dim=1)
        full = torch.cat([full, torch.zeros(order.blocks, extra_blocks, dtype=torch.bool)], dim=1)

    def listed(dense):
        dense = dense.to(torch.int32)[None, None]
        indices = torch.argsort(dense, dim=-1, descending=True, stable=True).to(torch.int32)
        return dense.sum(-1).to(torch.int32).to(device), indices.to(device)

    return BlockMask.from_kv_blocks(
        *listed(nonempty & ~full),
        *listed(full),
        BLOCK_SIZE=BLOCK,
        mask_mod=mask_mod,
        seq_lengths=(order.positions, order.kv_positions),
    )
