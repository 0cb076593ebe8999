"""Per-axis window rules of SEMANTICS.md as Triton device functions.

They mirror ``haloattn.geometry`` (``neighborhood_range``, ``window_range``, ``query_range``,
``window_query_range``) formula for formula, in dilation-group units. Every argument is a
non-negative integer (scalar or tensor), so Triton's truncating ``//`` equals floor division.
All ranges are monotone non-decreasing in the coordinate: the union over a box of queries (or
keys) is ``[range(first).lo, range(last).hi)``, which the kernels use to bound their loops.
"""

import triton
import triton.language as tl


@triton.jit
def key_range(x, Lg, K, S, shift, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """Keys ``[lo, hi)`` that group coordinate ``x`` sees on one axis (forward rule)."""
    if WINDOW:
        # shift == 0 gives (x // K) * K as well, so one formula covers W-MSA and SW-MSA.
        raw = ((x + K - shift) // K) * K - (K - shift)
        lo = tl.maximum(raw, 0)
        hi = tl.minimum(raw + K, Lg)
        if CAUSAL:
            hi = tl.minimum(hi, x + 1)
    else:
        if CAUSAL:
            leader = tl.minimum((x // S) * S + S - 1, Lg - 1)
            lo = tl.maximum(leader - K + 1, 0)
            hi = x + 1
        else:
            leader = tl.minimum((x // S) * S + S // 2, Lg - 1)
            lo = tl.minimum(tl.maximum(leader - K // 2, 0), Lg - K)
            hi = lo + K
    return lo, hi


@triton.jit
def query_range(y, Lg, K, S, shift, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """Queries ``[lo, hi)`` that see group key ``y`` on one axis (inverse rule)."""
    if WINDOW:
        raw = ((y + K - shift) // K) * K - (K - shift)
        lo = tl.maximum(raw, 0)
        hi = tl.minimum(raw + K, Lg)
        if CAUSAL:
            lo = y + 0 * lo
    else:
        if CAUSAL:
            lo = y
            hi = tl.minimum(((y + K) // S + (y + K >= Lg).to(tl.int32)) * S, Lg)
        else:
            right = K // 2 + K % 2 - 1
            off = S - S // 2 - 1
            # y - right + off >= 0 whenever y >= K; the unselected branch may be garbage.
            lo = tl.where(y >= K, (tl.maximum(y - right + off, 0) // S) * S, 0)
            hi = tl.where(y >= Lg - K, Lg, ((y + K // 2 + off + 1) // S) * S)
    return lo, hi


@triton.jit
def tile_start(lo, hi, common_lo, common_hi, T, ANCHOR: tl.constexpr):
    """Where the walk over ``[lo, hi)`` in ``T``-wide tiles starts on one axis.

    ``[common_lo, common_hi)`` is the part every row of the program sees (the intersection of its
    ranges; ``lo <= common_lo`` by monotonicity). Tiles inside it need no per-pair mask on this
    axis. Walking from ``lo`` puts a tile boundary wherever ``lo`` falls; with ``ANCHOR`` the grid
    is shifted back (by less than ``T``) so that a tile starts at ``common_lo``, which fits
    ``(common_hi - common_lo) // T`` whole tiles inside instead of possibly one fewer. The shift
    is taken only where the common part holds a whole tile and the walk keeps its tile count, so
    it never adds a step. The first tile may then start below 0: loads mask those rows."""
    start = lo
    if ANCHOR:
        anchored = lo - (T - (common_lo - lo) % T) % T
        same_steps = tl.cdiv(hi - anchored, T) == tl.cdiv(hi - lo, T)
        start = tl.where((common_hi - common_lo >= T) & same_steps, anchored, lo)
    return start


@triton.jit
def key_walk(xs, Lg, K, S, shift, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, TM, TN, ANCHOR: tl.constexpr):
    """One axis of a query tile ``[xs, xs + TM)`` (clipped to the grid): where its walk over
    ``TN``-wide key tiles starts, how many tiles it visits, and the keys every query of it sees
    ``[common_lo, common_hi)`` (by monotonicity: the last query's low end, the first one's high)."""
    xl = tl.minimum(xs + TM - 1, Lg - 1)
    lo, common_hi = key_range(xs, Lg, K, S, shift, CAUSAL, WINDOW)
    common_lo, hi = key_range(xl, Lg, K, S, shift, CAUSAL, WINDOW)
    start = tile_start(lo, hi, common_lo, common_hi, TN, ANCHOR)
    return start, tl.cdiv(hi - start, TN), common_lo, common_hi


@triton.jit
def query_walk(ys, Lg, K, S, shift, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, TN, TM, ANCHOR: tl.constexpr):
    """``key_walk`` by the inverse rule: the walk over ``TM``-wide query tiles that see any key of
    ``[ys, ys + TN)``, anchored where the queries that see every key of it begin."""
    yl = tl.minimum(ys + TN - 1, Lg - 1)
    lo, common_hi = query_range(ys, Lg, K, S, shift, CAUSAL, WINDOW)
    common_lo, hi = query_range(yl, Lg, K, S, shift, CAUSAL, WINDOW)
    start = tile_start(lo, hi, common_lo, common_hi, TM, ANCHOR)
    return start, tl.cdiv(hi - start, TM)


@triton.jit
def crosses(start, T, common_lo, common_hi):
    """Whether the tile ``[start, start + T)`` reaches outside the common part on this axis (its
    pairs then need this axis' mask)."""
    return (start < common_lo) | (start + T > common_hi)


@triton.jit
def split3(t, E1, E2):
    """Row-major coordinates of ``t`` in a box whose two fastest extents are ``E1``, ``E2``."""
    return t // (E1 * E2), (t // E2) % E1, t % E2


@triton.jit
def next3(j0, j1, j2, E1, E2):
    """The coordinates after ``(j0, j1, j2)`` in the row-major order of ``split3``: a loop that
    walks a box carries this cursor instead of calling ``split3`` on its counter, whose two
    runtime divisions (about 25 instructions each) are paid on every tile otherwise."""
    j2 += 1
    wrap2 = j2 == E2
    j1 += wrap2.to(tl.int32)
    wrap1 = j1 == E1
    return j0 + wrap1.to(tl.int32), tl.where(wrap1, 0, j1), tl.where(wrap2, 0, j2)


@triton.jit
def group_length(L, g, Dl):
    """Tokens of dilation group ``g`` on an axis of length ``L``: ``ceil((L - g) / Dl)``."""
    return (L - g + Dl - 1) // Dl


@triton.jit
def list_step(live, index, E1, E2):
    """Entry ``index`` of a live-step list (live_steps.py): the step's coordinates in its walk's
    box (fastest extents ``E1``, ``E2``) and whether it is full (mask_mod keeps every pair there)."""
    entry = tl.load(live + 1 + index)
    j0, j1, j2 = split3(entry >> 1, E1, E2)
    return j0, j1, j2, (entry & 1) != 0
