"""Forward-mode AD (JVP) of fused neighbourhood / window attention, one program per (query tile,
head, batch).

For one query row with scores s_j (after bias and softcap), P_j = exp(s_j - lse) and O = sum P_j
V_j, the tangents for input tangents (dQ, dK, dV, d rpb, and those of the additional tokens) are

    dS_j   = (1 - tanh^2) * m'_j * (scale * (dQ . K_j + Q . dK_j) + d rpb_j)
             (the tanh factor with softcap; m'_j = d score_mod / d s with a score_mod)
    d lse  = sum_j P_j dS_j
    dO     = sum_j P_j dS_j V_j + sum_j P_j dV_j - d lse * O

With the forward's LSE saved, P is exact from the first key tile (as in dq_kernel, whose walk this
is), so a single pass accumulates sum P dS V + P dV and d lse, and the last line reads the
forward's stored O. (A float32 sum P V in the loop instead would be a third accumulator of the
value width: at 128 channels the kernel then spilled (255 registers), and the stored O's rounding
is that of the 16-bit P dS operand the products already take.) Tangents that are absent (None) are
compile-time flags: their loads and products are not in the kernel at all; with only dV given the
scores' tangent is zero and the kernel is a forward with a second value tensor. Memory: none
beyond the two tangent outputs.
"""

import triton
import triton.language as tl

from .backward_kernels import softcap_chain
from .forward_kernel import tile_tokens
from .index_math import crosses, key_range, key_walk, next3, split3
from .mod_hooks import extra_tokens, flat_tokens, masked_by_mod, massless_rows, modded_scores
from .scores import LOG2E, finish_scores, mask_pairs, mma, relative_bias


@triton.jit
def _rows(T, sb, s0, s1, s2, sh, b, h, i0, i1, i2, cols, ok, WIDTH):
    """A [rows, cols] tile of one head of a ``[B, *spatial, H, WIDTH]`` tensor."""
    offsets = (b.to(tl.int64) * sb + h.to(tl.int64) * sh + i0 * s0 + i1 * s1 + i2 * s2)[:, None] + cols[None, :]
    return tl.load(T + offsets, mask=ok[:, None] & (cols[None, :] < WIDTH), other=0.0)


@triton.jit
def _key_rows(base, s0, s1, s2, y0, y1, y2, g0, g1, g2, D0, D1, D2, Lg0, Lg1, Lg2, cols, WIDTH, LARGE: tl.constexpr):
    """A key tile of one (batch, kv head): group coordinates (y0, y1, y2), rows outside the grid
    zero."""
    ok = (y0 >= 0) & (y0 < Lg0) & (y1 >= 0) & (y1 < Lg1) & (y2 >= 0) & (y2 < Lg2)
    j0, j1, j2 = g0 + D0 * y0, g1 + D1 * y1, g2 + D2 * y2
    if LARGE:
        j0, j1, j2 = j0.to(tl.int64), j1.to(tl.int64), j2.to(tl.int64)
    offsets = (j0 * s0 + j1 * s1 + j2 * s2)[:, None] + cols[None, :]
    return tl.load(base + offsets, mask=ok[:, None] & (cols[None, :] < WIDTH), other=0.0)


@triton.jit
def _score_tangent(q, kt, tq, tkt, trpb, t, slope, scale, T_Q: tl.constexpr, T_K: tl.constexpr, T_RPB: tl.constexpr,
                   HAS_SOFTCAP: tl.constexpr, HAS_SCORE_MOD: tl.constexpr, PRECISION: tl.constexpr):
    """dS of a tile's pairs (natural-log units): scale (dQ K^T + Q dK^T) + d rpb, through score_mod
    (its derivative ``slope``) and softcap."""
    ds = tl.zeros([q.shape[0], kt.shape[0]], tl.float32)
    if T_Q:
        ds = mma(tq, tl.trans(kt), ds, PRECISION)
    if T_K:
        ds = mma(q, tl.trans(tkt), ds, PRECISION)
    ds = ds * scale
    if T_RPB:
        ds += trpb
    if HAS_SCORE_MOD:
        ds = ds * slope
    return softcap_chain(ds, t, HAS_SOFTCAP)


