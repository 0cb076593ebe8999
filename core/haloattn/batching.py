"""torch.func.vmap of a call: the vmapped dimension folded into the batch.

Under ``vmap`` the call's rule receives the physical tensors and each one's vmapped dimension
(``in_dims``; None for an unbatched input). Every input with a batch axis (query, key, value and
the additional tokens) takes the vmapped dimension into that axis, so V calls of batch B become
one call of batch V * B on the same kernels; unbatched ones are repeated V times (a copy). The
per-head tables (``rpb``, ``kq_conv``) have no batch axis: where one of them is vmapped the call
runs once per vmapped index instead.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional, Sequence

import torch

from .problem import Problem, mods_on_indices

# Positions in AttentionInputs of the inputs without a batch axis.
SHARED = (3, 4)  # rpb, kq_conv


def fold(problem: Problem, size: int, tensors, dims, shared: Sequence[int] = SHARED):
    """The problem with batch ``size * B`` and the tensors folded into it; those at positions
    ``shared`` (the per-head tables of AttentionInputs) as they are."""
    folded = []
    for i, (t, d) in enumerate(zip(tensors, dims)):
        if t is None or i in shared:
            folded.append(t)
            continue
        t = t.movedim(d, 0) if d is not None else t.unsqueeze(0).expand(size, *t.shape)
        folded.append(t.reshape(size * t.shape[1], *t.shape[2:]))
    score_mod, mask_mod = _per_call_batch_index(problem.score_mod, problem.mask_mod, problem.batch)
    return dataclasses.replace(problem, batch=size * problem.batch, score_mod=score_mod, mask_mod=mask_mod), folded


@functools.lru_cache(maxsize=256)
def _per_call_batch_index(score_mod, mask_mod, batch: int):
    """The mods of a folded call: folded batch index ``v * B + b`` back to the ``b`` each
    vmapped call's mods expect (``b`` read a per-element table out of range, or a mask using
    ``b`` was silently another element's). Cached: the folded problem keys the backends' caches."""
    return mods_on_indices(score_mod, mask_mod, lambda b, h: (b % batch, h))


def unfold(size: int, t: torch.Tensor) -> torch.Tensor:
    """A folded output back to ``[size, B, ...]`` (vmapped dimension first)."""
    return t.reshape(size, t.shape[0] // size, *t.shape[1:])


def per_index(size: int, call: Callable, tensors, dims):
    """``call`` on each vmapped index's slice, outputs stacked on a new first dimension."""
    results = []
    for index in range(size):
        results.append(call(*(t if t is None or d is None else t.select(d, index) for t, d in zip(tensors, dims))))
    return tuple(None if parts[0] is None else torch.stack(parts) for parts in zip(*results))


def vmapped(size: int, call: Callable, problem: Problem, tensors, dims, shared: Sequence[int] = SHARED,
            may_fold: bool = True):
    """A vmap rule's result: ``call(problem, *tensors)`` once with the vmapped dimension folded
    into the batch where ``may_fold`` and no tensor at a ``shared`` position is vmapped, else once
    per vmapped index; every output (None stays None) with its vmapped dimension first, and the
    out_dims that say so."""
    if may_fold and all(dims[i] is None for i in shared):
        folded_problem, folded = fold(problem, size, tensors, dims, shared)
        outputs = tuple(None if o is None else unfold(size, o) for o in call(folded_problem, *folded))
    else:
        outputs = per_index(size, lambda *ts: call(problem, *ts), tensors, dims)
    return outputs, tuple(None if o is None else 0 for o in outputs)
