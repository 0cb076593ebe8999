"""Folding per-(query, key) bias gradients into a relative-position bias table.

A table entry is a product of per-axis entries, each set by one axis' query coordinate and key
slot alone, so the scatter-add from (query, slot) pairs into the table factorises into one step
per axis: gather each coordinate's slots into its row of 2K-1 entries, then sum the rows over the
coordinate. Deterministic (no atomics, a fixed summation order), and its memory is about twice
the gradient's: a dense one-hot matrix of [coordinates x slots, entries] would grow with the axis
length times the window's square (69 GB for a 1-D window of 1023 over 4096 tokens)."""

from __future__ import annotations

from typing import Tuple

import torch


def slots_of_entries(first_entry: torch.Tensor, window: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """For each coordinate x (``first_entry[x]``: the table entry of its slot 0; slot p holds
    entry first_entry + p) and table entry r in 0..2K-2: the slot of x that holds r, clamped into
    0..K-1, as ``[L, 2K-1]`` int64, and whether one does (``[L, 2K-1]`` bool)."""
    entries = torch.arange(2 * window - 1, device=first_entry.device)
    slot = entries[None, :] - first_entry[:, None]
    return slot.clamp(0, window - 1), (slot >= 0) & (slot < window)


def fold_axis(grad: torch.Tensor, coordinate_dim: int, slot_dim: int, slot: torch.Tensor,
              present: torch.Tensor) -> torch.Tensor:
    """``grad`` with its (coordinate, slot) dims of one axis replaced by one dim of table entries,
    appended last: the sum over coordinates of each coordinate's slots, placed at their entries
    (``slot``, ``present`` from ``slots_of_entries``)."""
    grad = grad.movedim((coordinate_dim, slot_dim), (-2, -1))
    index = slot.expand(*grad.shape[:-1], slot.shape[-1])
    picked = torch.gather(grad, -1, index)
    return picked.mul_(present).sum(-2)  # in place: one temporary of about twice grad, not two


def fold_into_table(grad: torch.Tensor, slots) -> torch.Tensor:
    """``grad`` of dims [h, x_1 .. x_r, p_1 .. p_r] (query coordinates, key slots) folded into
    [h, r_1 .. r_r] table entries, axis by axis; ``slots``: each axis' ``slots_of_entries``."""
    rank = len(slots)
    for a, (slot, present) in enumerate(slots):
        # dims now: [h, x_a .. x_r, p_a .. p_r, r_1 .. r_(a-1)]
        grad = fold_axis(grad, 1, 1 + rank - a, slot, present)
    return grad