@triton.jit
def jvp_kernel(
    Q, K, V, TQ, TK, TV, RPB, TRPB, AK, AV, TAK, TAV, O, LSE, TO, TLSE, MT0, MT1, MT2, MT3,
    sqb, sq0, sq1, sq2, sqh,
    skb, sk0, sk1, sk2, skh,
    svb, sv0, sv1, sv2, svh,
    stqb, stq0, stq1, stq2, stqh,
    stkb, stk0, stk1, stk2, stkh,
    stvb, stv0, stv1, stv2, stvh,
    sob, so0, so1, so2, soh,
    slb, sl0, sl1, sl2, slh,  # LSE
    stob, sto0, sto1, sto2, stoh,
    stlb, stl0, stl1, stl2, stlh,  # TLSE
    srh, sr0, sr1, sr2,
    strh, str0, str1, str2,
    sakb, sake, sakh, savb, save, savh,
    stakb, stake, stakh, stavb, stave, stavh,
    G, E, HEAD_D, HEAD_DV,
    L0, L1, L2, K0, K1, K2, S0, S1, S2, D0, D1, D2, SH0, SH1, SH2, NT0, NT1, NT2,
    scale, softcap,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, WINDOW: tl.constexpr,
    TM0: tl.constexpr, TM1: tl.constexpr, TM2: tl.constexpr,
    TN0: tl.constexpr, TN1: tl.constexpr, TN2: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_RPB: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_EXTRA: tl.constexpr,
    T_Q: tl.constexpr, T_K: tl.constexpr, T_V: tl.constexpr, T_RPB: tl.constexpr,
    T_AK: tl.constexpr, T_AV: tl.constexpr,
    LARGE: tl.constexpr, PRECISION: tl.constexpr, RANK: tl.constexpr,
    ANCHOR: tl.constexpr, AXIS_MASKS: tl.constexpr,
    HAS_SCORE_MOD: tl.constexpr, HAS_MASK_MOD: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_MOD_GRAD: tl.constexpr,
    MASK_MOD: tl.constexpr, WIDE_INDEX: tl.constexpr,
):
    BLOCK_M: tl.constexpr = TM0 * TM1 * TM2
    BLOCK_N: tl.constexpr = TN0 * TN1 * TN2
    HAS_DS: tl.constexpr = T_Q or T_K or T_RPB  # the grid scores move
    h = tl.program_id(1)
    b = tl.program_id(2)
    kvh = h // G
    g0, g1, g2, Lg0, Lg1, Lg2, xs0, xs1, xs2, x0, x1, x2, q_ok, i0, i1, i2 = tile_tokens(
        tl.program_id(0), L0, L1, L2, D0, D1, D2, NT0, NT1, NT2, TM0, TM1, TM2, LARGE)
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    q = _rows(Q, sqb, sq0, sq1, sq2, sqh, b, h, i0, i1, i2, d, q_ok, HEAD_D)
    tq = q
    if T_Q:
        tq = _rows(TQ, stqb, stq0, stq1, stq2, stqh, b, h, i0, i1, i2, d, q_ok, HEAD_D)
    lse = tl.load(LSE + b.to(tl.int64) * slb + h.to(tl.int64) * slh + i0 * sl0 + i1 * sl1 + i2 * sl2,
                  mask=q_ok, other=float("inf"))
    # P = exp2(s - lse2); rows outside the grid or that saw no key (lse -inf) get P = 0.
    lse2 = massless_rows(lse * LOG2E)

    lo0, hi0 = key_range(x0, Lg0, K0, S0, SH0, C0, WINDOW)
    lo1, hi1 = key_range(x1, Lg1, K1, S1, SH1, C1, WINDOW)
    lo2, hi2 = key_range(x2, Lg2, K2, S2, SH2, C2, WINDOW)
    st0, nk0, all_lo0, all_hi0 = key_walk(xs0, Lg0, K0, S0, SH0, C0, WINDOW, TM0, TN0, ANCHOR)
    st1, nk1, all_lo1, all_hi1 = key_walk(xs1, Lg1, K1, S1, SH1, C1, WINDOW, TM1, TN1, ANCHOR)
    st2, nk2, all_lo2, all_hi2 = key_walk(xs2, Lg2, K2, S2, SH2, C2, WINDOW, TM2, TN2, ANCHOR)
    n_tiles = nk0 * nk1 * nk2
    if HAS_SCORE_MOD or HAS_MASK_MOD:
        q_flat = flat_tokens(g0, g1, g2, x0, x1, x2, Lg0, Lg1, Lg2, D0, D1, D2, L1, L2, WIDE_INDEX)[:, None]

    n0, n1, n2 = split3(tl.arange(0, BLOCK_N), TN1, TN2)
    kv_b, kv_h = b.to(tl.int64), kvh.to(tl.int64)
    k_base, v_base = K + kv_b * skb + kv_h * skh, V + kv_b * svb + kv_h * svh
    tk_base, tv_base = TK + kv_b * stkb + kv_h * stkh, TV + kv_b * stvb + kv_h * stvh
    t_out = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)  # sum P dS V + P dV
    t_lse = tl.zeros([BLOCK_M], tl.float32)  # sum P dS
    j0, j1, j2 = tl.zeros((), tl.int32), tl.zeros((), tl.int32), tl.zeros((), tl.int32)
    for _tile in range(0, n_tiles):
        ys0, ys1, ys2 = st0 + j0 * TN0, st1 + j1 * TN1, st2 + j2 * TN2
        y0, y1, y2 = ys0 + n0, ys1 + n1, ys2 + n2
        kt = _key_rows(k_base, sk0, sk1, sk2, y0, y1, y2, g0, g1, g2, D0, D1, D2, Lg0, Lg1, Lg2, d, HEAD_D, LARGE)
        vt = _key_rows(v_base, sv0, sv1, sv2, y0, y1, y2, g0, g1, g2, D0, D1, D2, Lg0, Lg1, Lg2, dv, HEAD_DV, LARGE)
        qk = mma(q, tl.trans(kt), None, PRECISION)
        if HAS_RPB:
            bias = relative_bias(RPB, srh, sr0, sr1, sr2, h, x0, x1, x2, y0, y1, y2, K0, K1, K2, True)
        else:
            bias = 0.0
        if HAS_SCORE_MOD or HAS_MASK_MOD:
            kv_flat = flat_tokens(g0, g1, g2, y0, y1, y2, Lg0, Lg1, Lg2, D0, D1, D2, L1, L2, WIDE_INDEX)[None, :]
        if HAS_SCORE_MOD:
            s, t, slope = modded_scores(qk, bias, scale, softcap, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, HAS_RPB,
                                        HAS_SOFTCAP, SCORE_MOD, SCORE_MOD_GRAD, HAS_DS)
        else:
            s, t = finish_scores(qk, bias, scale, softcap, HAS_RPB, HAS_SOFTCAP)
            slope = 1.0
        p = tl.math.exp2(s - lse2[:, None])
        p = mask_pairs(p, 0.0, lo0, hi0, lo1, hi1, lo2, hi2, y0, y1, y2,
                       crosses(ys0, TN0, all_lo0, all_hi0), crosses(ys1, TN1, all_lo1, all_hi1),
                       crosses(ys2, TN2, all_lo2, all_hi2), True, RANK, AXIS_MASKS)
        if HAS_MASK_MOD:
            p = masked_by_mod(p, 0.0, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, MASK_MOD)
        if HAS_DS:
            tkt = kt
            if T_K:
                tkt = _key_rows(tk_base, stk0, stk1, stk2, y0, y1, y2, g0, g1, g2, D0, D1, D2, Lg0, Lg1, Lg2, d,
                                HEAD_D, LARGE)
            trpb = 0.0
            if T_RPB:
                trpb = relative_bias(TRPB, strh, str0, str1, str2, h, x0, x1, x2, y0, y1, y2, K0, K1, K2, True)
            pds = p * _score_tangent(q, kt, tq, tkt, trpb, t, slope, scale, T_Q, T_K, T_RPB, HAS_SOFTCAP,
                                     HAS_SCORE_MOD, PRECISION)
            t_lse += tl.sum(pds, 1)
            t_out = mma(pds.to(vt.dtype), vt, t_out, PRECISION)
        if T_V:
            tvt = _key_rows(tv_base, stv0, stv1, stv2, y0, y1, y2, g0, g1, g2, D0, D1, D2, Lg0, Lg1, Lg2, dv,
                            HEAD_DV, LARGE)
            t_out = mma(p.to(tvt.dtype), tvt, t_out, PRECISION)
        j0, j1, j2 = next3(j0, j1, j2, nk1, nk2)

    if HAS_EXTRA:
        e_off = tl.arange(0, BLOCK_N)
        ak_base, av_base = AK + kv_b * sakb + kv_h * sakh, AV + kv_b * savb + kv_h * savh
        tak_base, tav_base = TAK + kv_b * stakb + kv_h * stakh, TAV + kv_b * stavb + kv_h * stavh
        for e0 in range(0, E, BLOCK_N):
            e = e0 + e_off
            e_ok = e < E
            kt = tl.load(ak_base + e[:, None] * sake + d[None, :], mask=e_ok[:, None] & (d[None, :] < HEAD_D),
                         other=0.0)
            vt = tl.load(av_base + e[:, None] * save + dv[None, :], mask=e_ok[:, None] & (dv[None, :] < HEAD_DV),
                         other=0.0)
            qk = mma(q, tl.trans(kt), None, PRECISION)
            if HAS_SCORE_MOD or HAS_MASK_MOD:
                kv_flat = extra_tokens(e, E, L0, L1, L2, WIDE_INDEX)[None, :]
            if HAS_SCORE_MOD:
                s, t, slope = modded_scores(qk, 0.0, scale, softcap, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, False,
                                            HAS_SOFTCAP, SCORE_MOD, SCORE_MOD_GRAD, T_Q or T_AK)
            else:
                s, t = finish_scores(qk, 0.0, scale, softcap, False, HAS_SOFTCAP)
                slope = 1.0
            p = tl.where(e_ok[None, :], tl.math.exp2(s - lse2[:, None]), 0.0)
            if HAS_MASK_MOD:
                p = masked_by_mod(p, 0.0, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, MASK_MOD)
            if T_Q or T_AK:
                tkt = kt
                if T_AK:
                    tkt = tl.load(tak_base + e[:, None] * stake + d[None, :],
                                  mask=e_ok[:, None] & (d[None, :] < HEAD_D), other=0.0)
                pds = p * _score_tangent(q, kt, tq, tkt, 0.0, t, slope, scale, T_Q, T_AK, False, HAS_SOFTCAP,
                                         HAS_SCORE_MOD, PRECISION)
                t_lse += tl.sum(pds, 1)
                t_out = mma(pds.to(vt.dtype), vt, t_out, PRECISION)
            if T_AV:
                tvt = tl.load(tav_base + e[:, None] * stave + dv[None, :],
                              mask=e_ok[:, None] & (dv[None, :] < HEAD_DV), other=0.0)
                t_out = mma(p.to(tvt.dtype), tvt, t_out, PRECISION)

    out = _rows(O, sob, so0, so1, so2, soh, b, h, i0, i1, i2, dv, q_ok, HEAD_DV)
    t_out -= t_lse[:, None] * out.to(tl.float32)
    to_rows = b.to(tl.int64) * stob + h.to(tl.int64) * stoh + i0 * sto0 + i1 * sto1 + i2 * sto2
    tl.store(TO + to_rows[:, None] + dv[None, :], t_out.to(TO.dtype.element_ty),
             mask=q_ok[:, None] & (dv[None, :] < HEAD_DV))
    tl_rows = b.to(tl.int64) * stlb + h.to(tl.int64) * stlh + i0 * stl0 + i1 * stl1 + i2 * stl2
    tl.store(TLSE + tl_rows, t_lse, mask=q_ok)
