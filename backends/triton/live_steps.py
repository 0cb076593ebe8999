"""Which steps of a tile's walk mask_mod leaves anything to compute in: block sparsity from the mask.

The neighbourhood kernels walk, for each resident tile, every streamed tile that meets the
pattern. A mask_mod can empty whole steps of that walk: documents packed into one sequence
(``doc[q] == doc[kv]``) leave only the steps inside a document's part of the window, a padding
mask the steps over padding. A step whose pairs mask_mod refuses all still costs its loads and
matrix products, and its result is nothing.

So where a problem has a mask_mod, a small kernel first walks every resident tile's steps (the
same walk as the attention kernel, index_math.key_walk / query_walk), evaluates the pattern and
mask_mod on every pair of each step and writes the steps with at least one pair left, in walk
order, as a list; the attention kernel then walks that list (constexpr LIVE_STEPS). The list is
made on every call, from the mask's tensors as they are then: a cached list would go stale when a
captured tensor (document ids, say) changes in place. It costs elementwise work only, once per
tile, and once per batch entry / head only where mask_mod reads ``b`` / ``h`` (FusedMods.mask_reads);
where it reads ``h``, a key-major list (dK/dV: one program serves the G query heads of a kv head)
keeps the steps live for any of those heads.

A live step where mask_mod keeps every pair the pattern admits is also flagged *full*: the
kernels skip mask_mod there (``index_math.list_step``), as FlexAttention's full blocks skip theirs. Inside a
long packed document most steps are full, and evaluating the mask on them (a gather and a
compare per score) cost the forward up to 1.4x its time without the mask (RESULTS.md).

Layout: int32 ``[Bm, Hm, tiles, 1 + capacity]``, per tile its count of live steps, then the steps,
each ``2 * step + full`` (``step``: flat index of the walk, row-major over its per-axis extents as
index_math.split3 reads it; ``full``: 1 for a full step).
``capacity`` is the longest walk of any tile (the product of each axis' longest walk: the walks
are per-axis boxes), worked out on the host by the twin of the kernels' walk rules.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from haloattn.geometry import Axis, neighborhood_range, query_range, window_query_range, window_range
from haloattn.problem import Problem

from .fast_launch import Launch
from .forward_kernel import tile_tokens
from .index_math import key_range, key_walk, next3, query_walk, split3
from .mod_hooks import flat_tokens
from .scores import within
from .tiles import walk_start


@triton.jit
def live_steps_kernel(
    LIVE, MT0, MT1, MT2, MT3,
    slive_b, slive_h, slive_t, HEAD_GROUP,
    L0, L1, L2, K0, K1, K2, S0, S1, S2, D0, D1, D2, SH0, SH1, SH2, NR0, NR1, NR2,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, WINDOW: tl.constexpr,
    TM0: tl.constexpr, TM1: tl.constexpr, TM2: tl.constexpr,
    TN0: tl.constexpr, TN1: tl.constexpr, TN2: tl.constexpr,
    KEY_MAJOR: tl.constexpr, ANCHOR: tl.constexpr, RANK: tl.constexpr, MASK_MOD: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    """One program per (resident tile, batch entry or 0, head group or 0): the live steps of the
    tile's walk. Resident tiles are query tiles (TM) walking key tiles (TN), or with KEY_MAJOR key
    tiles walking query tiles; NR0..NR2 count the resident tiles per group and axis. The heads
    tried are ``HEAD_GROUP * program_id(2) + [0, HEAD_GROUP)``."""
    tile_id = tl.program_id(0)
    b = tl.program_id(1)
    first_head = tl.program_id(2) * HEAD_GROUP
    m0, m1, m2 = split3(tl.arange(0, TM0 * TM1 * TM2), TM1, TM2)
    n0, n1, n2 = split3(tl.arange(0, TN0 * TN1 * TN2), TN1, TN2)
    if KEY_MAJOR:
        g0, g1, g2, Lg0, Lg1, Lg2, rs0, rs1, rs2, _, _, _, _, _, _, _ = tile_tokens(
            tile_id, L0, L1, L2, D0, D1, D2, NR0, NR1, NR2, TN0, TN1, TN2, False)
        st0, n_walk0 = query_walk(rs0, Lg0, K0, S0, SH0, C0, WINDOW, TN0, TM0, ANCHOR)
        st1, n_walk1 = query_walk(rs1, Lg1, K1, S1, SH1, C1, WINDOW, TN1, TM1, ANCHOR)
        st2, n_walk2 = query_walk(rs2, Lg2, K2, S2, SH2, C2, WINDOW, TN2, TM2, ANCHOR)
    else:
        g0, g1, g2, Lg0, Lg1, Lg2, rs0, rs1, rs2, _, _, _, _, _, _, _ = tile_tokens(
            tile_id, L0, L1, L2, D0, D1, D2, NR0, NR1, NR2, TM0, TM1, TM2, False)
        st0, n_walk0, _, _ = key_walk(rs0, Lg0, K0, S0, SH0, C0, WINDOW, TM0, TN0, ANCHOR)
        st1, n_walk1, _, _ = key_walk(rs1, Lg1, K1, S1, SH1, C1, WINDOW, TM1, TN1, ANCHOR)
        st2, n_walk2, _, _ = key_walk(rs2, Lg2, K2, S2, SH2, C2, WINDOW, TM2, TN2, ANCHOR)
    row = LIVE + b.to(tl.int64) * slive_b + tl.program_id(2).to(tl.int64) * slive_h + tile_id.to(tl.int64) * slive_t
    count = tl.zeros((), tl.int32)
    j0, j1, j2 = tl.zeros((), tl.int32), tl.zeros((), tl.int32), tl.zeros((), tl.int32)
    for step in range(0, n_walk0 * n_walk1 * n_walk2):
        # Queries on the rows, keys on the columns, whichever tile is resident.
        if KEY_MAJOR:
            x0, x1, x2 = st0 + j0 * TM0 + m0, st1 + j1 * TM1 + m1, st2 + j2 * TM2 + m2
            y0, y1, y2 = rs0 + n0, rs1 + n1, rs2 + n2
        else:
            x0, x1, x2 = rs0 + m0, rs1 + m1, rs2 + m2
            y0, y1, y2 = st0 + j0 * TN0 + n0, st1 + j1 * TN1 + n1, st2 + j2 * TN2 + n2
        q_ok = (x0 >= 0) & (x0 < Lg0) & (x1 >= 0) & (x1 < Lg1) & (x2 >= 0) & (x2 < Lg2)
        # The forward rule: [lo, hi) lies inside the grid, so keys that pass it are real tokens.
        lo0, hi0 = key_range(x0, Lg0, K0, S0, SH0, C0, WINDOW)
        lo1, hi1 = key_range(x1, Lg1, K1, S1, SH1, C1, WINDOW)
        lo2, hi2 = key_range(x2, Lg2, K2, S2, SH2, C2, WINDOW)
        pairs = within(lo0, hi0, lo1, hi1, lo2, hi2, y0, y1, y2, True, RANK) & q_ok[:, None]
        q_flat = flat_tokens(g0, g1, g2, x0, x1, x2, Lg0, Lg1, Lg2, D0, D1, D2, L1, L2, WIDE_INDEX)[:, None]
        kv_flat = flat_tokens(g0, g1, g2, y0, y1, y2, Lg0, Lg1, Lg2, D0, D1, D2, L1, L2, WIDE_INDEX)[None, :]
        allowed = tl.zeros_like(pairs)  # by mask_mod for at least one head of the group
        refused = tl.zeros_like(pairs)  # by mask_mod for at least one head
        for i in range(0, HEAD_GROUP):
            kept = MASK_MOD(b, first_head + i, q_flat, kv_flat, MT0, MT1, MT2, MT3)
            allowed = allowed | kept
            refused = refused | (kept == 0)
        live = tl.max(tl.max((pairs & allowed).to(tl.int32), 1), 0)
        # Full: mask_mod keeps every pair the pattern admits, for every head the list serves.
        full = 1 - tl.max(tl.max((pairs & refused).to(tl.int32), 1), 0)
        # Every step writes its slot; a dead one is overwritten by the next live step.
        tl.store(row + 1 + count, step * 2 + full)
        count += live
        j0, j1, j2 = next3(j0, j1, j2, n_walk1, n_walk2)
    tl.store(row, count)


def _forward_rule(axis: Axis, pattern: str, x: int, group_len: int):
    return (window_range if pattern == "window" else neighborhood_range)(axis, x, group_len)


def _inverse_rule(axis: Axis, pattern: str, y: int, group_len: int):
    return (window_query_range if pattern == "window" else query_range)(axis, y, group_len)


@lru_cache(maxsize=4096)
def longest_axis_walk(axis: Axis, pattern: str, resident: int, streamed: int, anchor: bool, key_major: bool) -> int:
    """The most ``streamed``-wide tiles one ``resident``-wide tile walks on this axis, over every
    tile of every dilation group (host twin of index_math.key_walk / query_walk)."""
    rule = _inverse_rule if key_major else _forward_rule
    longest = 0
    # Dilation groups come in at most two lengths.
    for group_len in {axis.group_length(0), axis.group_length(axis.dilation - 1)}:
        for start in range(0, group_len, resident):
            last = min(start + resident, group_len) - 1
            lo, common_hi = (int(v) for v in rule(axis, pattern, start, group_len))
            common_lo, hi = (int(v) for v in rule(axis, pattern, last, group_len))
            first = walk_start(lo, hi, common_lo, common_hi, streamed, anchor)
            longest = max(longest, -(-(hi - first) // streamed))
    return longest


class LiveSteps:
    """The live-step lists of one kernel's walk (a launch plan's part): ``compute(mod_tensors)``
    allocates them and runs live_steps_kernel, returning the list tensor the kernel reads."""

    def __init__(self, problem: Problem, mods, geo, q_tile: Sequence[int], kv_tile: Sequence[int], anchor: bool,
                 key_major: bool, wide_index: bool, tile_constexprs: dict, device: torch.device):
        resident, streamed = (kv_tile, q_tile) if key_major else (q_tile, kv_tile)
        capacity = math.prod(longest_axis_walk(a, problem.pattern, r, s, anchor, key_major)
                             for a, r, s in zip(problem.axes, resident, streamed))
        per_batch = "b" in mods.mask_reads
        per_head = "h" in mods.mask_reads
        head_groups = (problem.kv_heads if key_major else problem.heads) if per_head else 1
        head_group = (problem.heads // problem.kv_heads if key_major else 1) if per_head else 1
        self.shape = (problem.batch if per_batch else 1, head_groups, geo.grid0(resident), 1 + capacity)
        self.device = device
        slive_h, slive_t = self.shape[2] * self.shape[3], self.shape[3]
        # Kernels index the lists by batch entry and head (kv head key-major): stride 0 where
        # one list serves them all.
        self.strides = (slive_h * head_groups if per_batch else 0, slive_h if per_head else 0, slive_t)
        filler = torch.empty(0, dtype=torch.int32, device=device)
        # Grid: resident tiles, batch entries (or 1), head groups (or 1).
        self.launch = Launch(live_steps_kernel, (self.shape[2], self.shape[0], self.shape[1]), [
            filler, *([filler] * 4), slive_h * head_groups, slive_h, slive_t, head_group,
            *geo.runtime_args(resident),
        ], dict(
            **geo.constexprs(), **tile_constexprs, KEY_MAJOR=key_major, ANCHOR=anchor, RANK=problem.rank, MASK_MOD=mods.mask, WIDE_INDEX=wide_index,
            num_warps=4, num_stages=1,
        ))

    def compute(self, mod_tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        lists = torch.empty(self.shape, dtype=torch.int32, device=self.device)
        self.launch(lists, *mod_tensors)
        return lists


def live_steps(problem: Problem, mods, geo, cfg: dict, key_major: bool, wide_index: bool, tile_constexprs: dict,
               device: torch.device) -> Optional[LiveSteps]:
    """The plan of a kernel's live-step lists (config part ``cfg``; ``tile_constexprs`` its
    kernel's TM0..TN2), or None where the problem has no mask_mod (every step of the walk has
    pairs: nothing to skip)."""
    if mods is None or not mods.has_mask:
        return None
    return LiveSteps(problem, mods, geo, cfg["q"], cfg["kv"], cfg["anchor"], key_major, wide_index, tile_constexprs,
                     device)
