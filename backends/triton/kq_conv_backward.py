"""Fused backward of the key-query convolution (SEMANTICS.md section 6), deterministic, no atomics.

With dC the gradient of the convolved scores (the softmax's, through softcap; kq_conv_scores
recomputes C tile by tile from the forward's LSE):

* ``dS0(i', j') = [(i', j') attended] * sum_{a, t} W[a, t] dC(i' + c_q - 1 - a, j' + reach - t)``,
  and ``dq = scale * dS0 @ k``, ``dk = scale * dS0^T @ q``;
* ``dW[a, t] = sum_{i, j} dC(i, j) S0(i - c_q + 1 + a, j - reach + t)``.

``dq_dw_kernel`` runs over tiles of *source* rows: it needs dC on the rows ``c_q - 1`` below its
own, so it recomputes dC on its BM rows and on a TAIL-row tile after them, and moves each row
shift's rows into place by a product with a 0/1 shift matrix (exact: the float32 operands keep
their value in every precision used here). The band matrices transposed take dC back to the
source columns of the key tile and its halos. Its own rows' S0 with each shifted dC, summed over
its key walk, give the band-shaped gradient of every kernel row; their diagonals are dW, summed
by the host over programs in a fixed order.

Additional tokens add their plain scores' part to dQ in ``dq_dw_kernel``; their own gradients
come from the neighbourhood backward's ``extra_dkdv_kernel`` (they see every query alike).

``dkdv_kernel`` runs over key tiles (every query head of a key head in turn, as GQA asks): dV as
usual, and dK of the source columns the tile's target columns reach, the tile and its halos. The
halos' parts belong to the neighbouring tiles; they are written apart (SPILL) and added by the
host, so no two programs write one address.
"""

import triton
import triton.language as tl

from .kq_conv_scores import (attended, band_part_transposed, convolved_tile, grid_sees, key_parts, load_row_stats,
                             load_rows, query_program, source_scores, sources_attended, target_scores,
                             targets_attended)
from .index_math import group_length, key_range
from .scores import LOG2E, mma, tanh

# Rows of dC past a source tile that its row shifts reach (c_q - 1 <= TAIL).
TAIL = tl.constexpr(16)


@triton.jit
def score_gradients(c, rows, cols, full, lse, delta, do_rows, v_tile, RPB, srh, srk, h, L, Dl, WIN, S, shift,
                    softcap, HAS_RPB: tl.constexpr, HAS_SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr,
                    WINDOW: tl.constexpr, PRECISION: tl.constexpr):
    """P and dC of a target tile from its convolved scores ``c``: ``dC = P (dO v^T - delta)``
    through the softcap's derivative; both 0 on pairs outside the pattern (``full``: none is)."""
    s, t = target_scores(c, rows, cols, RPB, srh, srk, h, L, Dl, WIN, softcap, HAS_RPB, HAS_SOFTCAP)
    p = attended(tl.math.exp2(s - (lse * LOG2E)[:, None]), 0.0, full, rows, cols, L, Dl, WIN, S, shift, CAUSAL,
                 WINDOW)
    dp = mma(do_rows, tl.trans(v_tile), tl.zeros([do_rows.shape[0], v_tile.shape[0]], dtype=tl.float32), PRECISION)
    dc = p * (dp - delta[:, None])
    if HAS_SOFTCAP:
        dc = dc * (1.0 - t * t)
    return p, dc


