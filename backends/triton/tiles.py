"""Tile shapes, warps and stages: the heuristic default and the tuning candidates.

A config is a dict of three kernel configs, ``{"fwd": ..., "dq": ..., "dkdv": ...}``, each
``{"q": [per-axis query tile], "kv": [per-axis key tile], "warps": w, "stages": s}`` with one
entry per spatial axis (powers of two). JSON-friendly so the core tuning cache can store it.
Tiles are adapted to the problem (``fit``) at launch, so a stored config never breaks a launch.
"""

from __future__ import annotations

import math
from typing import Dict, List, Sequence

from haloattn.problem import Problem


MIN_TILE = 16


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def group_extents(problem: Problem) -> List[int]:
    """Largest dilation group length per axis (group 0): ``ceil(L / Dl)``."""
    return [-(-a.length // a.dilation) for a in problem.axes]


def fit(shape: Sequence[int], extents: Sequence[int], tokens: int) -> List[int]:
    """A box of ``tokens`` tokens (a power of two) shaped like ``shape`` but no longer on an axis
    than that axis' (power-of-two rounded) extent; freed factors go to the fastest axes first."""
    caps = [_pow2_ceil(e) for e in extents]
    tile = [min(int(s), c) for s, c in zip(shape, caps)]
    for axis in reversed(range(len(tile))):
        while math.prod(tile) < tokens and tile[axis] < caps[axis]:
            tile[axis] *= 2
    while math.prod(tile) > tokens:
        axis = max(range(len(tile)), key=lambda a: tile[a])
        tile[axis] //= 2
    while math.prod(tile) < MIN_TILE:  # tl.dot needs at least 16 rows
        tile[-1] *= 2
    return tile


# Query / key tile shapes per rank for the forward (and dQ) walk: square-ish boxes keep the union
# of a tile's neighbourhoods small; the last axis is the longest because it is usually the widest.
_FWD_SHAPES = {
    1: ([128], [64]),
    2: ([8, 16], [8, 8]),
    3: ([2, 8, 8], [2, 4, 8]),
}
_SMALL_SHAPES = {
    1: ([64], [32]),
    2: ([8, 8], [4, 8]),
    3: ([1, 8, 8], [2, 4, 4]),
}


def _kernel_config(problem: Problem, q_shape, kv_shape, q_tokens, kv_tokens, warps, stages) -> Dict:
    ext = group_extents(problem)
    return {
        "q": fit(q_shape, ext, q_tokens),
        "kv": fit(kv_shape, ext, kv_tokens),
        "warps": warps,
        "stages": stages,
    }


def default_config(problem: Problem) -> Dict:
    """The heuristic: FlashAttention-2-like block sizes, smaller for head dims above 128."""
    r = problem.rank
    big = max(problem.head_dim, problem.value_dim) > 128
    q_shape, kv_shape = _FWD_SHAPES[r]
    small_q, small_kv = _SMALL_SHAPES[r]
    if big:
        fwd = _kernel_config(problem, small_q, small_kv, 64, 32, 4, 2)
        dq = _kernel_config(problem, small_q, small_kv, 64, 32, 4, 2)
        dkdv = _kernel_config(problem, small_kv, small_q, 32, 64, 4, 2)
    else:
        fwd = _kernel_config(problem, q_shape, kv_shape, 128, 64, 8 if problem.head_dim > 64 else 4, 3)
        dq = _kernel_config(problem, q_shape, small_kv, 128, 32, 8, 2)
        dkdv = _kernel_config(problem, small_kv, q_shape, 32, 128, 8, 2)
    return {"fwd": fwd, "dq": dq, "dkdv": dkdv}


def candidate_configs(problem: Problem) -> List[Dict]:
    """The tuning space: the default plus variations of block sizes, warps and stages."""
    base = default_config(problem)
    r = problem.rank
    q_shape, kv_shape = _FWD_SHAPES[r]
    small_q, small_kv = _SMALL_SHAPES[r]
    out = [base]
    if max(problem.head_dim, problem.value_dim) <= 128:
        for q_tok, kv_tok, qs, ks, warps, stages in (
            (128, 128, q_shape, q_shape, 8, 2),
            (128, 64, q_shape, kv_shape, 4, 3),
            (128, 32, q_shape, small_kv, 8, 3),
            (64, 64, small_q, kv_shape, 4, 3),
            (64, 32, small_q, small_kv, 4, 4),
        ):
            cfg = dict(base)
            cfg["fwd"] = _kernel_config(problem, qs, ks, q_tok, kv_tok, warps, stages)
            out.append(cfg)
        for dkdv in (
            _kernel_config(problem, small_kv, q_shape, 64, 128, 8, 2),
            _kernel_config(problem, small_kv, small_q, 32, 64, 4, 3),
        ):
            cfg = dict(base)
            cfg["dkdv"] = dkdv
            out.append(cfg)
    return out


def normalise(config, problem: Problem) -> Dict:
    """Fill in and fit a (possibly partial or stale) config for this problem."""
    base = default_config(problem)
    if not config:
        return base
    ext = group_extents(problem)
    out = {}
    for kernel, default in base.items():
        given = dict(default, **(config.get(kernel) or {}))
        for part in ("q", "kv"):
            shape = list(given[part])
            if len(shape) != problem.rank:
                shape = default[part]
            given[part] = fit(shape, ext, _pow2_ceil(math.prod(shape)))
        out[kernel] = given
    return out
