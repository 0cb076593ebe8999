"""Fused forward of the key-query convolution (Multi-Token Attention, SEMANTICS.md section 6).

One program per (query tile, head, batch): BM consecutive grid rows. The keys its rows see form
one run of grid columns (``kq_conv_launch.tile_runs``), walked in BN-column key tiles. A target
tile's convolved scores ``C`` need S0 on the ``c_q - 1`` rows above it and ``HK = c_k // 2``
columns either side, so for each row shift ``a`` the program multiplies the shifted query rows
with the key tile and its two HALO-column neighbours (S0 in source coordinates, masked there by
the pattern: exact at every window edge, grid edge and dilation group), and convolves along the
keys with one more product per part: ``C += S0_a @ T_a``, where ``T_a`` is the kernel row
``W[h, a]`` laid out as a band (Toeplitz) matrix from the source columns to the target columns
(built on the host: ``kq_conv_launch.toeplitz_bands``). Every step is a tensor-core product; no
score leaves the chip, and memory beyond the inputs and outputs stays O(heads * c_q * BN^2).

Then the pipeline of section 5 (rpb, softcap, the pattern's mask on target pairs, the online
softmax over the grid keys and the additional tokens, whose scores are not convolved) as in the
neighbourhood forward. Everything is in grid tokens: the shifts are grid tokens whatever the
dilation, and a dilated problem's run includes the other groups' columns, which the masks drop.
"""

import triton
import triton.language as tl

from .index_math import group_length, key_range
from .scores import LN2, LOG2E, mma, tanh


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
def load_rows(ptr, rows, row_stride, L, BLOCK_D: tl.constexpr, width, LARGE: tl.constexpr):
    """``[rows, BLOCK_D]`` tile of a token-major tensor; zero outside the grid and past ``width``."""
    d = tl.arange(0, BLOCK_D)
    r = tl.minimum(tl.maximum(rows, 0), L - 1)
    if LARGE:
        r = r.to(tl.int64)
    ok = ((rows >= 0) & (rows < L))[:, None] & (d < width)[None, :]
    return tl.load(ptr + r[:, None] * row_stride + d[None, :], mask=ok, other=0.0)


@triton.jit
def convolve(s0, bands, acc, CONV_PRECISION: tl.constexpr):
    """``acc + s0 @ bands``: float16 operands where the inputs are float16 (10 mantissa bits, as
    TF32, at twice its rate), else float32 ones under CONV_PRECISION (see kq_conv_launch)."""
    if CONV_PRECISION == "float16":
        c = tl.dot(s0.to(tl.float16), bands, acc)
    else:
        c = mma(s0, bands, acc, CONV_PRECISION)
    return c


@triton.jit
def source_part(q_a, k_part, src_rows, cols, bands_ptr, band_rows, L, Dl, K, S, shift, scale, c,
                BN: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, PRECISION: tl.constexpr,
                CONV_PRECISION: tl.constexpr):
    """One part (a key tile or a halo) of a row shift: its S0, masked where the source pair is not
    attended, convolved into the target tile's ``c``."""
    s0 = mma(q_a, tl.trans(k_part), tl.zeros([q_a.shape[0], k_part.shape[0]], dtype=tl.float32), PRECISION)
    s0 = tl.where(grid_sees(src_rows, cols, L, Dl, K, S, shift, CAUSAL, WINDOW), s0 * scale, 0.0)
    bands = tl.load(bands_ptr + band_rows[:, None] * BN + tl.arange(0, BN)[None, :])
    return convolve(s0, bands, c, CONV_PRECISION)