@triton.jit
def store_window_slots(ds_base, dc, rows, cols, L, Dl, WIN, S, shift, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """dC of the attended pairs at ``[row, slot]`` of a ``[L, WIN]`` buffer, slot = the key's place
    in its row's window (group units): the layout launch.rpb_gradient folds into rpb's gradient
    (d rpb is dC summed per relative position: the bias is added after the convolution)."""
    ic = tl.minimum(tl.maximum(rows, 0), L - 1)
    g = ic % Dl
    lo, _ = key_range(ic // Dl, group_length(L, g, Dl), WIN, S, shift, CAUSAL, WINDOW)
    slot = (tl.minimum(tl.maximum(cols, 0), L - 1) // Dl)[None, :] - lo[:, None]
    offsets = ic.to(tl.int64)[:, None] * WIN + slot
    tl.store(ds_base + offsets, dc, mask=grid_sees(rows, cols, L, Dl, WIN, S, shift, CAUSAL, WINDOW))


@triton.jit
def extra_token_dq(dq, q_rows, do_rows, lse, delta, ak_base, sake, av_base, save, EXTRA, D, DV, scale, softcap,
                   BM: tl.constexpr, BE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   HAS_SOFTCAP: tl.constexpr, LARGE: tl.constexpr, PRECISION: tl.constexpr):
    """The additional tokens' part of dQ (unscaled, as the caller's): their scores are plain
    (no convolution, no rpb), in the same softmax."""
    for e0 in range(0, EXTRA, BE):
        e = e0 + tl.arange(0, BE)
        ak = load_rows(ak_base, e, sake, EXTRA, BLOCK_D, D, LARGE)
        av = load_rows(av_base, e, save, EXTRA, BLOCK_DV, DV, LARGE)
        se = mma(q_rows, tl.trans(ak), tl.zeros([BM, BE], dtype=tl.float32), PRECISION) * scale
        t = se * 0.0
        if HAS_SOFTCAP:
            t = tanh(se / softcap)
            se = softcap * t
        p = tl.where((e < EXTRA)[None, :], tl.math.exp2((se - lse[:, None]) * LOG2E), 0.0)
        dp = mma(do_rows, tl.trans(av), tl.zeros([BM, BE], dtype=tl.float32), PRECISION)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = mma(ds.to(ak.dtype), ak, dq, PRECISION)
    return dq


@triton.jit
def shifted_rows(dc_main, dc_tail, shift_by, BM: tl.constexpr, GRAD_PRECISION: tl.constexpr):
    """Rows ``r + shift_by`` of the stacked ``[dc_main; dc_tail]`` for r < BM (0/1 products)."""
    r = tl.arange(0, BM)
    pick = (tl.arange(0, BM)[None, :] == r[:, None] + shift_by).to(tl.float32)
    out = mma(pick, dc_main, tl.zeros(dc_main.shape, dtype=tl.float32), GRAD_PRECISION)
    pick_tail = ((BM + tl.arange(0, TAIL))[None, :] == r[:, None] + shift_by).to(tl.float32)
    return mma(pick_tail, dc_tail, out, GRAD_PRECISION)


@triton.jit
def add_at(values, a, update, C_Q: tl.constexpr):
    """``values`` (a tuple of C_Q tensors) with ``update`` added to entry ``a``, an index known
    at run time only: one branch per entry, of which the one taken adds."""
    for i in tl.static_range(C_Q):
        if a == i:
            values = values[:i] + (values[i] + update,) + values[i + 1:]
    return values


@triton.jit
def diagonal_sums(dw_ptr, grad_c, grad_l, grad_r, C_K, REACH, BN: tl.constexpr, HALO: tl.constexpr):
    """dW of one kernel row from its band-shaped gradients (the key tile's part and the halos'):
    tap t sums the entries whose source column minus target column is ``t - REACH``."""
    j = tl.arange(0, BN)
    tap_c = tl.arange(0, BN)[:, None] - j[None, :] + REACH
    if HALO > 0:
        tap_l = (tl.arange(0, HALO) - HALO)[:, None] - j[None, :] + REACH
        tap_r = (BN + tl.arange(0, HALO))[:, None] - j[None, :] + REACH
    for t in range(C_K):
        total = tl.sum(tl.sum(tl.where(tap_c == t, grad_c, 0.0), 1), 0)
        if HALO > 0:
            total += tl.sum(tl.sum(tl.where(tap_l == t, grad_l, 0.0), 1), 0)
            total += tl.sum(tl.sum(tl.where(tap_r == t, grad_r, 0.0), 1), 0)
        tl.store(dw_ptr + t, total)


@triton.jit
def dq_dw_kernel(
    Q, K, V, DO, LSE, DELTA, BANDS, RUNS, RPB, DQ, DW, DS, AK, AV,
    sqb, sql, sqh, skb, skl, skh, svb, svl, svh, sdob, sdol, sdoh, slb, sll, slh, sdb, sdl, sdh,
    sdqb, sdql, sdqh, sbh, sba, srh, srk, sakb, sake, sakh, savb, save, savh,
    GROUP, D, DV, H, L, Dl, WIN, S, shift, scale, softcap, C_K, EXTRA,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, C_Q: tl.constexpr, HALO: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_RPB: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_DS: tl.constexpr, HAS_EXTRA: tl.constexpr,
    LARGE: tl.constexpr, PRECISION: tl.constexpr, GRAD_PRECISION: tl.constexpr,
):
    tile, b, h, kvh, q_base, k_base, v_base = query_program(Q, K, V, sqb, sqh, skb, skh, svb, svh, GROUP, LARGE)
    dw_ptr = DW + ((b * H + h) * tl.num_programs(0) + tile) * (C_Q * C_K)
    do_base = DO + b * sdob + h * sdoh
    bands_base = BANDS + h * sbh
    row0 = tile * BM
    rows = row0 + tl.arange(0, BM)
    tail = row0 + BM + tl.arange(0, TAIL)
    run_lo = tl.load(RUNS + 2 * tile)
    run_hi = tl.load(RUNS + 2 * tile + 1)

    q_rows = load_rows(q_base, rows, sql, L, BLOCK_D, D, LARGE)
    do_main = load_rows(do_base, rows, sdol, L, BLOCK_DV, DV, LARGE)
    lse_main = load_row_stats(LSE + b * slb + h * slh, rows, sll, L, LARGE)
    delta_main = load_row_stats(DELTA + b * sdb + h * sdh, rows, sdl, L, LARGE)
    if C_Q > 1:
        do_tail = load_rows(do_base, tail, sdol, L, BLOCK_DV, DV, LARGE)
        lse_tail = load_row_stats(LSE + b * slb + h * slh, tail, sll, L, LARGE)
        delta_tail = load_row_stats(DELTA + b * sdb + h * sdh, tail, sdl, L, LARGE)

    dq = tl.zeros([BM, BLOCK_D], dtype=tl.float32)
    grad_c = (tl.zeros([BN, BN], dtype=tl.float32),) * C_Q
    if HALO > 0:
        grad_l = (tl.zeros([HALO, BN], dtype=tl.float32),) * C_Q
        grad_r = (tl.zeros([HALO, BN], dtype=tl.float32),) * C_Q
    center_rows = HALO + tl.arange(0, BN)
    if HALO > 0:
        halo = tl.arange(0, HALO)

    for n0 in range(run_lo, run_hi, BN):
        cols = n0 + tl.arange(0, BN)
        k_tile, k_left, k_right = key_parts(k_base, skl, n0, L, BN, HALO, BLOCK_D, D, LARGE)
        v_tile = load_rows(v_base, cols, svl, L, BLOCK_DV, DV, LARGE)
        full = sources_attended(row0, n0, L, Dl, WIN, S, shift, C_Q, BM, BN, HALO, CAUSAL, WINDOW)
        c = convolved_tile(q_base, sql, k_tile, k_left, k_right, n0, rows, full, bands_base, sba, L, Dl, WIN, S,
                           shift, scale, BM, BN, HALO, C_Q, BLOCK_D, D, CAUSAL, WINDOW, LARGE, PRECISION,
                           GRAD_PRECISION)
        _, dc_main = score_gradients(c, rows, cols, targets_attended(row0, n0, L, Dl, WIN, S, shift, BM, BN, CAUSAL,
                                                                     WINDOW),
                                     lse_main, delta_main, do_main, v_tile, RPB, srh, srk, h, L, Dl, WIN, S, shift,
                                     softcap, HAS_RPB, HAS_SOFTCAP, CAUSAL, WINDOW, PRECISION)
        if HAS_DS:
            store_window_slots(DS + (b * H + h).to(tl.int64) * L * WIN, dc_main, rows, cols, L, Dl, WIN, S, shift,
                               CAUSAL, WINDOW)
        if C_Q > 1:
            tail_full = sources_attended(row0 + BM, n0, L, Dl, WIN, S, shift, C_Q, TAIL, BN, HALO, CAUSAL, WINDOW)
            c = convolved_tile(q_base, sql, k_tile, k_left, k_right, n0, tail, tail_full, bands_base, sba, L, Dl,
                               WIN, S, shift, scale, TAIL, BN, HALO, C_Q, BLOCK_D, D, CAUSAL, WINDOW, LARGE,
                               PRECISION, GRAD_PRECISION)
            _, dc_tail = score_gradients(c, tail, cols, targets_attended(row0 + BM, n0, L, Dl, WIN, S, shift, TAIL,
                                                                         BN, CAUSAL, WINDOW),
                                         lse_tail, delta_tail, do_tail, v_tile, RPB, srh, srk, h, L, Dl, WIN, S,
                                         shift, softcap, HAS_RPB, HAS_SOFTCAP, CAUSAL, WINDOW, PRECISION)
        # this tile's own S0 (the sources of the shifted targets)
        s0_c = source_scores(q_rows, k_tile, rows, cols, full, L, Dl, WIN, S, shift, scale, CAUSAL, WINDOW,
                             PRECISION)
        if HALO > 0:
            s0_l = source_scores(q_rows, k_left, rows, n0 - HALO + halo, full, L, Dl, WIN, S, shift, scale, CAUSAL,
                                 WINDOW, PRECISION)
            s0_r = source_scores(q_rows, k_right, rows, n0 + BN + halo, full, L, Dl, WIN, S, shift, scale, CAUSAL,
                                 WINDOW, PRECISION)
        for a in range(C_Q):  # at run time: see convolved_tile
            dc_a = dc_main
            if C_Q > 1:
                if a < C_Q - 1:
                    dc_a = shifted_rows(dc_main, dc_tail, C_Q - 1 - a, BM, GRAD_PRECISION)
            bands_a = bands_base + a * sba
            grad_c = add_at(grad_c, a, mma(tl.trans(s0_c), dc_a, tl.zeros([BN, BN], dtype=tl.float32),
                                           GRAD_PRECISION), C_Q)
            ds0 = mma(dc_a, band_part_transposed(bands_a, center_rows, BN), tl.zeros([BM, BN], dtype=tl.float32),
                      GRAD_PRECISION)
            ds0 = attended(ds0, 0.0, full, rows, cols, L, Dl, WIN, S, shift, CAUSAL, WINDOW)
            dq = mma(ds0.to(k_tile.dtype), k_tile, dq, PRECISION)
            if HALO > 0:
                grad_l = add_at(grad_l, a, mma(tl.trans(s0_l), dc_a, tl.zeros([HALO, BN], dtype=tl.float32),
                                               GRAD_PRECISION), C_Q)
                grad_r = add_at(grad_r, a, mma(tl.trans(s0_r), dc_a, tl.zeros([HALO, BN], dtype=tl.float32),
                                               GRAD_PRECISION), C_Q)
                ds0 = mma(dc_a, band_part_transposed(bands_a, halo, BN), tl.zeros([BM, HALO], dtype=tl.float32),
                          GRAD_PRECISION)
                ds0 = attended(ds0, 0.0, full, rows, n0 - HALO + halo, L, Dl, WIN, S, shift, CAUSAL, WINDOW)
                dq = mma(ds0.to(k_left.dtype), k_left, dq, PRECISION)
                ds0 = mma(dc_a, band_part_transposed(bands_a, HALO + BN + halo, BN),
                          tl.zeros([BM, HALO], dtype=tl.float32), GRAD_PRECISION)
                ds0 = attended(ds0, 0.0, full, rows, n0 + BN + halo, L, Dl, WIN, S, shift, CAUSAL, WINDOW)
                dq = mma(ds0.to(k_right.dtype), k_right, dq, PRECISION)

    if HAS_EXTRA:
        dq = extra_token_dq(dq, q_rows, do_main, lse_main, delta_main, AK + b * sakb + kvh * sakh, sake,
                            AV + b * savb + kvh * savh, save, EXTRA, D, DV, scale, softcap, BM, BE, BLOCK_D,
                            BLOCK_DV, HAS_SOFTCAP, LARGE, PRECISION)
    d = tl.arange(0, BLOCK_D)
    r = rows
    if LARGE:
        r = r.to(tl.int64)
    tl.store(DQ + b * sdqb + h * sdqh + r[:, None] * sdql + d[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=(rows < L)[:, None] & (d < D)[None, :])
    reach = (C_K - 1) // 2
    for a in tl.static_range(C_Q):
        if HALO > 0:
            diagonal_sums(dw_ptr + a * C_K, grad_c[a], grad_l[a], grad_r[a], C_K, reach, BN, HALO)
        else:
            diagonal_sums(dw_ptr + a * C_K, grad_c[a], grad_c[a], grad_c[a], C_K, reach, BN, HALO)


@triton.jit
def dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, BANDS, RUNS, RPB, DK, DV, SPILL,
    sqb, sql, sqh, skb, skl, skh, svb, svl, svh, sdob, sdol, sdoh, slb, sll, slh, sdb, sdl, sdh,
    sdkb, sdkl, sdkh, sdvb, sdvl, sdvh, sbh, sba, srh, srk,
    GROUP, D, DV_WIDTH, KV_HEADS, L, Dl, WIN, S, shift, scale, softcap,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, C_Q: tl.constexpr, HALO: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_RPB: tl.constexpr, HAS_SOFTCAP: tl.constexpr, LARGE: tl.constexpr,
    PRECISION: tl.constexpr, GRAD_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2)
    tiles = tl.num_programs(0)
    spill_base = SPILL + ((b * KV_HEADS + kvh) * tiles + tile) * (2 * HALO * BLOCK_D)
    if LARGE:
        b = b.to(tl.int64)
        kvh = kvh.to(tl.int64)
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh
    n0 = tile * BN
    cols = n0 + tl.arange(0, BN)
    if HALO > 0:
        halo = tl.arange(0, HALO)
        left_cols = n0 - HALO + halo
        right_cols = n0 + BN + halo
    center_rows = HALO + tl.arange(0, BN)
    row_lo = tl.load(RUNS + 2 * tile)
    row_hi = tl.load(RUNS + 2 * tile + 1)
    k_tile, k_left, k_right = key_parts(k_base, skl, n0, L, BN, HALO, BLOCK_D, D, LARGE)
    v_tile = load_rows(v_base, cols, svl, L, BLOCK_DV, DV_WIDTH, LARGE)

    dk = tl.zeros([BN, BLOCK_D], dtype=tl.float32)
    if HALO > 0:
        dk_left = tl.zeros([HALO, BLOCK_D], dtype=tl.float32)
        dk_right = tl.zeros([HALO, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BN, BLOCK_DV], dtype=tl.float32)
    for g in range(GROUP):
        h = kvh * GROUP + g
        q_base = Q + b * sqb + h * sqh
        do_base = DO + b * sdob + h * sdoh
        bands_base = BANDS + h * sbh
        for m0 in range(row_lo, row_hi, BM):
            rows = m0 + tl.arange(0, BM)
            full = sources_attended(m0, n0, L, Dl, WIN, S, shift, C_Q, BM, BN, HALO, CAUSAL, WINDOW)
            c = convolved_tile(q_base, sql, k_tile, k_left, k_right, n0, rows, full, bands_base, sba, L, Dl, WIN, S,
                               shift, scale, BM, BN, HALO, C_Q, BLOCK_D, D, CAUSAL, WINDOW, LARGE, PRECISION,
                               GRAD_PRECISION)
            do_rows = load_rows(do_base, rows, sdol, L, BLOCK_DV, DV_WIDTH, LARGE)
            lse = load_row_stats(LSE + b * slb + h * slh, rows, sll, L, LARGE)
            delta = load_row_stats(DELTA + b * sdb + h * sdh, rows, sdl, L, LARGE)
            p, dc = score_gradients(c, rows, cols, targets_attended(m0, n0, L, Dl, WIN, S, shift, BM, BN, CAUSAL,
                                                                    WINDOW),
                                    lse, delta, do_rows, v_tile, RPB, srh, srk, h, L, Dl, WIN, S, shift, softcap,
                                    HAS_RPB, HAS_SOFTCAP, CAUSAL, WINDOW, PRECISION)
            dv = mma(tl.trans(p).to(do_rows.dtype), do_rows, dv, PRECISION)
            for a in range(C_Q):  # at run time: see convolved_tile
                src = rows - (C_Q - 1) + a
                q_a = load_rows(q_base, src, sql, L, BLOCK_D, D, LARGE)
                bands_a = bands_base + a * sba
                ds0 = mma(dc, band_part_transposed(bands_a, center_rows, BN), tl.zeros([BM, BN], dtype=tl.float32),
                          GRAD_PRECISION)
                ds0 = attended(ds0, 0.0, full, src, cols, L, Dl, WIN, S, shift, CAUSAL, WINDOW)
                dk = mma(tl.trans(ds0).to(q_a.dtype), q_a, dk, PRECISION)
                if HALO > 0:
                    ds0 = mma(dc, band_part_transposed(bands_a, halo, BN), tl.zeros([BM, HALO], dtype=tl.float32),
                              GRAD_PRECISION)
                    ds0 = attended(ds0, 0.0, full, src, left_cols, L, Dl, WIN, S, shift, CAUSAL, WINDOW)
                    dk_left = mma(tl.trans(ds0).to(q_a.dtype), q_a, dk_left, PRECISION)
                    ds0 = mma(dc, band_part_transposed(bands_a, HALO + BN + halo, BN),
                              tl.zeros([BM, HALO], dtype=tl.float32), GRAD_PRECISION)
                    ds0 = attended(ds0, 0.0, full, src, right_cols, L, Dl, WIN, S, shift, CAUSAL, WINDOW)
                    dk_right = mma(tl.trans(ds0).to(q_a.dtype), q_a, dk_right, PRECISION)

    d = tl.arange(0, BLOCK_D)
    e = tl.arange(0, BLOCK_DV)
    c_ok = cols < L
    cr = cols
    if LARGE:
        cr = cr.to(tl.int64)
    tl.store(DK + b * sdkb + kvh * sdkh + cr[:, None] * sdkl + d[None, :], dk * scale,
             mask=c_ok[:, None] & (d < D)[None, :])
    tl.store(DV + b * sdvb + kvh * sdvh + cr[:, None] * sdvl + e[None, :], dv.to(DV.dtype.element_ty),
             mask=c_ok[:, None] & (e < DV_WIDTH)[None, :])
    if HALO > 0:
        spill = halo[:, None] * BLOCK_D + d[None, :]
        tl.store(spill_base + spill, dk_left * scale)
        tl.store(spill_base + HALO * BLOCK_D + spill, dk_right * scale)
