"""The token order the flex backend hands to FlexAttention: the grid cut into tiles of 128 tokens.

FlexAttention skips work per (query block, key block) of 128 x 128 flat positions. In the grid's
own row-major order a block of 128 tokens is a thin strip, whose neighbourhoods reach across many
key strips, so most visited blocks are nearly empty (the 3-70x gap to the hardware that users
measure on 2-D/3-D neighbourhoods). Tiles that are boxes in the grid (8x16, 2x8x8) make blocks
compact, and each query box meets few key boxes.

Per axis the tiles ("segments") stay inside one dilation group, so a dilated axis gets full
blocks just like an undilated one. Where a side does not divide a group's length, the last
segment is padded: padding positions hold a copy of some real token, are masked out as keys and
never written as queries. Positions are numbered row-major over the per-axis segment indices,
then row-major over the offsets inside the tile, so one tile's tokens are 128 consecutive
positions.
"""

from __future__ import annotations

import itertools
import math
from typing import List, Sequence, Tuple

import torch

from haloattn.geometry import Axis, ravel
from haloattn.problem import Problem

BLOCK = 128  # tokens per tile = FlexAttention's block (BLOCK_SIZE)
PREFERRED_TILES = {1: (128,), 2: (8, 16), 3: (2, 8, 8)}


class AxisSegments:
    """One axis cut into segments of ``side`` positions, each inside one dilation group."""

    def __init__(self, axis: Axis, side: int):
        groups, starts = [], []
        for g in range(min(axis.dilation, axis.length)):
            for y0 in range(0, axis.group_length(g), side):
                groups.append(g)
                starts.append(y0)
        self.side = side
        self.count = len(starts)
        self.group = torch.tensor(groups)
        self.start = torch.tensor(starts)
        y = self.start[:, None] + torch.arange(side)[None, :]  # group coordinates [count, side]
        group_len = (axis.length - self.group[:, None] + axis.dilation - 1) // axis.dilation
        self.valid = y < group_len
        # grid coordinate of each position; padding repeats the segment's first token
        self.coord = torch.where(self.valid, y, self.start[:, None]) * axis.dilation + self.group[:, None]


def padded_positions(axes: Sequence[Axis], tile: Sequence[int]) -> int:
    total = 1
    for axis, side in zip(axes, tile):
        total *= sum(-(-axis.group_length(g) // side) * side for g in range(min(axis.dilation, axis.length)))
    return total


def choose_tile(axes: Sequence[Axis]) -> Tuple[int, ...]:
    """The 128-token tile shape (powers of two per axis) with the least padding; among equals,
    the one closest to the preferred compact shape."""
    rank = len(axes)
    preferred = PREFERRED_TILES[rank]
    exponents = range(int(math.log2(BLOCK)) + 1)
    best = None
    for e in itertools.product(exponents, repeat=rank):
        if sum(e) != int(math.log2(BLOCK)):
            continue
        tile = tuple(1 << x for x in e)
        distance = sum(abs(x - int(math.log2(p))) for x, p in zip(e, preferred))
        key = (padded_positions(axes, tile), distance)
        if best is None or key < best[0]:
            best = (key, tile)
    return best[1]


def _on_axis(per_axis: torch.Tensor, a: int, rank: int) -> torch.Tensor:
    """[count_a, side_a] -> a view that broadcasts to [count_1..count_r, side_1..side_r]."""
    shape = [1] * (2 * rank)
    shape[a], shape[rank + a] = per_axis.shape
    return per_axis.reshape(shape)


class TokenOrder:
    """Positions of grid tokens in Flex's sequence, and the tables to move between orders.

    * ``positions``: query sequence length (a multiple of BLOCK, padding included);
    * ``kv_positions``: key sequence length: the grid positions, then the additional tokens,
      padded to a multiple of BLOCK;
    * ``source`` [positions]: flat grid index each position holds (padding: a real token's);
    * ``valid`` [positions]: False on padding;
    * ``place`` [N]: the position of every grid token (the inverse of ``source`` on valid ones);
    * ``coords``: per axis, the grid coordinate at each position.
    """

    def __init__(self, problem: Problem, tile: Sequence[int] = None):
        self.spatial = problem.spatial
        self.tile = tuple(tile) if tile is not None else choose_tile(problem.axes)
        self.segments: List[AxisSegments] = [AxisSegments(a, s) for a, s in zip(problem.axes, self.tile)]
        rank = problem.rank
        full = [s.count for s in self.segments] + list(self.tile)
        self.coords = [_on_axis(s.coord, a, rank).expand(full).reshape(-1) for a, s in enumerate(self.segments)]
        valid = torch.ones((), dtype=torch.bool)
        for a, s in enumerate(self.segments):
            valid = valid & _on_axis(s.valid, a, rank)
        self.valid = valid.expand(full).reshape(-1)
        self.positions = self.valid.numel()
        self.grid_tokens = problem.tokens
        self.extra_tokens = problem.extra_tokens
        self.kv_positions = -(-(self.positions + self.extra_tokens) // BLOCK) * BLOCK
        self.source = ravel(self.coords, problem.spatial)
        self.place = torch.empty(problem.tokens, dtype=torch.long)
        self.place[self.source[self.valid]] = torch.arange(self.positions)[self.valid]
        if int(self.valid.sum()) != problem.tokens:  # every token exactly once: a bug if not
            raise AssertionError(f"token order covers {int(self.valid.sum())} of {problem.tokens} tokens")

    @property
    def blocks(self) -> int:
        return self.positions // BLOCK
