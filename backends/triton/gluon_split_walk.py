"""The Gluon forward's split walk: which key tiles of a query box's walk each consumer computes.

The Gluon forward cuts its 128-query box into two 64-query halves along one axis (the cut axis),
one per consumer warpgroup. Along that axis the halves see different keys: the walk's first tile
rows hold keys only the first half sees, its last rows keys only the second half sees. Computing
them in both consumers costs pairs whose scores the other half's mask sets to -inf (on a 31x31
window with 128 x 128 boxes, about a seventh of the products).

So the producer streams the walk in two phases, and both consumers follow the same order:

* the exclusive tiles first: each half's own tile rows (every tile of the other axes' walk in
  them), the halves' tiles alternating one by one while both have some, so both warpgroups work
  from the first tile on (each on its own tile: their products and softmaxes interleave on the
  tensor cores as FlashAttention-3's ping-pong schedule does). The owner computes a tile at once,
  without the software pipeline; the other consumer waits for the tile to land and releases it,
  so every consumer passes every barrier phase in order and never holds a slot while it waits;
* then the shared tile rows (both halves see some key of them), in the pipelined loop.

Tile rows that neither half sees (a gap between the halves' windows, as Swin windows can leave)
are not streamed. Without the split, the whole walk is shared and the stream is the walk itself.

These are plain Triton device functions (the Gluon kernel calls them unchanged), so the CPU
interpreter tests them against ``haloattn.geometry`` (tests/test_gluon_split_walk.py), and
tiles.py's cost model counts the same rows on the host (``_axis_split_steps``).
"""

import triton
import triton.language as tl

from .index_math import key_range, split3


@triton.jit
def pick3(v0, v1, v2, AXIS: tl.constexpr):
    """Entry ``AXIS`` of a per-axis triple."""
    if AXIS == 0:
        out = v0
    elif AXIS == 1:
        out = v1
    else:
        out = v2
    return out


@triton.jit
def with3(v0, v1, v2, AXIS: tl.constexpr, value):
    """The triple with entry ``AXIS`` replaced by ``value``."""
    if AXIS == 0:
        v0 = value + 0 * v0
    elif AXIS == 1:
        v1 = value + 0 * v1
    else:
        v2 = value + 0 * v2
    return v0, v1, v2


