"""Backward: deterministic by default (dQ Q-major, dK/dV KV-major, no atomics anywhere); opt-in,
one KV-major pass that also adds dQ in float32 with atomics (``ATOMIC_DQ``).

* ``dq_kernel``: one program per (query tile, head, batch), the forward's walk over key tiles,
  recomputing P from the saved LSE. It runs first and writes its rows' statistics for the other
  kernels (``own_row_stats``; ``row_stats_kernel`` writes them where it does not run). It also
  writes dS of each attended pair into a ``[B, H, N, prod(K)]`` buffer when rpb needs a gradient
  (every (query, slot) is written once).
* ``dkdv_kernel``: one program per (key tile, kv head, batch); it walks the query tiles that see
  the key tile (inverse rule, a box because the ranges are monotone) for each of the G query heads
  that share the kv head, so GQA needs no atomics and no copies. With ``ATOMIC_DQ`` it also adds
  each pair's dS K to a float32 dQ (atomics: run-to-run rounding differences) and, with
  ``RPB_GRAD``, writes the dS buffer, so ``dq_kernel`` is not needed: 5 matrix products per pair
  instead of 7.
* ``extra_dkdv_kernel``: gradients of the additional tokens, one program per (block of extra
  tokens, kv head, batch), over every query of the G heads.
"""

import triton
import triton.language as tl

from .descriptors import (add_to_box, group_descriptor, kv_descriptors, kv_tail_descriptors, load_box, load_host_box,
                          load_streamed_tile)
from .forward_kernel import tile_tokens
from .index_math import crosses, key_range, key_walk, list_step, next3, query_range, query_walk, split3
from .mod_hooks import extra_tokens, flat_tokens, masked_by_mod, massless_rows, modded_scores
from .scores import LOG2E, finish_scores, mask_pairs, mma, relative_bias, within


@triton.jit
def row_stats(STATS, rows, ok):
    """(lse * log2 e, delta) of query rows at element offsets ``rows`` of the statistics buffer
    (row_stats_kernel); rows outside the grid get lse = +inf, hence P = 0: they add nothing."""
    lse2 = tl.load(STATS + rows, mask=ok, other=float("inf"))
    delta = tl.load(STATS + rows + 1, mask=ok, other=0.0)
    return lse2, delta


@triton.jit
def store_stats(STATS, rows, lse2, delta, ok):
    """Rows ``[lse * log2 e, delta, 0, 0]`` at element offsets ``rows`` of the statistics buffer."""
    col = tl.arange(0, 4)
    stats = tl.where(col[None, :] == 0, lse2[:, None], tl.where(col[None, :] == 1, delta[:, None], 0.0))
    tl.store(STATS + rows[:, None] + col[None, :], stats, mask=ok[:, None])


