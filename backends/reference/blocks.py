"""Blocks of query rows and the grid keys they may see, in the two shapes the reference uses.

* :class:`TileBoxes` (the default): query tiles that are boxes in the grid, each with the box of
  keys covering every neighbourhood in the tile. Scores are one small matrix product per tile
  (fast on CPUs and GPUs), and only the pattern mask is per element. Tiles live inside one
  dilation group per axis, so dilation costs nothing extra.
* :class:`GatheredRows`: every query row with its own list of at most ``window`` keys per axis,
  for the general (autograd-recorded) JVP rule and traced forwards, which want plain per-row
  operations. (The key-query convolution has tiles of its own, conv_tiles.py.)

Both expose the same interface to attend.py: ``rows`` (flat query indices), ``row_valid``,
``keep`` ``[n, P]``, ``kv_index`` ``[n, P]``, ``relative`` (per-axis rpb indices ``[n, P]``),
``scores(q, k)`` and ``mix(weights, v)``. Memory grows with the block, never with ``N x N``.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import List

import torch

from haloattn.geometry import Axis, key_range, ravel, unravel
from haloattn.problem import Problem
from haloattn.tracing import untraced

# Tile shapes: the query tile edges per axis minimise an estimated cost per query row,
#   (P + E) + GATHER_COST * P / (T * G),
# P the tile's key box (keys scored per row), E the additional tokens, T the rows of a tile and G
# the query heads per key/value head: scores, softmax and both products grow with P; gathering
# the box (and each small product's fixed cost) is shared by the T * G rows of a tile. Measured on
# a 2-core EPYC: 2-D window 7 -> 4x4 tiles (P = 100), 1-D window 127 -> 32, 3-D 3x5x5 -> 2x2x2.
GATHER_COST = 6.0
MAX_EDGE = 64  # per axis
MAX_TILE_ROWS = 256


def _gather(tokens: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """tokens [B, N, Hkv, D], index [...] -> [B, *index.shape, Hkv, D]."""
    picked = tokens.index_select(1, index.reshape(-1))
    return picked.view(tokens.shape[0], *index.shape, *tokens.shape[2:])


class AxisTiles:
    """One axis cut into query tiles (inside one dilation group each) and their key boxes."""

    def __init__(self, axis: Axis, pattern: str, edge: int, device):
        Dl, K = axis.dilation, axis.window
        groups, starts = [], []
        for g in range(min(Dl, axis.length)):
            for x0 in range(0, axis.group_length(g), edge):
                groups.append(g)
                starts.append(x0)
        g = torch.tensor(groups, device=device)[:, None]
        x = torch.tensor(starts, device=device)[:, None] + torch.arange(edge, device=device)[None, :]
        group_len = (axis.length - g + Dl - 1) // Dl
        self.query_valid = x < group_len
        x = torch.minimum(x, group_len - 1)
        _, lo, hi = key_range(axis, pattern, g + Dl * x)
        big = axis.length + 1
        box_lo = torch.where(self.query_valid, lo, big).amin(dim=1, keepdim=True)
        box_hi = torch.where(self.query_valid, hi, -big).amax(dim=1, keepdim=True)
        self.box = int((box_hi - box_lo).max())
        start = torch.minimum(box_lo, group_len - self.box).clamp(min=0)
        y = start + torch.arange(self.box, device=device)[None, :]
        key_valid = y < group_len
        y_in = torch.minimum(y, group_len - 1)
        self.count = len(starts)
        self.edge = edge
        self.query_coord = g + Dl * x
        self.key_coord = g + Dl * y_in
        self.keep = (
            self.query_valid[:, :, None]
            & key_valid[:, None, :]
            & (lo[:, :, None] <= y[:, None, :])
            & (y[:, None, :] < hi[:, :, None])
        )
        self.relative = (y_in[:, None, :] - x[:, :, None] + K - 1).clamp(0, 2 * K - 2)


def _all(masks: List[torch.Tensor]) -> torch.Tensor:
    out = masks[0]
    for m in masks[1:]:
        out = out & m
    return out


def _outer(per_axis: List[torch.Tensor], trailing: bool) -> List[torch.Tensor]:
    """Views of per-axis ``[c, n_a]`` (or ``[c, T_a, P_a]``) tensors that broadcast to the
    product layout ``[c, T_1.., (P_1..)]``."""
    rank = len(per_axis)
    views = []
    for a, t in enumerate(per_axis):
        if trailing:  # [c, T_a, P_a] -> [c, 1.., T_a, 1.., 1.., P_a, 1..]
            shape = [t.shape[0]] + [1] * (2 * rank)
            shape[1 + a] = t.shape[1]
            shape[1 + rank + a] = t.shape[2]
        else:
            shape = [t.shape[0]] + [1] * rank
            shape[1 + a] = t.shape[1]
        views.append(t.reshape(shape))
    return views


# The cached helpers run outside any torch.jit trace (tracing.untraced): a tensor one trace recorded
# and the cache kept would be an unknown value to the next.
@functools.lru_cache(maxsize=256)
@untraced
def _ranges(axis: Axis, pattern: str):
    """Per dilation group: the key range [lo, hi) of every group coordinate (CPU)."""
    out = []
    for g in range(min(axis.dilation, axis.length)):
        x = torch.arange(axis.group_length(g))
        _, lo, hi = key_range(axis, pattern, g + axis.dilation * x)
        out.append((lo, hi))
    return out


@functools.lru_cache(maxsize=1024)
@untraced
def _box(axis: Axis, pattern: str, edge: int) -> int:
    """AxisTiles(axis, pattern, edge).box, without building the tiles."""
    box = 0
    for lo, hi in _ranges(axis, pattern):
        n = lo.numel()
        pad = (-n) % edge
        lo = torch.cat([lo, lo.new_full((pad,), axis.length + 1)]).view(-1, edge)
        hi = torch.cat([hi, hi.new_full((pad,), -axis.length - 1)]).view(-1, edge)
        box = max(box, int((hi.amax(1) - lo.amin(1)).max()))
    return box


def _edge_candidates(axis: Axis):
    longest = axis.group_length(0)
    cap = max(1, min(MAX_EDGE, longest))
    edges = {1 << i for i in range(cap.bit_length()) if 1 << i <= cap} | {min(axis.window, cap), cap}
    return sorted(edges)


def tile_edges(problem: Problem):
    """Query tile edge per axis (see GATHER_COST)."""
    return list(_tile_edges(problem.axes, problem.pattern, problem.heads // problem.kv_heads, problem.extra_tokens))


@functools.lru_cache(maxsize=1024)
@untraced
def _tile_edges(axes, pattern: str, groups: int, extra_tokens: int):
    per_axis = [[(e, _box(a, pattern, e)) for e in _edge_candidates(a)] for a in axes]
    best, best_cost = None, math.inf
    for combo in itertools.product(*per_axis):
        rows = math.prod(e for e, _ in combo)
        if rows > MAX_TILE_ROWS and best is not None:
            continue
        keys = math.prod(b for _, b in combo)
        cost = keys + extra_tokens + GATHER_COST * keys / (rows * groups)
        if cost < best_cost:
            best, best_cost = tuple(e for e, _ in combo), cost
    return best


class TilePlan:
    """Every axis's tiles; hands out :class:`TileBoxes` for chunks of tiles."""

    def __init__(self, problem: Problem, device, edges=None):
        if edges is None:
            edges = tile_edges(problem)
        self.problem = problem
        self.axes = [AxisTiles(a, problem.pattern, e, device) for a, e in zip(problem.axes, edges)]
        self.tiles = math.prod(t.count for t in self.axes)
        self.rows_per_tile = math.prod(t.edge for t in self.axes)
        self.keys_per_tile = math.prod(t.box for t in self.axes)

    def block(self, start: int, stop: int) -> "TileBoxes":
        return TileBoxes(self, start, stop)


