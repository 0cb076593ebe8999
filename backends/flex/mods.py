"""The score_mod and mask_mod handed to FlexAttention, composed in SEMANTICS.md section 4's order.

Flex calls them with one (batch, head, query position, key position) at a time, positions in the
flex backend's token order. They translate positions back to the flat indices users' mods expect
(grid tokens ``0..N-1`` row-major, additional tokens ``N..N+E-1``) through lookup tables, so a
user's FlexAttention mod works unchanged.

score:  s = scale * q.k (Flex)  ->  + rpb (grid keys only)  ->  user score_mod  ->  softcap
mask:   pattern (per-axis code ranges) OR additional token, AND user mask_mod
"""

from __future__ import annotations

from typing import List, Optional

import torch

from haloattn.problem import Problem

from .masks import AxisTables
from .token_order import TokenOrder


class FlatIndices:
    """Flat user-facing indices per position, on the device: ``query`` [positions] and ``key``
    [kv_positions] (padding positions read index 0: they are masked and never written)."""

    def __init__(self, order: TokenOrder, device):
        self.query = order.source.to(device)
        extras = order.grid_tokens + torch.arange(order.extra_tokens)
        tail = torch.zeros(order.kv_positions - order.positions - order.extra_tokens, dtype=torch.long)
        self.key = torch.cat([order.source, extras, tail]).to(device)


def mod_result_tensor(value, like: torch.Tensor, dtype) -> torch.Tensor:
    """Mods may return Python numbers/bools (the reference accepts them); Flex needs tensors, in
    ``dtype`` (a score_mod's result in the score's dtype, as Problem.apply_score_mod gives it)."""
    return value.to(dtype) if torch.is_tensor(value) else torch.full_like(like, value, dtype=dtype)


def mask_mod(problem: Problem, order: TokenOrder, tables: List[AxisTables], flat: Optional[FlatIndices]):
    grid_positions, extra_end = order.positions, order.positions + order.extra_tokens
    user = problem.mask_mod

    def pattern_mask(b, h, q_idx, kv_idx):
        ok = None
        for t in tables:
            c = t.code[kv_idx]
            axis_ok = (t.lo[q_idx] <= c) & (c < t.hi[q_idx])
            ok = axis_ok if ok is None else ok & axis_ok
        if order.extra_tokens:
            ok = ok | ((kv_idx >= grid_positions) & (kv_idx < extra_end))
        if user is not None:
            ok = ok & mod_result_tensor(user(b, h, flat.query[q_idx], flat.key[kv_idx]), q_idx, torch.bool).bool()
        return ok

    return pattern_mask


def score_mod(problem: Problem, order: TokenOrder, tables: List[AxisTables], flat: Optional[FlatIndices], rpb,
              cap: Optional[torch.Tensor]):
    """None when the scores need nothing beyond Flex's scale (Flex then skips the hook). ``cap``:
    the softcap as a 0-dim tensor on the device (see run.Plan)."""
    user = problem.score_mod
    if rpb is None and user is None and cap is None:
        return None
    grid_positions = order.positions
    offsets = [axis.window - 1 for axis in problem.axes]
    limits = [2 * axis.window - 2 for axis in problem.axes]

    def composed(score, b, h, q_idx, kv_idx):
        if rpb is not None:
            index = [(t.unit[kv_idx] - t.unit[q_idx] + off).clamp(0, lim) for t, off, lim in zip(tables, offsets, limits)]
            bias = rpb[(h, *index)]
            score = score + torch.where(kv_idx < grid_positions, bias, torch.zeros_like(bias))
        if user is not None:
            score = mod_result_tensor(user(score, b, h, flat.query[q_idx], flat.key[kv_idx]), score, score.dtype)
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        return score

    return composed
