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

from .kq_conv_scores import (attended, convolved_tile, key_parts, load_rows, query_program, sources_attended,
                             target_scores, targets_attended)
from .scores import LN2, LOG2E, mma, tanh


@triton.jit
def softmax_step(s, v_tile, m_i, l_i, acc, PRECISION: tl.constexpr):
    """One online-softmax step over log2-domain scores ``s`` (-inf where masked) and their values."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)
    p = tl.math.exp2(s - m_safe[:, None])
    acc = mma(p.to(v_tile.dtype), v_tile, acc * alpha[:, None], PRECISION)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


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
    tile, b, h, kvh, q_base, k_base, v_base = query_program(Q, K, V, sqb, sqh, skb, skh, svb, svh, GROUP, LARGE)
    row0 = tile * BM
    rows = row0 + tl.arange(0, BM)
    run_lo = tl.load(RUNS + 2 * tile)
    run_hi = tl.load(RUNS + 2 * tile + 1)

    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, BLOCK_DV], dtype=tl.float32)
    dv = tl.arange(0, BLOCK_DV)

    for n0 in range(run_lo, run_hi, BN):
        cols = n0 + tl.arange(0, BN)
        k_tile, k_left, k_right = key_parts(k_base, skl, n0, L, BN, HALO, BLOCK_D, D, LARGE)
        full = sources_attended(row0, n0, L, Dl, WIN, S, shift, C_Q, BM, BN, HALO, CAUSAL, WINDOW)
        c = convolved_tile(q_base, sql, k_tile, k_left, k_right, n0, rows, full, BANDS + h * sbh, sba,
                           L, Dl, WIN, S, shift, scale, BM, BN, HALO, C_Q, BLOCK_D, D, CAUSAL, WINDOW, LARGE,
                           PRECISION, CONV_PRECISION)
        s, _ = target_scores(c, rows, cols, RPB, srh, srk, h, L, Dl, WIN, softcap, HAS_RPB, HAS_SOFTCAP)
        s = attended(s, float("-inf"), targets_attended(row0, n0, L, Dl, WIN, S, shift, BM, BN, CAUSAL, WINDOW),
                     rows, cols, L, Dl, WIN, S, shift, CAUSAL, WINDOW)
        v_tile = load_rows(v_base, cols, svl, L, BLOCK_DV, DV, LARGE)
        m_i, l_i, acc = softmax_step(s, v_tile, m_i, l_i, acc, PRECISION)

    if HAS_EXTRA:
        # additional tokens: plain scores (no convolution, no rpb), in the same softmax
        q_rows = load_rows(q_base, rows, sql, L, BLOCK_D, D, LARGE)
        for e0 in range(0, EXTRA, BE):
            e = e0 + tl.arange(0, BE)
            ak = load_rows(AK + b * sakb + kvh * sakh, e, sake, EXTRA, BLOCK_D, D, LARGE)
            av = load_rows(AV + b * savb + kvh * savh, e, save, EXTRA, BLOCK_DV, DV, LARGE)
            se = mma(q_rows, tl.trans(ak), tl.zeros([BM, BE], dtype=tl.float32), PRECISION) * scale
            if HAS_SOFTCAP:
                se = softcap * tanh(se / softcap)
            se = tl.where((e < EXTRA)[None, :], se * LOG2E, float("-inf"))
            m_i, l_i, acc = softmax_step(se, av, m_i, l_i, acc, PRECISION)

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
