"""Device functions shared by the key-query convolution's kernels (kq_conv_kernel, kq_conv_backward).

A key tile is BN consecutive grid columns from ``n0``; its HALO-column neighbours on either side
(the left and right halos) hold the source columns the convolution reaches past it. The band
matrices (``kq_conv_launch.toeplitz_bands``) are ``[H, c_q, HALO + BN + HALO, BN]``: their rows
are the source columns in that order (left halo, key tile, right halo), their columns the target
columns of the key tile. Everything is in grid tokens (see kq_conv_kernel).
"""

import triton
import triton.language as tl

from .index_math import group_length, key_range
from .scores import LOG2E, mma, tanh


@triton.jit
def query_program(Q, K, V, sqb, sqh, skb, skh, svb, svh, GROUP, LARGE: tl.constexpr):
    """A program over query tiles (grid: tiles, heads, batch): its tile, batch, head and key head
    (int64 with LARGE) and its q, k, v base pointers."""
    tile = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    kvh = h // GROUP
    if LARGE:
        b = b.to(tl.int64)
        h = h.to(tl.int64)
        kvh = kvh.to(tl.int64)
    return tile, b, h, kvh, Q + b * sqb + h * sqh, K + b * skb + kvh * skh, V + b * svb + kvh * svh


@triton.jit
def grid_sees(i, j, L, Dl, K, S, shift, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """[rows, cols] mask: grid query ``i`` attends grid key ``j`` (both may lie outside the grid,
    which attends nothing): same dilation group, and ``j``'s group coordinate in ``i``'s range."""
    inside = (i >= 0) & (i < L)
    ic = tl.minimum(tl.maximum(i, 0), L - 1)
    jc = tl.minimum(tl.maximum(j, 0), L - 1)
    g = ic % Dl
    lo, hi = key_range(ic // Dl, group_length(L, g, Dl), K, S, shift, CAUSAL, WINDOW)
    y = jc // Dl
    seen = (y[None, :] >= lo[:, None]) & (y[None, :] < hi[:, None]) & ((jc % Dl)[None, :] == g[:, None])
    return seen & inside[:, None] & ((j >= 0) & (j < L))[None, :]


@triton.jit
def all_attended(row_lo, row_hi, col_lo, col_hi, L, Dl, K, S, shift, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """Whether every pair of rows ``[row_lo, row_hi]`` x columns ``[col_lo, col_hi]`` is attended
    (scalars): all inside the grid, no dilation (other groups' columns never are), and the last
    row's first key and the first row's last key bracketing the columns (the ranges are monotone).
    Such tiles skip the per-pair mask: most of a long window's tiles."""
    inside = (row_lo >= 0) & (row_hi < L) & (col_lo >= 0) & (col_hi < L) & (Dl == 1)
    lo, _ = key_range(tl.minimum(tl.maximum(row_hi, 0), L - 1), L, K, S, shift, CAUSAL, WINDOW)
    _, hi = key_range(tl.minimum(tl.maximum(row_lo, 0), L - 1), L, K, S, shift, CAUSAL, WINDOW)
    return inside & (lo <= col_lo) & (hi > col_hi)


@triton.jit
def attended(x, fill, full, rows, cols, L, Dl, K, S, shift, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """``x`` with ``fill`` on the pairs not attended, unless ``full`` (all_attended) says none is."""
    if full:
        y = x
    else:
        y = tl.where(grid_sees(rows, cols, L, Dl, K, S, shift, CAUSAL, WINDOW), x, fill)
    return y


@triton.jit
def load_rows(ptr, rows, row_stride, L, BLOCK_D: tl.constexpr, width, LARGE: tl.constexpr):
    """``[rows, BLOCK_D]`` tile of a token-major tensor; zero outside the grid and past ``width``."""
    d = tl.arange(0, BLOCK_D)
    r = tl.minimum(tl.maximum(rows, 0), L - 1)
    if LARGE:
        r = r.to(tl.int64)
    ok = ((rows >= 0) & (rows < L))[:, None] & (d < width)[None, :]
    return tl.load(ptr + r[:, None] * row_stride + d[None, :], mask=ok, other=0.0)


@triton.jit
def load_row_stats(ptr, rows, row_stride, L, LARGE: tl.constexpr):
    """One float32 per row (LSE, or the backward's delta); 0 outside the grid."""
    r = tl.minimum(tl.maximum(rows, 0), L - 1)
    if LARGE:
        r = r.to(tl.int64)
    return tl.load(ptr + r * row_stride, mask=(rows >= 0) & (rows < L), other=0.0)


@triton.jit
def key_parts(k_base, row_stride, n0, L, BN: tl.constexpr, HALO: tl.constexpr, BLOCK_D: tl.constexpr, width,
              LARGE: tl.constexpr):
    """The key tile and its left and right halos (without halos, the key tile three times: the
    callers then never read the other two)."""
    k_tile = load_rows(k_base, n0 + tl.arange(0, BN), row_stride, L, BLOCK_D, width, LARGE)
    k_left = k_tile
    k_right = k_tile
    if HALO > 0:
        k_left = load_rows(k_base, n0 - HALO + tl.arange(0, HALO), row_stride, L, BLOCK_D, width, LARGE)
        k_right = load_rows(k_base, n0 + BN + tl.arange(0, HALO), row_stride, L, BLOCK_D, width, LARGE)
    return k_tile, k_left, k_right


@triton.jit
def tf32_nearest(x):
    """float32 ``x`` rounded to the nearest TF32 value (10 mantissa bits; ties away from zero).
    The tensor cores take a float32 operand's TF32 part by dropping its low 13 bits, which shrinks
    every product by about 2^-11 on average: a bias that the kernel weight's gradient, a sum over
    every pair whose terms cancel, does not average out (kq_conv_launch.tf32_nearest says how much)."""
    return ((x.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def convolve(s0, bands, acc, CONV_PRECISION: tl.constexpr):
    """``acc + s0 @ bands`` in float32 operands under CONV_PRECISION (kq_conv_launch.conv_precision:
    the forward's and the backward's recomputation must round S0 alike). In TF32, S0 is rounded to
    nearest first (the bands are, on the host: kq_conv_launch.conv_bands)."""
    if CONV_PRECISION == "tf32":
        s0 = tf32_nearest(s0)
    return mma(s0, bands, acc, CONV_PRECISION)


@triton.jit
def source_scores(q_rows, k_part, src_rows, cols, full, L, Dl, K, S, shift, scale, CAUSAL: tl.constexpr,
                  WINDOW: tl.constexpr, PRECISION: tl.constexpr):
    """S0 of one part: ``scale * q k^T`` where the source pair is attended, else 0 (``full``:
    every pair is)."""
    s0 = mma(q_rows, tl.trans(k_part), tl.zeros([q_rows.shape[0], k_part.shape[0]], dtype=tl.float32), PRECISION)
    return attended(s0 * scale, 0.0, full, src_rows, cols, L, Dl, K, S, shift, CAUSAL, WINDOW)


@triton.jit
def sources_attended(row0, n0, L, Dl, K, S, shift, C_Q: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                     HALO: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """all_attended over every source of target rows ``[row0, row0 + BM)`` on the key tile at
    ``n0``: the ``c_q - 1`` rows above them too, the halos' columns too."""
    return all_attended(row0 - (C_Q - 1), row0 + BM - 1, n0 - HALO, n0 + BN + HALO - 1, L, Dl, K, S, shift,
                        CAUSAL, WINDOW)


@triton.jit
def targets_attended(row0, n0, L, Dl, K, S, shift, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
                     WINDOW: tl.constexpr):
    """all_attended over the target tile ``[row0, row0 + BM) x [n0, n0 + BN)``."""
    return all_attended(row0, row0 + BM - 1, n0, n0 + BN - 1, L, Dl, K, S, shift, CAUSAL, WINDOW)


@triton.jit
def band_part(bands_a, band_rows, BN: tl.constexpr):
    """Rows ``band_rows`` of one kernel row's band matrix: ``[len(band_rows), BN]``."""
    return tl.load(bands_a + band_rows[:, None] * BN + tl.arange(0, BN)[None, :])


@triton.jit
def band_part_transposed(bands_a, band_rows, BN: tl.constexpr):
    """The same part transposed: ``[BN, len(band_rows)]`` (the backward's map from target columns
    back to source columns)."""
    return tl.load(bands_a + band_rows[None, :] * BN + tl.arange(0, BN)[:, None])


@triton.jit
def convolved_tile(q_base, q_row_stride, k_tile, k_left, k_right, n0, rows, full, bands_base, band_stride,
                   L, Dl, K, S, shift, scale,
                   BM: tl.constexpr, BN: tl.constexpr, HALO: tl.constexpr, C_Q: tl.constexpr,
                   BLOCK_D: tl.constexpr, width, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                   LARGE: tl.constexpr, PRECISION: tl.constexpr, CONV_PRECISION: tl.constexpr):
    """The convolved scores C of target rows ``rows`` on the key tile at ``n0``: for each row
    shift ``a``, S0 of the rows ``c_q - 1 - a`` above on the tile and its halos, through the band
    matrices of kernel row ``a``. ``full``: every source pair is attended (sources_attended)."""
    c = tl.zeros([BM, BN], dtype=tl.float32)
    cols = n0 + tl.arange(0, BN)
    center_rows = HALO + tl.arange(0, BN)
    # A loop at run time, not unrolled: each shift's product operands then reuse one set of
    # shared-memory buffers (unrolled, six shifts of MTA's kernel asked for 270 KiB on sm_90).
    for a in range(C_Q):
        src = rows - (C_Q - 1) + a
        q_a = load_rows(q_base, src, q_row_stride, L, BLOCK_D, width, LARGE)
        bands_a = bands_base + a * band_stride
        s0 = source_scores(q_a, k_tile, src, cols, full, L, Dl, K, S, shift, scale, CAUSAL, WINDOW, PRECISION)
        c = convolve(s0, band_part(bands_a, center_rows, BN), c, CONV_PRECISION)
        if HALO > 0:
            left = tl.arange(0, HALO)
            s0 = source_scores(q_a, k_left, src, n0 - HALO + left, full, L, Dl, K, S, shift, scale, CAUSAL,
                               WINDOW, PRECISION)
            c = convolve(s0, band_part(bands_a, left, BN), c, CONV_PRECISION)
            s0 = source_scores(q_a, k_right, src, n0 + BN + left, full, L, Dl, K, S, shift, scale, CAUSAL,
                               WINDOW, PRECISION)
            c = convolve(s0, band_part(bands_a, HALO + BN + left, BN), c, CONV_PRECISION)
    return c


@triton.jit
def target_scores(c, rows, cols, RPB, rpb_head_stride, rpb_stride, h, L, Dl, K, softcap,
                  HAS_RPB: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
    """C through the rest of section 5 (rpb, softcap), in log2 units; also tanh(s / softcap)
    (or 0), which the backward's softcap derivative needs."""
    if HAS_RPB:
        # NATTEN's index: key minus query in group units, + K - 1 (clamped: masked pairs)
        rel = (tl.minimum(tl.maximum(cols, 0), L - 1) // Dl)[None, :] - (tl.minimum(tl.maximum(rows, 0), L - 1) // Dl)[:, None]
        rel = tl.minimum(tl.maximum(rel + K - 1, 0), 2 * K - 2)
        c = c + tl.load(RPB + h * rpb_head_stride + rel * rpb_stride).to(tl.float32)
    t = c * 0.0
    if HAS_SOFTCAP:
        t = tanh(c / softcap)
        c = softcap * t
    return c * LOG2E, t