class TileBoxes:
    def __init__(self, plan: TilePlan, start: int, stop: int):
        problem = plan.problem
        device = plan.axes[0].keep.device
        ids = unravel(torch.arange(start, stop, device=device), tuple(t.count for t in plan.axes))
        c = stop - start
        self.tiles, self.per_tile, self.box = c, plan.rows_per_tile, plan.keys_per_tile
        queries = _outer([t.query_coord[i] for t, i in zip(plan.axes, ids)], trailing=False)
        keys = _outer([t.key_coord[i] for t, i in zip(plan.axes, ids)], trailing=False)
        self.rows = ravel(queries, problem.spatial).expand(c, *(t.edge for t in plan.axes)).reshape(-1)
        self.key_index = ravel(keys, problem.spatial).expand(c, *(t.box for t in plan.axes)).reshape(c, -1)
        valid = _all(_outer([t.query_valid[i] for t, i in zip(plan.axes, ids)], trailing=False))
        self.row_valid = valid.expand(c, *(t.edge for t in plan.axes)).reshape(-1)
        full = [c] + [t.edge for t in plan.axes] + [t.box for t in plan.axes]
        mask = _all(_outer([t.keep[i] for t, i in zip(plan.axes, ids)], trailing=True))
        self.keep = mask.expand(full).reshape(c * self.per_tile, self.box)
        self._relative = (plan, ids, full)

    @property
    def relative(self) -> List[torch.Tensor]:
        plan, ids, full = self._relative
        views = _outer([t.relative[i] for t, i in zip(plan.axes, ids)], trailing=True)
        return [v.expand(full).reshape(-1, self.box) for v in views]

    @property
    def kv_index(self) -> torch.Tensor:
        return self.key_index[:, None, :].expand(-1, self.per_tile, -1).reshape(-1, self.box)

    def parts(self, tiles: int, need_relative: bool, need_kv_index: bool):
        """The block cut into :class:`TileSlice` s of ``tiles`` tiles (views, no copies)."""
        relative = self.relative if need_relative else None
        kv_index = self.kv_index if need_kv_index else None
        T = self.per_tile
        for c0 in range(0, self.tiles, tiles):
            c1 = min(c0 + tiles, self.tiles)
            r = slice(c0 * T, c1 * T)
            yield TileSlice(
                c1 - c0, T, self.box, self.rows[r], self.row_valid[r], self.key_index[c0:c1],
                self.keep[r], None if relative is None else [t[r] for t in relative],
                None if kv_index is None else kv_index[r],
            )


