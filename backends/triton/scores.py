"""Score pipeline of SEMANTICS.md section 5 for one (query tile, key tile) pair, in Triton.

Scores leave these helpers in the log2 domain (multiplied by log2(e)) so the softmax uses exp2;
the tanh of softcap is returned too because its derivative is needed by the backward pass.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def mma(a, b, acc, PRECISION: tl.constexpr):
    """``a @ b + acc`` in float32. PRECISION "interpret" upcasts the operands first, because the CPU
    interpreter of Triton 3.6 multiplies bfloat16 operands as raw bits."""
    if PRECISION == "interpret":
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        c = tl.dot(a, b, acc, input_precision=PRECISION)
    return c


@triton.jit
def tanh(x):
    # 1 - 2 / (e^{2x} + 1) saturates cleanly to +-1 (inf / 0 in the exponent) and needs no libdevice,
    # so the interpreter runs it too.
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def relative_bias(RPB, srh, sr0, sr1, sr2, h, x0, x1, x2, y0, y1, y2, K0, K1, K2,
                  ROWS_ARE_QUERIES: tl.constexpr):
    """rpb[h, y - x + K - 1] per axis for every pair of the tile (clamped: masked pairs may fall
    outside the table and are discarded later)."""
    if ROWS_ARE_QUERIES:
        r0 = y0[None, :] - x0[:, None]
        r1 = y1[None, :] - x1[:, None]
        r2 = y2[None, :] - x2[:, None]
    else:
        r0 = y0[:, None] - x0[None, :]
        r1 = y1[:, None] - x1[None, :]
        r2 = y2[:, None] - x2[None, :]
    r0 = tl.minimum(tl.maximum(r0 + K0 - 1, 0), 2 * K0 - 2)
    r1 = tl.minimum(tl.maximum(r1 + K1 - 1, 0), 2 * K1 - 2)
    r2 = tl.minimum(tl.maximum(r2 + K2 - 1, 0), 2 * K2 - 2)
    return tl.load(RPB + h * srh + r0 * sr0 + r1 * sr1 + r2 * sr2).to(tl.float32)


@triton.jit
def log2_scores(s, softcap, HAS_SOFTCAP: tl.constexpr):
    """Scores (scaled, biased, modded) through softcap into the log2 domain; also tanh(s /
    softcap), or the scores themselves without softcap."""
    if HAS_SOFTCAP:
        t = tanh(s / softcap)
        s = t * (softcap * LOG2E)
    else:
        t = s
        s = s * LOG2E
    return s, t


@triton.jit
def finish_scores(qk, bias, scale, softcap, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
    """From raw dot products to log2-domain scores; also returns tanh(s / softcap) (or 0)."""
    if HAS_BIAS or HAS_SOFTCAP:
        s = qk * scale
        if HAS_BIAS:
            s = s + bias
        s, t = log2_scores(s, softcap, HAS_SOFTCAP)
    else:
        s = qk * (scale * LOG2E)
        t = s
    return s, t


@triton.jit
def _axis_within(lo, hi, y, ROWS_ARE_QUERIES: tl.constexpr):
    """[rows, cols] mask of one axis: key coordinate y in the query's [lo, hi)."""
    # One return: Triton 3.6 type-checks a return after a compile-time branch's own return, and
    # the two orientations differ in shape wherever rows and columns do (a 128 x 64 dQ tile).
    if ROWS_ARE_QUERIES:
        seen = (y[None, :] >= lo[:, None]) & (y[None, :] < hi[:, None])
    else:
        seen = (y[:, None] >= lo[None, :]) & (y[:, None] < hi[None, :])
    return seen


@triton.jit
def within(lo0, hi0, lo1, hi1, lo2, hi2, y0, y1, y2, ROWS_ARE_QUERIES: tl.constexpr, RANK: tl.constexpr):
    """Pair mask: key (y0, y1, y2) lies in the query's per-axis ranges on every axis. Axes that
    only pad the grid to rank 3 (length 1: every pair passes) are not tested: on the partial key
    tiles of a 2-D problem, most of a tile's pairs, that is a third of the mask's compares."""
    seen = _axis_within(lo2, hi2, y2, ROWS_ARE_QUERIES)
    if RANK >= 2:
        seen = seen & _axis_within(lo1, hi1, y1, ROWS_ARE_QUERIES)
    if RANK >= 3:
        seen = seen & _axis_within(lo0, hi0, y0, ROWS_ARE_QUERIES)
    return seen


@triton.jit
def mask_pairs(s, fill, lo0, hi0, lo1, hi1, lo2, hi2, y0, y1, y2, cross0, cross1, cross2,
               ROWS_ARE_QUERIES: tl.constexpr, RANK: tl.constexpr, AXIS_MASKS: tl.constexpr):
    """``s`` with ``fill`` at the pairs outside the window, for a key tile that crosses the
    program's common range on the axes flagged ``cross*`` (scalars; ``index_math.crosses``).
    On the other axes every pair is inside, so with ``AXIS_MASKS`` only the crossed axes are
    tested: most partial tiles of a 2-D or 3-D window cross one axis, and then pay one axis'
    compares per score instead of every axis'. Without it, any crossing tests all axes at once."""
    if AXIS_MASKS:
        if cross2:
            s = tl.where(_axis_within(lo2, hi2, y2, ROWS_ARE_QUERIES), s, fill)
        if RANK >= 2:
            if cross1:
                s = tl.where(_axis_within(lo1, hi1, y1, ROWS_ARE_QUERIES), s, fill)
        if RANK >= 3:
            if cross0:
                s = tl.where(_axis_within(lo0, hi0, y0, ROWS_ARE_QUERIES), s, fill)
    else:
        if cross0 | cross1 | cross2:
            s = tl.where(within(lo0, hi0, lo1, hi1, lo2, hi2, y0, y1, y2, ROWS_ARE_QUERIES, RANK), s, fill)
    return s