@triton.jit
def kq_conv_forward_kernel(
    Q, K, V, O, LSE, BANDS, RUNS, RPB, AK, AV,
    sqb, sql, sqh, skb, skl, skh, svb, svl, svh, sob, sol, soh, slb, sll, slh,
    sbh, sba, srh, srk, sakb, sake, sakh, savb, save, savh,
    GROUP, EXTRA, D, DV, L, Dl, WIN, S, shift, scale, softcap,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, C_Q: tl.constexpr, HALO: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_RPB: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_EXTRA: tl.constexpr, LARGE: tl.constexpr,
    PRECISION: tl.constexpr, CONV_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    kvh = h // GROUP
    if LARGE:
        b = b.to(tl.int64)
        h = h.to(tl.int64)
        kvh = kvh.to(tl.int64)
    q_base = Q + b * sqb + h * sqh
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh
    bands_base = BANDS + h * sbh
    rows = tile * BM + tl.arange(0, BM)
    run_lo = tl.load(RUNS + 2 * tile)
    run_hi = tl.load(RUNS + 2 * tile + 1)

    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, BLOCK_DV], dtype=tl.float32)
    dv = tl.arange(0, BLOCK_DV)
    # rows of the band matrices: the left halo's, the key tile's, the right halo's
    center_rows = HALO + tl.arange(0, BN)
    if HALO > 0:
        left_rows = tl.arange(0, HALO)
        right_rows = HALO + BN + tl.arange(0, HALO)

    for n0 in range(run_lo, run_hi, BN):
        cols = n0 + tl.arange(0, BN)
        k_tile = load_rows(k_base, cols, skl, L, BLOCK_D, D, LARGE)
        if HALO > 0:
            left = n0 - HALO + tl.arange(0, HALO)
            right = n0 + BN + tl.arange(0, HALO)
            k_left = load_rows(k_base, left, skl, L, BLOCK_D, D, LARGE)
            k_right = load_rows(k_base, right, skl, L, BLOCK_D, D, LARGE)
        c = tl.zeros([BM, BN], dtype=tl.float32)
        for a in tl.static_range(C_Q):
            src = rows - (C_Q - 1) + a
            q_a = load_rows(q_base, src, sql, L, BLOCK_D, D, LARGE)
            bands_a = bands_base + a * sba
            c = source_part(q_a, k_tile, src, cols, bands_a, center_rows, L, Dl, WIN, S, shift, scale, c,
                            BN, CAUSAL, WINDOW, PRECISION, CONV_PRECISION)
            if HALO > 0:
                c = source_part(q_a, k_left, src, left, bands_a, left_rows, L, Dl, WIN, S, shift, scale, c,
                                BN, CAUSAL, WINDOW, PRECISION, CONV_PRECISION)
                c = source_part(q_a, k_right, src, right, bands_a, right_rows, L, Dl, WIN, S, shift, scale, c,
                                BN, CAUSAL, WINDOW, PRECISION, CONV_PRECISION)
        keep = grid_sees(rows, cols, L, Dl, WIN, S, shift, CAUSAL, WINDOW)
        if HAS_RPB:
            # NATTEN's index: key minus query in group units, + K - 1 (clamped: masked pairs)
            rel = (tl.minimum(tl.maximum(cols, 0), L - 1) // Dl)[None, :] - (tl.minimum(rows, L - 1) // Dl)[:, None]
            rel = tl.minimum(tl.maximum(rel + WIN - 1, 0), 2 * WIN - 2)
            c = c + tl.load(RPB + h * srh + rel * srk).to(tl.float32)
        if HAS_SOFTCAP:
            c = softcap * tanh(c / softcap)
        s = tl.where(keep, c * LOG2E, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_safe)
        p = tl.math.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_tile = load_rows(v_base, cols, svl, L, BLOCK_DV, DV, LARGE)
        acc = mma(p.to(v_tile.dtype), v_tile, acc * alpha[:, None], PRECISION)
        m_i = m_new

    if HAS_EXTRA:
        # additional tokens: plain scores (no convolution, no rpb), in the same softmax
        q_rows = load_rows(q_base, rows, sql, L, BLOCK_D, D, LARGE)
        d = tl.arange(0, BLOCK_D)
        for e0 in range(0, EXTRA, BE):
            e = e0 + tl.arange(0, BE)
            e_ok = e < EXTRA
            ak = tl.load(AK + b * sakb + kvh * sakh + e[:, None] * sake + d[None, :],
                         mask=e_ok[:, None] & (d < D)[None, :], other=0.0)
            se = mma(q_rows, tl.trans(ak), tl.zeros([BM, BE], dtype=tl.float32), PRECISION) * scale
            if HAS_SOFTCAP:
                se = softcap * tanh(se / softcap)
            se = tl.where(e_ok[None, :], se * LOG2E, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(se, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.math.exp2(m_i - m_safe)
            p = tl.math.exp2(se - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            av = tl.load(AV + b * savb + kvh * savh + e[:, None] * save + dv[None, :],
                         mask=e_ok[:, None] & (dv < DV)[None, :], other=0.0)
            acc = mma(p.to(av.dtype), av, acc * alpha[:, None], PRECISION)
            m_i = m_new

    # every grid query attends itself, so l_i > 0 on real rows
    row_ok = rows < L
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(l_i > 0, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
    r = rows
    if LARGE:
        r = r.to(tl.int64)
    tl.store(O + b * sob + h * soh + r[:, None] * sol + dv[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (dv < DV)[None, :])
    tl.store(LSE + b * slb + h * slh + r * sll, lse, mask=row_ok)