class TileSlice:
    """Consecutive tiles of a :class:`TileBoxes` (same attributes, precomputed)."""

    def __init__(self, tiles, per_tile, box, rows, row_valid, key_index, keep, relative, kv_index):
        self.tiles, self.per_tile, self.box = tiles, per_tile, box
        self.rows, self.row_valid = rows, row_valid
        self.padded = not bool(row_valid.all())  # holds padding rows of ragged tiles
        self.key_index, self.keep, self.relative, self.kv_index = key_index, keep, relative, kv_index


class GatheredRows:
    """Query rows ``rows`` with each row's own keys: at most ``window`` per axis."""

    def __init__(self, problem: Problem, rows: torch.Tensor):
        n = rows.numel()
        self.rows = rows
        self.row_valid = None
        coords = unravel(rows, problem.spatial)
        key_coords, valid, rel = [], [], []
        for a, axis in enumerate(problem.axes):
            group, lo, hi = key_range(axis, problem.pattern, coords[a])
            y = lo[:, None] + torch.arange(axis.window, device=rows.device)[None, :]
            ok = y < hi[:, None]
            j = (y * axis.dilation + group[:, None]).clamp(max=axis.length - 1)
            r = (y - (coords[a] // axis.dilation)[:, None] + axis.window - 1).clamp(0, 2 * axis.window - 2)
            shape = [n] + [1] * problem.rank
            shape[1 + a] = axis.window
            key_coords.append(j.view(shape))
            valid.append(ok.view(shape))
            rel.append(r.view(shape))
        full = [n] + list(problem.window)
        self.kv_index = ravel(key_coords, problem.spatial).expand(full).reshape(n, -1)
        self.keep = _all(valid).expand(full).reshape(n, -1)
        self.relative = [r.expand(full).reshape(n, -1) for r in rel]

    def scores(self, q: torch.Tensor, k: torch.Tensor, kv_heads: int) -> torch.Tensor:
        B, H, D = q.shape[0], q.shape[2], q.shape[3]
        q5 = q.index_select(1, self.rows).view(B, -1, kv_heads, H // kv_heads, D)
        return torch.einsum("bnkgd,bnpkd->bnkgp", q5, _gather(k, self.kv_index)).reshape(B, q5.shape[1], H, -1)

    def mix(self, weights: torch.Tensor, v: torch.Tensor, kv_heads: int) -> torch.Tensor:
        return mix_rows(weights, v, self.kv_index, kv_heads)


def mix_rows(weights: torch.Tensor, v: torch.Tensor, kv_index: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """weights [B, n, H, P] over each row's own keys ``kv_index`` [n, P] -> [B, n, H, D_v]."""
    B, n, H, P = weights.shape
    w = weights.reshape(B, n, kv_heads, H // kv_heads, P)
    return torch.einsum("bnkgp,bnpkd->bnkgd", w, _gather(v, kv_index)).reshape(B, n, H, -1)