@triton.jit
def own_row_stats(O, LSE, DLSE, STATS, o_rows, l_rows, stat_rows, do, do_tail, ok, dv, dv_tail, HEAD_DV,
                  HAS_DLSE: tl.constexpr, TAIL_DV: tl.constexpr):
    """(lse * log2 e, delta) of query rows whose dO is already loaded (channels ``dv``, and with
    TAIL_DV the tail ``dv_tail`` in ``do_tail``), worked out from O and the LSE (as
    row_stats_kernel does) and also stored in the statistics buffer for the kernels that run
    after; rows outside the grid get lse = +inf, as in row_stats."""
    o = tl.load(O + o_rows[:, None] + dv[None, :], mask=ok[:, None] & (dv[None, :] < HEAD_DV), other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if TAIL_DV > 0:
        o_tail = tl.load(O + o_rows[:, None] + dv_tail[None, :], mask=ok[:, None] & (dv_tail[None, :] < HEAD_DV),
                         other=0.0)
        delta += tl.sum(o_tail.to(tl.float32) * do_tail.to(tl.float32), 1)
    if HAS_DLSE:
        delta -= tl.load(DLSE + l_rows, mask=ok, other=0.0)
    lse2 = tl.load(LSE + l_rows, mask=ok, other=0.0) * LOG2E
    store_stats(STATS, stat_rows, lse2, delta, ok)
    return tl.where(ok, lse2, float("inf")), delta


@triton.jit
def stats_box(desc, head, xs0, xs1, xs2, RANK: tl.constexpr, ROWS: tl.constexpr):
    """(lse * log2 e, delta) of a box of query rows, one descriptor copy. Rows outside the grid
    arrive as zeros (lse 0, not +inf): their q and dO rows are zeros too, so dP and dS are zero and
    P = exp2(bias); the caller zeroes such P where rpb could make it overflow (inf * 0 = NaN)."""
    return stats_of_box(load_box(desc, head, xs0, xs1, xs2, RANK, ROWS, 4), ROWS)


@triton.jit
def stats_of_box(box, ROWS: tl.constexpr):
    """(lse * log2 e, delta) of ``[ROWS, 4]`` statistics rows (row_stats_kernel's layout)."""
    lse_pad, delta_pad = tl.split(box.reshape(ROWS, 2, 2))
    lse2, _ = tl.split(lse_pad)
    delta, _ = tl.split(delta_pad)
    return lse2, delta


@triton.jit
def softcap_chain(ds, t, HAS_SOFTCAP: tl.constexpr):
    """d(softcap * tanh(u / softcap)) / du = 1 - tanh^2."""
    if HAS_SOFTCAP:
        ds = ds * (1.0 - t * t)
    return ds


@triton.jit
def dq_kernel(
    Q, K, V, DO, STATS, DQ, RPB, DSB, AK, AV, O, LSE, DLSE, MT0, MT1, MT2, MT3, LIVE, KH, VH, KTH, VTH,
    sqb, sq0, sq1, sq2, sqh,
    skb, sk0, sk1, sk2, skh,
    svb, sv0, sv1, sv2, svh,
    sdob, sdo0, sdo1, sdo2, sdoh,
    slb, sl0, sl1, sl2, slh,
    sob, so0, so1, so2, soh,
    slsb, sls0, sls1, sls2, slsh,  # LSE (and dLSE), [B, *spatial, H]
    sdqb, sdq0, sdq1, sdq2, sdqh,
    srh, sr0, sr1, sr2,
    sakb, sake, sakh, savb, save, savh,
    H, G, E, HEAD_D, HEAD_DV,
    L0, L1, L2, K0, K1, K2, S0, S1, S2, D0, D1, D2, SH0, SH1, SH2, NT0, NT1, NT2,
    scale, softcap, slive_b, slive_h, slive_t,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, WINDOW: tl.constexpr,
    TM0: tl.constexpr, TM1: tl.constexpr, TM2: tl.constexpr,
    TN0: tl.constexpr, TN1: tl.constexpr, TN2: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_D: tl.constexpr, TAIL_DV: tl.constexpr,
    HAS_RPB: tl.constexpr, RPB_GRAD: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_EXTRA: tl.constexpr,
    LARGE: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr, RANK: tl.constexpr,
    ANCHOR: tl.constexpr, AXIS_MASKS: tl.constexpr, HAS_DLSE: tl.constexpr, WAIT_DQ: tl.constexpr,
    HAS_SCORE_MOD: tl.constexpr, HAS_MASK_MOD: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_MOD_GRAD: tl.constexpr,
    MASK_MOD: tl.constexpr, WIDE_INDEX: tl.constexpr, LIVE_STEPS: tl.constexpr, HOST_TMA: tl.constexpr,
):
    BLOCK_M: tl.constexpr = TM0 * TM1 * TM2
    BLOCK_N: tl.constexpr = TN0 * TN1 * TN2
    # Head and value dims in a block and a tail where TAIL_D / TAIL_DV > 0 (tiles.head_split, as
    # in forward_kernel): the scores and dP sum the tail's product into the block's, dQ keeps an
    # accumulator of each.
    tl.static_assert(not HAS_EXTRA or (TAIL_D == 0 and TAIL_DV == 0), "additional tokens take one padded block")
    TAIL_DW: tl.constexpr = TAIL_D if TAIL_D > 0 else 16  # placeholder widths where there is no tail
    TAIL_DVW: tl.constexpr = TAIL_DV if TAIL_DV > 0 else 16
    h = tl.program_id(1)
    b = tl.program_id(2)
    kvh = h // G
    g0, g1, g2, Lg0, Lg1, Lg2, xs0, xs1, xs2, x0, x1, x2, q_ok, i0, i1, i2 = tile_tokens(
        tl.program_id(0), L0, L1, L2, D0, D1, D2, NT0, NT1, NT2, TM0, TM1, TM2, LARGE)
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    bh = (b.to(tl.int64), h.to(tl.int64))
    q_cells = (bh[0] * sqb + bh[1] * sqh + i0 * sq0 + i1 * sq1 + i2 * sq2)[:, None]
    do_cells = (bh[0] * sdob + bh[1] * sdoh + i0 * sdo0 + i1 * sdo1 + i2 * sdo2)[:, None]
    q = tl.load(Q + q_cells + d[None, :], mask=q_ok[:, None] & (d[None, :] < HEAD_D), other=0.0)
    do = tl.load(DO + do_cells + dv[None, :], mask=q_ok[:, None] & (dv[None, :] < HEAD_DV), other=0.0)
    d_tail = BLOCK_D + tl.arange(0, TAIL_DW)
    dv_tail = BLOCK_DV + tl.arange(0, TAIL_DVW)
    if TAIL_D > 0:
        q_tail = tl.load(Q + q_cells + d_tail[None, :], mask=q_ok[:, None] & (d_tail[None, :] < HEAD_D), other=0.0)
    do_tail = do
    if TAIL_DV > 0:
        do_tail = tl.load(DO + do_cells + dv_tail[None, :], mask=q_ok[:, None] & (dv_tail[None, :] < HEAD_DV),
                          other=0.0)
    # The program owns its query rows and holds their dO: it works out their statistics itself
    # (what row_stats_kernel does, without that kernel's second pass over dO: 2-10 % of a
    # backward) and leaves them for the dK/dV kernels, which run after it.
    lse2, delta = own_row_stats(O, LSE, DLSE, STATS,
                                bh[0] * sob + bh[1] * soh + i0 * so0 + i1 * so1 + i2 * so2,
                                bh[0] * slsb + bh[1] * slsh + i0 * sls0 + i1 * sls1 + i2 * sls2,
                                bh[0] * slb + bh[1] * slh + i0 * sl0 + i1 * sl1 + i2 * sl2, do, do_tail, q_ok, dv,
                                dv_tail, HEAD_DV, HAS_DLSE, TAIL_DV)
    if HAS_SCORE_MOD:
        lse2 = massless_rows(lse2)

    lo0, hi0 = key_range(x0, Lg0, K0, S0, SH0, C0, WINDOW)
    lo1, hi1 = key_range(x1, Lg1, K1, S1, SH1, C1, WINDOW)
    lo2, hi2 = key_range(x2, Lg2, K2, S2, SH2, C2, WINDOW)
    st0, nk0, all_lo0, all_hi0 = key_walk(xs0, Lg0, K0, S0, SH0, C0, WINDOW, TM0, TN0, ANCHOR)
    st1, nk1, all_lo1, all_hi1 = key_walk(xs1, Lg1, K1, S1, SH1, C1, WINDOW, TM1, TN1, ANCHOR)
    st2, nk2, all_lo2, all_hi2 = key_walk(xs2, Lg2, K2, S2, SH2, C2, WINDOW, TM2, TN2, ANCHOR)
    n_tiles = nk0 * nk1 * nk2
    if HAS_SCORE_MOD or HAS_MASK_MOD:
        q_flat = flat_tokens(g0, g1, g2, x0, x1, x2, Lg0, Lg1, Lg2, D0, D1, D2, L1, L2, WIDE_INDEX)[:, None]
    if LIVE_STEPS:
        # Only the steps where mask_mod leaves a pair (live_steps.py), as in forward_kernel.
        live = LIVE + bh[0] * slive_b + bh[1] * slive_h + tl.program_id(0).to(tl.int64) * slive_t
        n_tiles = tl.load(live)

    n0, n1, n2 = split3(tl.arange(0, BLOCK_N), TN1, TN2)
    k_base = K + bh[0] * skb + kvh.to(tl.int64) * skh
    v_base = V + bh[0] * svb + kvh.to(tl.int64) * svh
    k_desc, v_desc = kv_descriptors(k_base, v_base, g0, g1, g2, sk0, sk1, sk2, skh, sv0, sv1, sv2, svh,
                                    Lg0, Lg1, Lg2, D0, D1, D2, HEAD_D, HEAD_DV, TMA, RANK, TN0, TN1, TN2,
                                    BLOCK_D, BLOCK_DV)
    k_tail_desc, v_tail_desc = kv_tail_descriptors(k_base, v_base, g0, g1, g2, sk0, sk1, sk2, skh, sv0, sv1, sv2, svh,
                                                   Lg0, Lg1, Lg2, D0, D1, D2, HEAD_D, HEAD_DV, TMA, RANK, TN0, TN1,
                                                   TN2, BLOCK_D, BLOCK_DV, TAIL_D, TAIL_DV)
    if RPB_GRAD:
        # Row of the dS buffer: ((b * H + h) * N + flat query) * prod(K).
        ds_rows = ((bh[0] * H + bh[1]) * (L0 * L1 * L2) + (i0 * L1 + i1) * L2 + i2) * (K0 * K1 * K2)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dq_tail = tl.zeros([BLOCK_M, TAIL_DW], tl.float32)
    j0, j1, j2 = tl.zeros((), tl.int32), tl.zeros((), tl.int32), tl.zeros((), tl.int32)
    full_step = tl.zeros((), tl.int1)  # from the live-step list: mask_mod keeps every pair here
    for _tile in range(0, n_tiles):
        if LIVE_STEPS:
            j0, j1, j2, full_step = list_step(live, _tile, nk1, nk2)
        ys0, ys1, ys2 = st0 + j0 * TN0, st1 + j1 * TN1, st2 + j2 * TN2
        y0, y1, y2 = ys0 + n0, ys1 + n1, ys2 + n2
        kt = load_streamed_tile(KH, b, kvh, HEAD_D, 0, k_desc, k_base, sk0, sk1, sk2, ys0, ys1, ys2, y0, y1, y2, g0,
                                g1, g2, D0, D1, D2, Lg0, Lg1, Lg2, HEAD_D, HOST_TMA, TMA, LARGE, RANK, BLOCK_N,
                                BLOCK_D)
        vt = load_streamed_tile(VH, b, kvh, HEAD_DV, 0, v_desc, v_base, sv0, sv1, sv2, ys0, ys1, ys2, y0, y1, y2, g0,
                                g1, g2, D0, D1, D2, Lg0, Lg1, Lg2, HEAD_DV, HOST_TMA, TMA, LARGE, RANK, BLOCK_N,
                                BLOCK_DV)
        qk = mma(q, tl.trans(kt), None, PRECISION)
        if TAIL_D > 0:
            kt_tail = load_streamed_tile(KTH, b, kvh, HEAD_D, BLOCK_D, k_tail_desc, k_base + BLOCK_D, sk0, sk1, sk2,
                                         ys0, ys1, ys2, y0, y1, y2, g0, g1, g2, D0, D1, D2, Lg0, Lg1, Lg2,
                                         HEAD_D - BLOCK_D, HOST_TMA, TMA, LARGE, RANK, BLOCK_N, TAIL_D)
            qk = mma(q_tail, tl.trans(kt_tail), qk, PRECISION)
        if HAS_RPB:
            bias = relative_bias(RPB, srh, sr0, sr1, sr2, h, x0, x1, x2, y0, y1, y2, K0, K1, K2, True)
        else:
            bias = 0.0
        if HAS_SCORE_MOD or HAS_MASK_MOD:
            kv_flat = flat_tokens(g0, g1, g2, y0, y1, y2, Lg0, Lg1, Lg2, D0, D1, D2, L1, L2, WIDE_INDEX)[None, :]
        if HAS_SCORE_MOD:
            s, t, slope = modded_scores(qk, bias, scale, softcap, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, HAS_RPB,
                                        HAS_SOFTCAP, SCORE_MOD, SCORE_MOD_GRAD, True)
        else:
            s, t = finish_scores(qk, bias, scale, softcap, HAS_RPB, HAS_SOFTCAP)
        p = tl.math.exp2(s - lse2[:, None])
        p = mask_pairs(p, 0.0, lo0, hi0, lo1, hi1, lo2, hi2, y0, y1, y2,
                       crosses(ys0, TN0, all_lo0, all_hi0), crosses(ys1, TN1, all_lo1, all_hi1),
                       crosses(ys2, TN2, all_lo2, all_hi2), True, RANK, AXIS_MASKS)
        if HAS_MASK_MOD:
            if full_step == 0:
                p = masked_by_mod(p, 0.0, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, MASK_MOD)
        dp = mma(do, tl.trans(vt), None, PRECISION)
        if TAIL_DV > 0:
            vt_tail = load_streamed_tile(VTH, b, kvh, HEAD_DV, BLOCK_DV, v_tail_desc, v_base + BLOCK_DV, sv0, sv1,
                                         sv2, ys0, ys1, ys2, y0, y1, y2, g0, g1, g2, D0, D1, D2, Lg0, Lg1, Lg2,
                                         HEAD_DV - BLOCK_DV, HOST_TMA, TMA, LARGE, RANK, BLOCK_N, TAIL_DV)
            dp = mma(do_tail, tl.trans(vt_tail), dp, PRECISION)
        ds = softcap_chain(p * (dp - delta[:, None]), t, HAS_SOFTCAP)
        if HAS_SCORE_MOD:
            ds = ds * slope
        dq = mma(ds.to(kt.dtype), kt, dq, PRECISION)
        if TAIL_D > 0:
            dq_tail = mma(ds.to(kt_tail.dtype), kt_tail, dq_tail, PRECISION)
        if WAIT_DQ:
            # Waits for the dQ products within the step, as WAIT_DK in dkdv_kernel (where ptxas
            # would otherwise serialise every wgmma of the loop: its 8-warp tiles above head dim
            # 128, tiles.waits_for_dq).
            dq = dq + 0.0
            if TAIL_D > 0:
                dq_tail = dq_tail + 0.0
        if RPB_GRAD:
            slot = ((y0[None, :] - lo0[:, None]) * K1 + (y1[None, :] - lo1[:, None])) * K2 + (y2[None, :] - lo2[:, None])
            seen = within(lo0, hi0, lo1, hi1, lo2, hi2, y0, y1, y2, True, RANK) & q_ok[:, None]
            tl.store(DSB + ds_rows[:, None] + slot, ds, mask=seen)
        j0, j1, j2 = next3(j0, j1, j2, nk1, nk2)

    if HAS_EXTRA:
        e_off = tl.arange(0, BLOCK_N)
        ak_base = AK + bh[0] * sakb + kvh.to(tl.int64) * sakh
        av_base = AV + bh[0] * savb + kvh.to(tl.int64) * savh
        for e0 in range(0, E, BLOCK_N):
            e = e0 + e_off
            e_ok = e < E
            kt = tl.load(ak_base + e[:, None] * sake + d[None, :], mask=e_ok[:, None] & (d[None, :] < HEAD_D), other=0.0)
            vt = tl.load(av_base + e[:, None] * save + dv[None, :], mask=e_ok[:, None] & (dv[None, :] < HEAD_DV), other=0.0)
            qk = mma(q, tl.trans(kt), None, PRECISION)
            if HAS_SCORE_MOD or HAS_MASK_MOD:
                kv_flat = extra_tokens(e, E, L0, L1, L2, WIDE_INDEX)[None, :]
            if HAS_SCORE_MOD:
                s, t, slope = modded_scores(qk, 0.0, scale, softcap, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, False,
                                            HAS_SOFTCAP, SCORE_MOD, SCORE_MOD_GRAD, True)
            else:
                s, t = finish_scores(qk, 0.0, scale, softcap, False, HAS_SOFTCAP)
            p = tl.where(e_ok[None, :], tl.math.exp2(s - lse2[:, None]), 0.0)
            if HAS_MASK_MOD:
                p = masked_by_mod(p, 0.0, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, MASK_MOD)
            dp = mma(do, tl.trans(vt), None, PRECISION)
            ds = softcap_chain(p * (dp - delta[:, None]), t, HAS_SOFTCAP)
            if HAS_SCORE_MOD:
                ds = ds * slope
            dq = mma(ds.to(kt.dtype), kt, dq, PRECISION)

    dq_rows = bh[0] * sdqb + bh[1] * sdqh + i0 * sdq0 + i1 * sdq1 + i2 * sdq2
    tl.store(DQ + dq_rows[:, None] + d[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=q_ok[:, None] & (d[None, :] < HEAD_D))
    if TAIL_D > 0:
        tl.store(DQ + dq_rows[:, None] + d_tail[None, :], (dq_tail * scale).to(DQ.dtype.element_ty),
                 mask=q_ok[:, None] & (d_tail[None, :] < HEAD_D))


@triton.jit
def dkdv_kernel(
    Q, K, V, DO, STATS, DK, DV, RPB, DQA, DSB, MT0, MT1, MT2, MT3, LIVE, QH, DOH, QTH, DOTH, STH,
    sqb, sq0, sq1, sq2, sqh,
    skb, sk0, sk1, sk2, skh,
    svb, sv0, sv1, sv2, svh,
    sdob, sdo0, sdo1, sdo2, sdoh,
    slb, sl0, sl1, sl2, slh,
    sdkb, sdk0, sdk1, sdk2, sdkh,
    sdvb, sdv0, sdv1, sdv2, sdvh,
    srh, sr0, sr1, sr2,
    sdqab, sdqa0, sdqa1, sdqa2, sdqah,
    H, G, HEAD_D, HEAD_DV,
    L0, L1, L2, K0, K1, K2, S0, S1, S2, D0, D1, D2, SH0, SH1, SH2, NK0, NK1, NK2,
    scale, softcap, slive_b, slive_h, slive_t,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, WINDOW: tl.constexpr,
    TM0: tl.constexpr, TM1: tl.constexpr, TM2: tl.constexpr,
    TN0: tl.constexpr, TN1: tl.constexpr, TN2: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_D: tl.constexpr, TAIL_DV: tl.constexpr,
    HAS_RPB: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    LARGE: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr, RANK: tl.constexpr,
    ATOMIC_DQ: tl.constexpr, RPB_GRAD: tl.constexpr, TMA_DQ: tl.constexpr,
    ANCHOR: tl.constexpr, AXIS_MASKS: tl.constexpr, WAIT_DK: tl.constexpr,
    HAS_SCORE_MOD: tl.constexpr, HAS_MASK_MOD: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_MOD_GRAD: tl.constexpr,
    MASK_MOD: tl.constexpr, WIDE_INDEX: tl.constexpr, LIVE_STEPS: tl.constexpr, HOST_TMA: tl.constexpr,
):
    BLOCK_M: tl.constexpr = TM0 * TM1 * TM2
    BLOCK_N: tl.constexpr = TN0 * TN1 * TN2
    # Head and value dims in a block and a tail where TAIL_D / TAIL_DV > 0 (as in dq_kernel): dK
    # and dV keep an accumulator of each.
    tl.static_assert(not ATOMIC_DQ or (TAIL_D == 0 and TAIL_DV == 0), "the atomic dQ takes one padded block")
    TAIL_DW: tl.constexpr = TAIL_D if TAIL_D > 0 else 16  # placeholder widths where there is no tail
    TAIL_DVW: tl.constexpr = TAIL_DV if TAIL_DV > 0 else 16
    kvh = tl.program_id(1)
    b = tl.program_id(2)
    # The key tile: TN0 x TN1 x TN2 group coordinates in one dilation group per axis.
    g0, g1, g2, Lg0, Lg1, Lg2, ys0, ys1, ys2, y0, y1, y2, k_ok, k0, k1, k2 = tile_tokens(
        tl.program_id(0), L0, L1, L2, D0, D1, D2, NK0, NK1, NK2, TN0, TN1, TN2, LARGE)
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    b64, kvh64 = b.to(tl.int64), kvh.to(tl.int64)
    k_cells = (b64 * skb + kvh64 * skh + k0 * sk0 + k1 * sk1 + k2 * sk2)[:, None]
    v_cells = (b64 * svb + kvh64 * svh + k0 * sv0 + k1 * sv1 + k2 * sv2)[:, None]
    kt = tl.load(K + k_cells + d[None, :], mask=k_ok[:, None] & (d[None, :] < HEAD_D), other=0.0)
    vt = tl.load(V + v_cells + dv[None, :], mask=k_ok[:, None] & (dv[None, :] < HEAD_DV), other=0.0)
    d_tail = BLOCK_D + tl.arange(0, TAIL_DW)
    dv_tail = BLOCK_DV + tl.arange(0, TAIL_DVW)
    if TAIL_D > 0:
        kt_tail = tl.load(K + k_cells + d_tail[None, :], mask=k_ok[:, None] & (d_tail[None, :] < HEAD_D), other=0.0)
    if TAIL_DV > 0:
        vt_tail = tl.load(V + v_cells + dv_tail[None, :], mask=k_ok[:, None] & (dv_tail[None, :] < HEAD_DV), other=0.0)

    # The walk over the query tiles that see any key of the tile (inverse rule, monotone: first
    # and last key suffice), anchored where the queries that see all of them begin.
    qst0, nq0 = query_walk(ys0, Lg0, K0, S0, SH0, C0, WINDOW, TN0, TM0, ANCHOR)
    qst1, nq1 = query_walk(ys1, Lg1, K1, S1, SH1, C1, WINDOW, TN1, TM1, ANCHOR)
    qst2, nq2 = query_walk(ys2, Lg2, K2, S2, SH2, C2, WINDOW, TN2, TM2, ANCHOR)
    nq = nq0 * nq1 * nq2
    if LIVE_STEPS:
        # Only the steps where mask_mod leaves a pair for some query head of this kv head
        # (live_steps.py); ``t`` indexes the list within the current head's pass.
        live = LIVE + b64 * slive_b + kvh64 * slive_h + tl.program_id(0).to(tl.int64) * slive_t
        nq = tl.load(live)
        t = tl.zeros((), tl.int32)
    full_step = tl.zeros((), tl.int1)  # from the live-step list: mask_mod keeps every pair here
    # Pairs are masked by the inverse rule: the queries [qlo, qhi) that see each key row, fixed
    # for the program (a few registers), tested against the query columns' coordinates. The
    # forward rule needs [lo, hi) of every query column, recomputed on each masked step for the
    # 16 columns a thread holds (exact inverse: geometry's brute-force test; columns outside the
    # grid fall outside every [qlo, qhi)).
    qlo0, qhi0 = query_range(y0, Lg0, K0, S0, SH0, C0, WINDOW)
    qlo1, qhi1 = query_range(y1, Lg1, K1, S1, SH1, C1, WINDOW)
    qlo2, qhi2 = query_range(y2, Lg2, K2, S2, SH2, C2, WINDOW)
    if HAS_SCORE_MOD or HAS_MASK_MOD:
        kv_flat = flat_tokens(g0, g1, g2, y0, y1, y2, Lg0, Lg1, Lg2, D0, D1, D2, L1, L2, WIDE_INDEX)[:, None]

    m0, m1, m2 = split3(tl.arange(0, BLOCK_M), TM1, TM2)
    if TMA:
        # The G query heads of this kv head are one more descriptor axis.
        heads0 = kvh64 * G
        q_desc = group_descriptor(Q + b64 * sqb + heads0 * sqh + g0 * sq0 + g1 * sq1 + g2 * sq2, G, sqh,
                                  Lg0, Lg1, Lg2, D0 * sq0, D1 * sq1, D2 * sq2, HEAD_D, RANK, TM0, TM1, TM2, BLOCK_D)
        do_desc = group_descriptor(DO + b64 * sdob + heads0 * sdoh + g0 * sdo0 + g1 * sdo1 + g2 * sdo2, G, sdoh,
                                   Lg0, Lg1, Lg2, D0 * sdo0, D1 * sdo1, D2 * sdo2, HEAD_DV, RANK, TM0, TM1, TM2,
                                   BLOCK_DV)
        stats_desc = group_descriptor(STATS + b64 * slb + heads0 * slh + g0 * sl0 + g1 * sl1 + g2 * sl2, G, slh,
                                      Lg0, Lg1, Lg2, D0 * sl0, D1 * sl1, D2 * sl2, 4, RANK, TM0, TM1, TM2, 4)
        if TAIL_D > 0:
            q_tail_desc = group_descriptor(Q + BLOCK_D + b64 * sqb + heads0 * sqh + g0 * sq0 + g1 * sq1 + g2 * sq2, G,
                                           sqh, Lg0, Lg1, Lg2, D0 * sq0, D1 * sq1, D2 * sq2, HEAD_D - BLOCK_D, RANK,
                                           TM0, TM1, TM2, TAIL_D)
        if TAIL_DV > 0:
            do_tail_desc = group_descriptor(DO + BLOCK_DV + b64 * sdob + heads0 * sdoh + g0 * sdo0 + g1 * sdo1
                                            + g2 * sdo2, G, sdoh, Lg0, Lg1, Lg2, D0 * sdo0, D1 * sdo1, D2 * sdo2,
                                            HEAD_DV - BLOCK_DV, RANK, TM0, TM1, TM2, TAIL_DV)
    if TMA_DQ:
        # dQ shares go to L2 as bulk reductions of whole query tiles (one instruction each).
        dqa_desc = group_descriptor(DQA + b64 * sdqab + kvh64 * G * sdqah + g0 * sdqa0 + g1 * sdqa1 + g2 * sdqa2,
                                    G, sdqah, Lg0, Lg1, Lg2, D0 * sdqa0, D1 * sdqa1, D2 * sdqa2, HEAD_D, RANK,
                                    TM0, TM1, TM2, BLOCK_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dvacc = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    dk_tail = tl.zeros([BLOCK_N, TAIL_DW], tl.float32)
    dv_tail_acc = tl.zeros([BLOCK_N, TAIL_DVW], tl.float32)
    # Cursor: query head of the group, then query tile (see next3).
    group_head = tl.zeros((), tl.int32)
    j0, j1, j2 = tl.zeros((), tl.int32), tl.zeros((), tl.int32), tl.zeros((), tl.int32)
    for _step in range(0, G * nq):
        if LIVE_STEPS:
            j0, j1, j2, full_step = list_step(live, t, nq1, nq2)
        h = kvh * G + group_head
        xs0, xs1, xs2 = qst0 + j0 * TM0, qst1 + j1 * TM1, qst2 + j2 * TM2
        x0, x1, x2 = xs0 + m0, xs1 + m1, xs2 + m2
        # An anchored walk may start below coordinate 0; such rows are not read and add nothing.
        q_ok = (x0 >= 0) & (x0 < Lg0) & (x1 >= 0) & (x1 < Lg1) & (x2 >= 0) & (x2 < Lg2)
        i0, i1, i2 = g0 + D0 * x0, g1 + D1 * x1, g2 + D2 * x2
        if LARGE:
            i0, i1, i2 = i0.to(tl.int64), i1.to(tl.int64), i2.to(tl.int64)
        h64 = h.to(tl.int64)
        if HOST_TMA:
            q = load_host_box(QH, b, h, HEAD_D, 0, xs0, xs1, xs2, RANK, BLOCK_M, BLOCK_D)
            do = load_host_box(DOH, b, h, HEAD_DV, 0, xs0, xs1, xs2, RANK, BLOCK_M, BLOCK_DV)
            if TAIL_D > 0:
                q_tail = load_host_box(QTH, b, h, HEAD_D, BLOCK_D, xs0, xs1, xs2, RANK, BLOCK_M, TAIL_D)
            if TAIL_DV > 0:
                do_tail = load_host_box(DOTH, b, h, HEAD_DV, BLOCK_DV, xs0, xs1, xs2, RANK, BLOCK_M, TAIL_DV)
        elif TMA:
            q = load_box(q_desc, group_head, xs0, xs1, xs2, RANK, BLOCK_M, BLOCK_D)
            do = load_box(do_desc, group_head, xs0, xs1, xs2, RANK, BLOCK_M, BLOCK_DV)
            if TAIL_D > 0:
                q_tail = load_box(q_tail_desc, group_head, xs0, xs1, xs2, RANK, BLOCK_M, TAIL_D)
            if TAIL_DV > 0:
                do_tail = load_box(do_tail_desc, group_head, xs0, xs1, xs2, RANK, BLOCK_M, TAIL_DV)
        else:
            q_cells = (b64 * sqb + h64 * sqh + i0 * sq0 + i1 * sq1 + i2 * sq2)[:, None]
            do_cells = (b64 * sdob + h64 * sdoh + i0 * sdo0 + i1 * sdo1 + i2 * sdo2)[:, None]
            q = tl.load(Q + q_cells + d[None, :], mask=q_ok[:, None] & (d[None, :] < HEAD_D), other=0.0)
            do = tl.load(DO + do_cells + dv[None, :], mask=q_ok[:, None] & (dv[None, :] < HEAD_DV), other=0.0)
            if TAIL_D > 0:
                q_tail = tl.load(Q + q_cells + d_tail[None, :], mask=q_ok[:, None] & (d_tail[None, :] < HEAD_D),
                                 other=0.0)
            if TAIL_DV > 0:
                do_tail = tl.load(DO + do_cells + dv_tail[None, :],
                                  mask=q_ok[:, None] & (dv_tail[None, :] < HEAD_DV), other=0.0)
        if HOST_TMA:
            lse2, delta = stats_of_box(load_host_box(STH, b, h, 4, 0, xs0, xs1, xs2, RANK, BLOCK_M, 4), BLOCK_M)
        elif TMA:
            lse2, delta = stats_box(stats_desc, group_head, xs0, xs1, xs2, RANK, BLOCK_M)
        else:
            lse2, delta = row_stats(STATS, b64 * slb + h64 * slh + i0 * sl0 + i1 * sl1 + i2 * sl2, q_ok)
        if HAS_SCORE_MOD:
            lse2 = massless_rows(lse2)
        qkT = mma(kt, tl.trans(q), None, PRECISION)
        if TAIL_D > 0:
            qkT = mma(kt_tail, tl.trans(q_tail), qkT, PRECISION)
        if HAS_RPB:
            bias = relative_bias(RPB, srh, sr0, sr1, sr2, h, x0, x1, x2, y0, y1, y2, K0, K1, K2, False)
        else:
            bias = 0.0
        if HAS_SCORE_MOD or HAS_MASK_MOD:
            q_flat = flat_tokens(g0, g1, g2, x0, x1, x2, Lg0, Lg1, Lg2, D0, D1, D2, L1, L2, WIDE_INDEX)[None, :]
        if HAS_SCORE_MOD:
            sT, tT, slope = modded_scores(qkT, bias, scale, softcap, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3,
                                          HAS_RPB, HAS_SOFTCAP, SCORE_MOD, SCORE_MOD_GRAD, True)
        else:
            sT, tT = finish_scores(qkT, bias, scale, softcap, HAS_RPB, HAS_SOFTCAP)
        pT = tl.math.exp2(sT - lse2[None, :])
        if (TMA or HOST_TMA) and (HAS_RPB or HAS_SCORE_MOD):
            # Rows outside the grid came as zeros (stats_box): a large bias or modded score could
            # make their P inf.
            if (xs0 < 0) | (xs0 + TM0 > Lg0) | (xs1 < 0) | (xs1 + TM1 > Lg1) | (xs2 < 0) | (xs2 + TM2 > Lg2):
                pT = tl.where(q_ok[None, :], pT, 0.0)
        # The keys every query of this query tile sees (the walk over them is not used here).
        _, _, all_lo0, all_hi0 = key_walk(xs0, Lg0, K0, S0, SH0, C0, WINDOW, TM0, TN0, False)
        _, _, all_lo1, all_hi1 = key_walk(xs1, Lg1, K1, S1, SH1, C1, WINDOW, TM1, TN1, False)
        _, _, all_lo2, all_hi2 = key_walk(xs2, Lg2, K2, S2, SH2, C2, WINDOW, TM2, TN2, False)
        cross0 = crosses(ys0, TN0, all_lo0, all_hi0)
        cross1 = crosses(ys1, TN1, all_lo1, all_hi1)
        cross2 = crosses(ys2, TN2, all_lo2, all_hi2)
        # Rows (keys) carry the ranges and columns (queries) the coordinates: mask_pairs' orientation
        # "rows are queries" in its own terms.
        pT = mask_pairs(pT, 0.0, qlo0, qhi0, qlo1, qhi1, qlo2, qhi2, x0, x1, x2, cross0, cross1, cross2,
                        True, RANK, AXIS_MASKS)
        if HAS_MASK_MOD:
            if full_step == 0:
                pT = masked_by_mod(pT, 0.0, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, MASK_MOD)
        dvacc = mma(pT.to(do.dtype), do, dvacc, PRECISION)
        dpT = mma(vt, tl.trans(do), None, PRECISION)
        if TAIL_DV > 0:
            dv_tail_acc = mma(pT.to(do_tail.dtype), do_tail, dv_tail_acc, PRECISION)
            dpT = mma(vt_tail, tl.trans(do_tail), dpT, PRECISION)
        dsT = softcap_chain(pT * (dpT - delta[None, :]), tT, HAS_SOFTCAP)
        if HAS_SCORE_MOD:
            dsT = dsT * slope
        dk = mma(dsT.to(q.dtype), q, dk, PRECISION)
        if TAIL_D > 0:
            dk_tail = mma(dsT.to(q_tail.dtype), q_tail, dk_tail, PRECISION)
        if WAIT_DK:
            # Reading dk makes Triton wait for this product within the step instead of keeping it
            # in flight across the loop's back edge, where ptxas would serialise every wgmma of
            # the loop (its C7515, "non wgmma instructions defining accumulator registers": all 24
            # of a D=128 step wait for the one before) when the step also masks pairs and streams
            # three descriptor loads (q, dO, statistics rows), or, above head dim 128, on 8 warps
            # (tiles.waits_for_dk). Costs one FADD per dk element.
            dk = dk + 0.0
            if TAIL_D > 0:
                dk_tail = dk_tail + 0.0
            if TAIL_DV > 0:
                dv_tail_acc = dv_tail_acc + 0.0
        if ATOMIC_DQ:
            # dQ += dS K for this key tile's share, added in float32 (the order of the adds, hence
            # the rounding, varies from run to run: opt-in only).
            dq_part = mma(tl.trans(dsT).to(kt.dtype), kt, None, PRECISION)
            if TMA_DQ:
                add_to_box(dqa_desc, group_head, xs0, xs1, xs2, dq_part, RANK, TM0, TM1, TM2, BLOCK_D)
            else:
                dqa_rows = b64 * sdqab + h64 * sdqah + i0 * sdqa0 + i1 * sdqa1 + i2 * sdqa2
                tl.atomic_add(DQA + dqa_rows[:, None] + d[None, :], dq_part,
                              mask=q_ok[:, None] & (d[None, :] < HEAD_D), sem="relaxed")
        if RPB_GRAD:
            # dS of every attended pair into the [B, H, N, prod(K)] buffer, as dq_kernel writes it
            # (each pair is visited by exactly one program: the key tiles partition the keys).
            lo0, hi0 = key_range(x0, Lg0, K0, S0, SH0, C0, WINDOW)
            lo1, hi1 = key_range(x1, Lg1, K1, S1, SH1, C1, WINDOW)
            lo2, hi2 = key_range(x2, Lg2, K2, S2, SH2, C2, WINDOW)
            seen = within(lo0, hi0, lo1, hi1, lo2, hi2, y0, y1, y2, False, RANK) & q_ok[None, :] & k_ok[:, None]
            slot = ((y0[:, None] - lo0[None, :]) * K1 + (y1[:, None] - lo1[None, :])) * K2 + (y2[:, None] - lo2[None, :])
            ds_rows = ((b64 * H + h64) * (L0 * L1 * L2) + (i0 * L1 + i1) * L2 + i2) * (K0 * K1 * K2)
            tl.store(DSB + ds_rows[None, :] + slot, dsT, mask=seen)
        if LIVE_STEPS:
            t += 1
            next_head = t == nq
            t = tl.where(next_head, 0, t)
        else:
            j0, j1, j2 = next3(j0, j1, j2, nq1, nq2)
            next_head = j0 == nq0
            j0 = tl.where(next_head, 0, j0)
        group_head += next_head.to(tl.int32)

    tl.store(DK + (b64 * sdkb + kvh64 * sdkh + k0 * sdk0 + k1 * sdk1 + k2 * sdk2)[:, None] + d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=k_ok[:, None] & (d[None, :] < HEAD_D))
    tl.store(DV + (b64 * sdvb + kvh64 * sdvh + k0 * sdv0 + k1 * sdv1 + k2 * sdv2)[:, None] + dv[None, :],
             dvacc.to(DV.dtype.element_ty), mask=k_ok[:, None] & (dv[None, :] < HEAD_DV))
    if TAIL_D > 0:
        tl.store(DK + (b64 * sdkb + kvh64 * sdkh + k0 * sdk0 + k1 * sdk1 + k2 * sdk2)[:, None] + d_tail[None, :],
                 (dk_tail * scale).to(DK.dtype.element_ty), mask=k_ok[:, None] & (d_tail[None, :] < HEAD_D))
    if TAIL_DV > 0:
        tl.store(DV + (b64 * sdvb + kvh64 * sdvh + k0 * sdv0 + k1 * sdv1 + k2 * sdv2)[:, None] + dv_tail[None, :],
                 dv_tail_acc.to(DV.dtype.element_ty), mask=k_ok[:, None] & (dv_tail[None, :] < HEAD_DV))


@triton.jit
def extra_dkdv_kernel(
    Q, AK, AV, DO, STATS, DAK, DAV, DQA, MT0, MT1, MT2, MT3,
    sqb, sq0, sq1, sq2, sqh,
    sakb, sake, sakh, savb, save, savh,
    sdob, sdo0, sdo1, sdo2, sdoh,
    slb, sl0, sl1, sl2, slh,
    sdakb, sdake, sdakh, sdavb, sdave, sdavh,
    sdqab, sdqa0, sdqa1, sdqa2, sdqah,
    G, E, HEAD_D, HEAD_DV, L0, L1, L2,
    scale, softcap,
    BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, LARGE: tl.constexpr, PRECISION: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    HAS_SCORE_MOD: tl.constexpr, HAS_MASK_MOD: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_MOD_GRAD: tl.constexpr,
    MASK_MOD: tl.constexpr, WIDE_INDEX: tl.constexpr,
):
    kvh = tl.program_id(1)
    b = tl.program_id(2)
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < E
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    b64, kvh64 = b.to(tl.int64), kvh.to(tl.int64)
    kt = tl.load(AK + (b64 * sakb + kvh64 * sakh + e * sake)[:, None] + d[None, :],
                 mask=e_ok[:, None] & (d[None, :] < HEAD_D), other=0.0)
    vt = tl.load(AV + (b64 * savb + kvh64 * savh + e * save)[:, None] + dv[None, :],
                 mask=e_ok[:, None] & (dv[None, :] < HEAD_DV), other=0.0)
    N = L0 * L1 * L2
    n_blocks = tl.cdiv(N, BLOCK_M)
    dk = tl.zeros([BLOCK_E, BLOCK_D], tl.float32)
    dvacc = tl.zeros([BLOCK_E, BLOCK_DV], tl.float32)
    rows = tl.arange(0, BLOCK_M)
    if HAS_SCORE_MOD or HAS_MASK_MOD:
        kv_flat = extra_tokens(e, E, L0, L1, L2, WIDE_INDEX)[:, None]
    for it in range(0, G * n_blocks):
        h = kvh * G + it // n_blocks
        h64 = h.to(tl.int64)
        flat = (it % n_blocks) * BLOCK_M + rows
        q_ok = flat < N
        i0, i1, i2 = split3(flat, L1, L2)
        if LARGE:
            i0, i1, i2 = i0.to(tl.int64), i1.to(tl.int64), i2.to(tl.int64)
        q = tl.load(Q + (b64 * sqb + h64 * sqh + i0 * sq0 + i1 * sq1 + i2 * sq2)[:, None] + d[None, :],
                    mask=q_ok[:, None] & (d[None, :] < HEAD_D), other=0.0)
        do = tl.load(DO + (b64 * sdob + h64 * sdoh + i0 * sdo0 + i1 * sdo1 + i2 * sdo2)[:, None] + dv[None, :],
                     mask=q_ok[:, None] & (dv[None, :] < HEAD_DV), other=0.0)
        lse2, delta = row_stats(STATS, b64 * slb + h64 * slh + i0 * sl0 + i1 * sl1 + i2 * sl2, q_ok)
        if HAS_SCORE_MOD:
            lse2 = massless_rows(lse2)
        qkT = mma(kt, tl.trans(q), None, PRECISION)
        if HAS_SCORE_MOD or HAS_MASK_MOD:
            q_flat = tl.minimum(flat, N - 1)[None, :]
            if WIDE_INDEX:
                q_flat = q_flat.to(tl.int64)
        if HAS_SCORE_MOD:
            sT, tT, slope = modded_scores(qkT, 0.0, scale, softcap, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, False,
                                          HAS_SOFTCAP, SCORE_MOD, SCORE_MOD_GRAD, True)
        else:
            sT, tT = finish_scores(qkT, 0.0, scale, softcap, False, HAS_SOFTCAP)
        pT = tl.where(e_ok[:, None], tl.math.exp2(sT - lse2[None, :]), 0.0)
        if HAS_MASK_MOD:
            pT = masked_by_mod(pT, 0.0, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, MASK_MOD)
        dvacc = mma(pT.to(do.dtype), do, dvacc, PRECISION)
        dpT = mma(vt, tl.trans(do), None, PRECISION)
        dsT = softcap_chain(pT * (dpT - delta[None, :]), tT, HAS_SOFTCAP)
        if HAS_SCORE_MOD:
            dsT = dsT * slope
        dk = mma(dsT.to(q.dtype), q, dk, PRECISION)
        if ATOMIC_DQ:  # the additional keys' share of dQ (see dkdv_kernel)
            dq_part = mma(tl.trans(dsT).to(kt.dtype), kt, None, PRECISION)
            dqa_rows = b64 * sdqab + h64 * sdqah + i0 * sdqa0 + i1 * sdqa1 + i2 * sdqa2
            tl.atomic_add(DQA + dqa_rows[:, None] + d[None, :], dq_part,
                          mask=q_ok[:, None] & (d[None, :] < HEAD_D), sem="relaxed")
    tl.store(DAK + (b64 * sdakb + kvh64 * sdakh + e * sdake)[:, None] + d[None, :],
             (dk * scale).to(DAK.dtype.element_ty), mask=e_ok[:, None] & (d[None, :] < HEAD_D))
    tl.store(DAV + (b64 * sdavb + kvh64 * sdavh + e * sdave)[:, None] + dv[None, :],
             dvacc.to(DAV.dtype.element_ty), mask=e_ok[:, None] & (dv[None, :] < HEAD_DV))


@triton.jit
def row_stats_kernel(O, DO, LSE, DLSE, STATS, rows, so_row, sdo_row, HEAD_DV,
                     BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_DLSE: tl.constexpr):
    """The backward's two numbers per (token, head) row, as one 16-byte float32 row
    ``[lse * log2(e), delta, 0, 0]`` with delta = rowsum(dO * O) - dLSE: the other kernels then
    need no per-step scaling of the LSE, and the 16 bytes make a row a legal innermost box of a
    tensor descriptor, so dkdv_kernel copies a query tile's statistics in one instruction."""
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    ok = r < rows
    d = tl.arange(0, BLOCK_DV)
    do = tl.load(DO + r[:, None] * sdo_row + d[None, :], mask=ok[:, None] & (d[None, :] < HEAD_DV), other=0.0)
    own_row_stats(O, LSE, DLSE, STATS, r * so_row, r, r * 4, do, do, ok, d, d, HEAD_DV, HAS_DLSE, 0)