@triton.jit
def half_rows(xs, E, Lg, K, S, shift, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, start, steps, TN,
              SPLIT_WALK: tl.constexpr):
    """On the cut axis, for a box whose halves' queries start at ``xs`` and ``xs + E`` and whose
    walk visits ``steps`` key tiles of ``TN`` from ``start``: the tile rows the first half needs,
    ``[0, end0)``, and the second, ``[begin1, steps)``. A second half past the grid's end needs
    none (its rows are never stored). Without SPLIT_WALK both halves take the whole walk."""
    end0 = steps
    begin1 = 0 * steps
    if SPLIT_WALK:
        last0 = tl.minimum(xs + E - 1, Lg - 1)
        _, hi0 = key_range(last0, Lg, K, S, shift, CAUSAL, WINDOW)
        end0 = tl.minimum(tl.cdiv(hi0 - start, TN), steps)
        first1 = xs + E
        lo1, _ = key_range(tl.minimum(first1, Lg - 1), Lg, K, S, shift, CAUSAL, WINDOW)
        # lo1 >= the walk's first key >= start (ranges are monotone, the anchor only moves start
        # down), so the truncating division is a floor
        begin1 = tl.where(first1 < Lg, (lo1 - start) // TN, steps)
    return end0, begin1


@triton.jit
def stream_shape(end0, begin1, steps):
    """The stream's rows on the cut axis from ``half_rows``: how many rows only the first half
    needs (rows ``[0, own0)``), the shared rows ``[shared_lo, shared_lo + shared)``, and the rows
    only the second half needs (``[own1_lo, steps)``, ``own1`` of them)."""
    own0 = tl.minimum(begin1, end0)
    own1_lo = tl.maximum(begin1, end0)
    shared = tl.maximum(end0 - begin1, 0)
    return own0, begin1, shared, own1_lo, steps - own1_lo


@triton.jit
def exclusive_tile(t, tiles0, tiles1):
    """Stream position ``t`` of the exclusive phase (the halves' ``tiles0`` and ``tiles1`` own
    tiles, alternating while both have some, then the rest of the longer list): its owner (0 or
    1) and its index among that owner's tiles."""
    both = tl.minimum(tiles0, tiles1)
    alternating = t < 2 * both
    owner = tl.where(alternating, t % 2, (tiles1 > tiles0).to(tl.int32))
    index = tl.where(alternating, t // 2, both + t - 2 * both)
    return owner, index


@triton.jit
def rows_coords(index, rows, first, n0, n1, n2, AXIS: tl.constexpr):
    """Walk coordinates (j0, j1, j2) of the ``index``-th tile of ``rows`` rows from ``first`` on
    the cut axis ``AXIS`` times the other axes' whole walk, row-major."""
    e0, e1, e2 = with3(n0, n1, n2, AXIS, rows)
    j0, j1, j2 = split3(index, e1, e2)
    a = pick3(j0, j1, j2, AXIS)
    return with3(j0, j1, j2, AXIS, a + first)


@triton.jit
def exclusive_coords(owner, index, own0, own1_lo, own1, n0, n1, n2, AXIS: tl.constexpr):
    """Walk coordinates of the owner's ``index``-th exclusive tile (its own rows)."""
    return rows_coords(index, tl.where(owner == 0, own0, own1), tl.where(owner == 0, 0, own1_lo), n0, n1, n2, AXIS)


@triton.jit
def stream_coords(t, exclusive0, exclusive1, own0, shared_lo, shared, own1_lo, own1, n0, n1, n2,
                  AXIS: tl.constexpr):
    """Walk coordinates of stream position ``t``: the exclusive phase's ``exclusive0 +
    exclusive1`` tiles, then the shared ones."""
    exclusive = exclusive0 + exclusive1
    if t < exclusive:
        owner, index = exclusive_tile(t, exclusive0, exclusive1)
        j0, j1, j2 = exclusive_coords(owner, index, own0, own1_lo, own1, n0, n1, n2, AXIS)
    else:
        j0, j1, j2 = rows_coords(t - exclusive, shared, shared_lo, n0, n1, n2, AXIS)
    return j0, j1, j2


@triton.jit
def split_stream(xs0, xs1, xs2, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, st0, st1, st2, n0, n1, n2,
                 E, TN, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, AXIS: tl.constexpr,
                 SPLIT_WALK: tl.constexpr):
    """The stream of a box (origin ``xs``, halves ``E`` queries long on the cut axis ``AXIS``,
    whose causal flag is ``CAUSAL``; its walk from ``st``, ``n`` key tiles of ``TN`` on that
    axis): the halves' exclusive tile counts ``exclusive0``, ``exclusive1``, then
    ``stream_shape``'s rows (own0, shared_lo, shared, own1_lo, own1). The tile count of the
    shared phase is ``shared`` times the other axes' steps."""
    xs = pick3(xs0, xs1, xs2, AXIS)
    end0, begin1 = half_rows(xs, E, pick3(L0, L1, L2, AXIS), pick3(K0, K1, K2, AXIS), pick3(S0, S1, S2, AXIS),
                             pick3(F0, F1, F2, AXIS), CAUSAL, WINDOW, pick3(st0, st1, st2, AXIS),
                             pick3(n0, n1, n2, AXIS), TN, SPLIT_WALK)
    own0, shared_lo, shared, own1_lo, own1 = stream_shape(end0, begin1, pick3(n0, n1, n2, AXIS))
    r0, r1, r2 = with3(n0, n1, n2, AXIS, 1)
    across = r0 * r1 * r2
    return own0 * across, own1 * across, own0, shared_lo, shared, own1_lo, own1
