"""Fused neighbourhood / window attention forward, one program per (query tile, head, batch).

Every problem is run as rank 3 (missing leading axes have length 1, window 1), so one kernel
serves ranks 1-3. The query tile is a box of TM0 x TM1 x TM2 group coordinates inside one
dilation group per axis (token ``g + Dl * x``: dilation is a strided address, never a copy). The
keys any query of the tile sees form a box (the ranges are monotone), which the program walks in
TN0 x TN1 x TN2 key tiles; only tiles not seen in full by every query of the tile pay for the
per-pair mask, and only on the axes where they are not (the walk is anchored so that as many
tiles as possible lie inside: index_math.key_walk). Tensors are read in place through their strides ([B, *spatial, H, D]).

With ``PACK`` > 1 one program runs the same query tile for PACK consecutive (batch, head) pairs
in one flat loop over (pair, key tile): every pair of a tile has the same geometry, so the walk's
set-up is paid once, and the next pair's first tiles are loaded while this pair's last ones are
multiplied. A walk of one key tile is otherwise all prologue and epilogue with nothing to overlap
them; on longer walks the packed loop's dearer steps cost more than that saves (tiles.PACK_MAX_STEPS).
"""

import triton
import triton.language as tl

from .descriptors import kv_descriptors, kv_tail_descriptors, load_host_box, load_streamed_tile, store_host_box
from .exp2_split import exp2_split
from .index_math import crosses, group_length, key_range, key_walk, list_step, next3, split3
from .mod_hooks import extra_tokens, flat_tokens, masked_by_mod, modded_scores
from .scores import LN2, LOG2E, finish_scores, mask_pairs, mma, relative_bias


@triton.jit
def query_tile(pid, L0, L1, L2, D0, D1, D2, NT0, NT1, NT2):
    """Program id -> (dilation group, first group coordinate, group length) per axis."""
    c0, c1, c2 = split3(pid, D1 * NT1, D2 * NT2)
    g0, g1, g2 = c0 // NT0, c1 // NT1, c2 // NT2
    return (g0, (c0 % NT0), group_length(L0, g0, D0),
            g1, (c1 % NT1), group_length(L1, g1, D1),
            g2, (c2 % NT2), group_length(L2, g2, D2))


@triton.jit
def tile_tokens(pid, L0, L1, L2, D0, D1, D2, NT0, NT1, NT2, T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,
                LARGE: tl.constexpr):
    """The tokens of tile ``pid`` (a T0 x T1 x T2 box of group coordinates; query tiles, or the key
    tiles of the key-major pass): per axis the dilation group g, its length Lg, the box's first
    coordinate xs and each row's coordinate x; which rows lie inside the grid; each row's token
    index per axis (int64 with LARGE)."""
    g0, t0, Lg0, g1, t1, Lg1, g2, t2, Lg2 = query_tile(pid, L0, L1, L2, D0, D1, D2, NT0, NT1, NT2)
    xs0, xs1, xs2 = t0 * T0, t1 * T1, t2 * T2
    m0, m1, m2 = split3(tl.arange(0, T0 * T1 * T2), T1, T2)
    x0, x1, x2 = xs0 + m0, xs1 + m1, xs2 + m2
    ok = (x0 < Lg0) & (x1 < Lg1) & (x2 < Lg2)
    i0, i1, i2 = g0 + D0 * x0, g1 + D1 * x1, g2 + D2 * x2
    if LARGE:
        i0, i1, i2 = i0.to(tl.int64), i1.to(tl.int64), i2.to(tl.int64)
    return g0, g1, g2, Lg0, Lg1, Lg2, xs0, xs1, xs2, x0, x1, x2, ok, i0, i1, i2


# Lazy rescaling (LAZY_RESCALE): the running row maxima move only when some row of the tile
# would see a score more than RESCALE_SLACK (log2 units) above its current maximum. Until then
# the probabilities of a tile are exp2(s - stale max) <= 2^RESCALE_SLACK, which float32 sums and
# 16-bit P operands carry exactly as well as values <= 1 (only the exponent differs); the final
# normalisation divides by the sum of the same terms, so the output and LSE are unchanged. Most
# tiles after the first few then skip the accumulator rescale (BLOCK_M x D_v multiplies a
# thread's share) and its exp2s, at the price of one tile-wide vote.
RESCALE_SLACK = tl.constexpr(8.0)


@triton.jit
def finite(m):
    """Row maxima with -inf (rows that have seen no key yet) replaced by 0: exp2(s - 0) of a
    -inf score is 0, not NaN."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def online_softmax_rescale(s, m_i, l_i, acc, acc_tail, unit, LAZY: tl.constexpr, TAIL: tl.constexpr):
    """Move the running maxima ``m_i`` for score tile ``s`` and rescale the running sums ``l_i``
    and accumulator ``acc`` (and with ``TAIL`` the value tail's ``acc_tail``, see forward_kernel)
    to them: always (exact online softmax), or with ``LAZY`` only when some row's maximum grew by
    more than RESCALE_SLACK (see above). Scores and maxima are in units whose product with
    ``unit`` (> 0) is log2-domain: 1, or the folded scale (see FOLD_SCALE in forward_kernel)."""
    m_tile = tl.max(s, 1)
    if LAZY:
        if tl.max((m_tile * unit > m_i * unit + RESCALE_SLACK).to(tl.int32), 0) > 0:
            m_i, l_i, acc, acc_tail = _raise_maxima(m_i, m_tile, l_i, acc, acc_tail, unit, TAIL)
    else:
        m_i, l_i, acc, acc_tail = _raise_maxima(m_i, m_tile, l_i, acc, acc_tail, unit, TAIL)
    return m_i, l_i, acc, acc_tail


@triton.jit
def _raise_maxima(m_i, m_tile, l_i, acc, acc_tail, unit, TAIL: tl.constexpr):
    """Running maxima raised to the tile's, sums and accumulators rescaled to match."""
    m_new = tl.maximum(m_i, m_tile)
    alpha = tl.math.exp2((m_i - finite(m_new)) * unit)
    if TAIL:
        acc_tail = acc_tail * alpha[:, None]
    return m_new, l_i * alpha, acc * alpha[:, None], acc_tail


@triton.jit
def probabilities(s, m_i, unit, EXP2_EVERY: tl.constexpr):
    """exp2 of the scores against the running maxima: one FFMA and one MUFU per score, but one
    score in EXP2_EVERY (2, 4; 0: none) computed on the FMA pipe (exp2_split.py)."""
    return exp2_split(s * unit - (finite(m_i) * unit)[:, None], EXP2_EVERY)


@triton.jit
def softmax_scores(qk, bias, scale, softcap, HAS_RPB: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                   FOLD_SCALE: tl.constexpr):
    """The scores the online softmax runs on: raw dot products under FOLD_SCALE, else the
    log2-domain scores of finish_scores."""
    if FOLD_SCALE:
        s = qk
    else:
        s, _ = finish_scores(qk, bias, scale, softcap, HAS_RPB, HAS_SOFTCAP)
    return s


@triton.jit
def forward_kernel(
    Q, K, V, O, LSE, RPB, AK, AV, MT0, MT1, MT2, MT3, LIVE, KH, VH, KTH, VTH, QBOX, OBOX,
    sqb, sq0, sq1, sq2, sqh,
    skb, sk0, sk1, sk2, skh,
    svb, sv0, sv1, sv2, svh,
    sob, so0, so1, so2, soh,
    slb, sl0, sl1, sl2, slh,
    srh, sr0, sr1, sr2,
    sakb, sake, sakh, savb, save, savh,
    G, E, HEAD_D, HEAD_DV, HEADS, BATCH,
    L0, L1, L2, K0, K1, K2, S0, S1, S2, D0, D1, D2, SH0, SH1, SH2, NT0, NT1, NT2,
    scale, softcap, slive_b, slive_h, slive_t,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, WINDOW: tl.constexpr,
    TM0: tl.constexpr, TM1: tl.constexpr, TM2: tl.constexpr,
    TN0: tl.constexpr, TN1: tl.constexpr, TN2: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_D: tl.constexpr, TAIL_DV: tl.constexpr,
    HAS_RPB: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_EXTRA: tl.constexpr,
    LARGE: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr, RANK: tl.constexpr,
    LAZY_RESCALE: tl.constexpr, ANCHOR: tl.constexpr, AXIS_MASKS: tl.constexpr, FOLD_SCALE: tl.constexpr,
    EXP2_EVERY: tl.constexpr, PACK: tl.constexpr, HAS_SCORE_MOD: tl.constexpr, HAS_MASK_MOD: tl.constexpr,
    SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr, WIDE_INDEX: tl.constexpr, LIVE_STEPS: tl.constexpr,
    HOST_TMA: tl.constexpr, Q_BOX: tl.constexpr, O_BOX: tl.constexpr,
):
    BLOCK_M: tl.constexpr = TM0 * TM1 * TM2
    BLOCK_N: tl.constexpr = TN0 * TN1 * TN2
    # Head dims split in two (tiles.head_split): channels [0, BLOCK_D) and a tail
    # [BLOCK_D, BLOCK_D + TAIL_D) of their own power-of-two width, so a 160-channel head
    # multiplies 128 + 32 channels instead of 256 (TAIL_D = 0: one block, padded). The scores are
    # one accumulator (the tail's product adds into the head's); the output is two.
    TAIL_W: tl.constexpr = TAIL_DV if TAIL_DV > 0 else 16  # a placeholder accumulator's width
    if PACK == 1:
        tile_id = tl.program_id(0)
        h = tl.program_id(1)
        b = tl.program_id(2)
        pairs = 1
    else:
        # Program (tile, pair group) flattened on the grid's first axis, tiles fastest: programs
        # running side by side share a pair's keys in L2, as with one pair per program.
        tl.static_assert(not TMA and not HAS_EXTRA,
                         "packed pairs read K/V by pointer or through host descriptors, and take no additional tokens")
        tiles = D0 * NT0 * D1 * NT1 * D2 * NT2
        tile_id = tl.program_id(0) % tiles
        first_pair = (tl.program_id(0) // tiles) * PACK
        b = first_pair // HEADS
        h = first_pair % HEADS
        pairs = tl.minimum(BATCH * HEADS - first_pair, PACK)
    kvh = h // G
    g0, g1, g2, Lg0, Lg1, Lg2, xs0, xs1, xs2, x0, x1, x2, q_ok, i0, i1, i2 = tile_tokens(
        tile_id, L0, L1, L2, D0, D1, D2, NT0, NT1, NT2, TM0, TM1, TM2, LARGE)
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    q_cells = (i0 * sq0 + i1 * sq1 + i2 * sq2)[:, None] + d[None, :]
    q_mask = q_ok[:, None] & (d[None, :] < HEAD_D)
    if Q_BOX:
        # The query tile (and with O_BOX, in store_rows, the output) through host descriptors of
        # query-tile boxes (launch.HOST_QUERY_BOXES): one copy instead of a gather (a scatter).
        tl.static_assert(TAIL_D == 0, "query boxes through descriptors take one head block")
        q = load_host_box(QBOX, b, h, HEAD_D, 0, xs0, xs1, xs2, RANK, BLOCK_M, BLOCK_D)
    else:
        q = tl.load(Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + q_cells, mask=q_mask, other=0.0)
    if TAIL_D > 0:
        d_tail = BLOCK_D + tl.arange(0, TAIL_D)
        q_tail_cells = (i0 * sq0 + i1 * sq1 + i2 * sq2)[:, None] + d_tail[None, :]
        q_tail_mask = q_ok[:, None] & (d_tail[None, :] < HEAD_D)
        q_tail = tl.load(Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + q_tail_cells, mask=q_tail_mask, other=0.0)

    lo0, hi0 = key_range(x0, Lg0, K0, S0, SH0, C0, WINDOW)
    lo1, hi1 = key_range(x1, Lg1, K1, S1, SH1, C1, WINDOW)
    lo2, hi2 = key_range(x2, Lg2, K2, S2, SH2, C2, WINDOW)
    if HAS_SCORE_MOD or HAS_MASK_MOD:
        q_flat = flat_tokens(g0, g1, g2, x0, x1, x2, Lg0, Lg1, Lg2, D0, D1, D2, L1, L2, WIDE_INDEX)[:, None]
    # The walk over the union of the tile's key ranges, and their intersection (all_lo, all_hi).
    st0, nk0, all_lo0, all_hi0 = key_walk(xs0, Lg0, K0, S0, SH0, C0, WINDOW, TM0, TN0, ANCHOR)
    st1, nk1, all_lo1, all_hi1 = key_walk(xs1, Lg1, K1, S1, SH1, C1, WINDOW, TM1, TN1, ANCHOR)
    st2, nk2, all_lo2, all_hi2 = key_walk(xs2, Lg2, K2, S2, SH2, C2, WINDOW, TM2, TN2, ANCHOR)
    n_tiles = nk0 * nk1 * nk2
    if LIVE_STEPS:
        # Only the steps where mask_mod leaves a pair (live_steps.py): their count, then the list.
        tl.static_assert(PACK == 1, "packed pairs walk one list for all pairs")
        live = LIVE + b.to(tl.int64) * slive_b + h.to(tl.int64) * slive_h + tile_id.to(tl.int64) * slive_t
        n_tiles = tl.load(live)

    n0, n1, n2 = split3(tl.arange(0, BLOCK_N), TN1, TN2)
    k_base = K + b.to(tl.int64) * skb + kvh.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + kvh.to(tl.int64) * svh
    k_desc, v_desc = kv_descriptors(k_base, v_base, g0, g1, g2, sk0, sk1, sk2, skh, sv0, sv1, sv2, svh,
                                    Lg0, Lg1, Lg2, D0, D1, D2, HEAD_D, HEAD_DV, TMA, RANK, TN0, TN1, TN2,
                                    BLOCK_D, BLOCK_DV)
    k_tail_desc, v_tail_desc = kv_tail_descriptors(k_base, v_base, g0, g1, g2, sk0, sk1, sk2, skh, sv0, sv1, sv2, svh,
                                                   Lg0, Lg1, Lg2, D0, D1, D2, HEAD_D, HEAD_DV, TMA, RANK, TN0, TN1,
                                                   TN2, BLOCK_D, BLOCK_DV, TAIL_D, TAIL_DV)

    # FOLD_SCALE (scale > 0, no bias, no softcap): the scores stay raw dot products through the
    # mask and the row maxima (a positive scale keeps their order), and the scale joins the
    # maximum's subtraction in one FFMA before each exp2. Otherwise a tile's scores are first
    # multiplied (and their maxima kept) in the log2 domain: one FMUL a score more, a sixteenth
    # of the loop's instructions on a 64 x 64 tile.
    if FOLD_SCALE:
        unit = scale * LOG2E
    else:
        unit = 1.0
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    acc_tail = tl.zeros([BLOCK_M, TAIL_W], tl.float32)
    j0, j1, j2 = tl.zeros((), tl.int32), tl.zeros((), tl.int32), tl.zeros((), tl.int32)
    finished = tl.zeros((), tl.int1)  # packed: the last step ended the pair before (b, h)
    full_step = tl.zeros((), tl.int1)  # from the live-step list: mask_mod keeps every pair here
    for _step in range(0, pairs * n_tiles):
        if PACK > 1:
            # The pair's queries again at every step: a pipelined load (mostly from L1/L2) keeps the
            # loop free of a load that waits, where a load at each pair's first step would wait.
            if Q_BOX:
                q = load_host_box(QBOX, b, h, HEAD_D, 0, xs0, xs1, xs2, RANK, BLOCK_M, BLOCK_D)
            else:
                q = tl.load(Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + q_cells, mask=q_mask, other=0.0)
            k_base = K + b.to(tl.int64) * skb + kvh.to(tl.int64) * skh
            v_base = V + b.to(tl.int64) * svb + kvh.to(tl.int64) * svh
            k_desc, v_desc = k_base, v_base
            if TAIL_D > 0:
                q_tail = tl.load(Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + q_tail_cells, mask=q_tail_mask,
                                 other=0.0)
                k_tail_desc = k_base + BLOCK_D
            if TAIL_DV > 0:
                v_tail_desc = v_base + BLOCK_DV
        if LIVE_STEPS:
            j0, j1, j2, full_step = list_step(live, _step, nk1, nk2)
        ys0, ys1, ys2 = st0 + j0 * TN0, st1 + j1 * TN1, st2 + j2 * TN2
        y0, y1, y2 = ys0 + n0, ys1 + n1, ys2 + n2
        kt = load_streamed_tile(KH, b, kvh, HEAD_D, 0, k_desc, k_base, sk0, sk1, sk2, ys0, ys1, ys2, y0, y1, y2, g0,
                                g1, g2, D0, D1, D2, Lg0, Lg1, Lg2, HEAD_D, HOST_TMA, TMA, LARGE, RANK, BLOCK_N,
                                BLOCK_D)
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
            s, _, _ = modded_scores(qk, bias, scale, softcap, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, HAS_RPB,
                                    HAS_SOFTCAP, SCORE_MOD, SCORE_MOD, False)
        else:
            s = softmax_scores(qk, bias, scale, softcap, HAS_RPB, HAS_SOFTCAP, FOLD_SCALE)
        s = mask_pairs(s, float("-inf"), lo0, hi0, lo1, hi1, lo2, hi2, y0, y1, y2,
                       crosses(ys0, TN0, all_lo0, all_hi0), crosses(ys1, TN1, all_lo1, all_hi1),
                       crosses(ys2, TN2, all_lo2, all_hi2), True, RANK, AXIS_MASKS)
        if HAS_MASK_MOD:
            if full_step == 0:
                s = masked_by_mod(s, float("-inf"), b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, MASK_MOD)
        if PACK > 1:
            # The pair the last step finished goes out here, where the rescale below reads the
            # accumulator anyway: read right after its last product was issued, the branch would
            # make ptxas serialise every wgmma of the loop (backend-cuda.md, "Keeping wgmma
            # asynchronous").
            if finished:
                b_out, h_out = previous_pair(b, h, HEADS)
                store_rows(O, LSE, OBOX, sob, so0, so1, so2, soh, slb, sl0, sl1, sl2, slh, b_out, h_out, i0, i1, i2,
                           xs0, xs1, xs2, dv, q_ok, acc, acc_tail, m_i, l_i, unit, HEAD_DV, BLOCK_DV, TAIL_DV, O_BOX,
                           RANK, TM0, TM1, TM2)
                m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
                l_i = tl.zeros([BLOCK_M], tl.float32)
                acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
                if TAIL_DV > 0:
                    acc_tail = tl.zeros([BLOCK_M, TAIL_W], tl.float32)
        m_i, l_i, acc, acc_tail = online_softmax_rescale(s, m_i, l_i, acc, acc_tail, unit, LAZY_RESCALE, TAIL_DV > 0)
        p = probabilities(s, m_i, unit, EXP2_EVERY)
        l_i += tl.sum(p, 1)
        vt = load_streamed_tile(VH, b, kvh, HEAD_DV, 0, v_desc, v_base, sv0, sv1, sv2, ys0, ys1, ys2, y0, y1, y2, g0,
                                g1, g2, D0, D1, D2, Lg0, Lg1, Lg2, HEAD_DV, HOST_TMA, TMA, LARGE, RANK, BLOCK_N,
                                BLOCK_DV)
        acc = mma(p.to(vt.dtype), vt, acc, PRECISION)
        if TAIL_DV > 0:
            vt_tail = load_streamed_tile(VTH, b, kvh, HEAD_DV, BLOCK_DV, v_tail_desc, v_base + BLOCK_DV, sv0, sv1,
                                         sv2, ys0, ys1, ys2, y0, y1, y2, g0, g1, g2, D0, D1, D2, Lg0, Lg1, Lg2,
                                         HEAD_DV - BLOCK_DV, HOST_TMA, TMA, LARGE, RANK, BLOCK_N, TAIL_DV)
            acc_tail = mma(p.to(vt_tail.dtype), vt_tail, acc_tail, PRECISION)
        j0, j1, j2 = next3(j0, j1, j2, nk1, nk2)
        if PACK > 1:
            # The cursor moves without a branch: the pipeliner issues later steps' loads ahead,
            # which it can only where their addresses do not wait for a branch.
            finished = j0 == nk0
            j0 = tl.where(finished, 0, j0)
            h += finished.to(tl.int32)
            wrapped = h == HEADS
            b += wrapped.to(tl.int32)
            h = tl.where(wrapped, 0, h)
            kvh = h // G

    if HAS_EXTRA:
        tl.static_assert(TAIL_D == 0 and TAIL_DV == 0, "additional tokens take one padded head block")
        e_off = tl.arange(0, BLOCK_N)
        ak_base = AK + b.to(tl.int64) * sakb + kvh.to(tl.int64) * sakh
        av_base = AV + b.to(tl.int64) * savb + kvh.to(tl.int64) * savh
        for e0 in range(0, E, BLOCK_N):
            e = e0 + e_off
            e_ok = e < E
            kt = tl.load(ak_base + e[:, None] * sake + d[None, :], mask=e_ok[:, None] & (d[None, :] < HEAD_D), other=0.0)
            qk = mma(q, tl.trans(kt), None, PRECISION)
            if HAS_SCORE_MOD or HAS_MASK_MOD:
                kv_flat = extra_tokens(e, E, L0, L1, L2, WIDE_INDEX)[None, :]
            if HAS_SCORE_MOD:
                s, _, _ = modded_scores(qk, 0.0, scale, softcap, b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, False,
                                        HAS_SOFTCAP, SCORE_MOD, SCORE_MOD, False)
            else:
                s = softmax_scores(qk, 0.0, scale, softcap, False, HAS_SOFTCAP, FOLD_SCALE)
            s = tl.where(e_ok[None, :], s, float("-inf"))
            if HAS_MASK_MOD:
                s = masked_by_mod(s, float("-inf"), b, h, q_flat, kv_flat, MT0, MT1, MT2, MT3, MASK_MOD)
            m_i, l_i, acc, acc_tail = online_softmax_rescale(s, m_i, l_i, acc, acc_tail, unit, LAZY_RESCALE, False)
            p = probabilities(s, m_i, unit, EXP2_EVERY)
            l_i += tl.sum(p, 1)
            vt = tl.load(av_base + e[:, None] * save + dv[None, :], mask=e_ok[:, None] & (dv[None, :] < HEAD_DV), other=0.0)
            acc = mma(p.to(vt.dtype), vt, acc, PRECISION)

    # The last pair (the only one without PACK; packed, the cursor has moved past it).
    b_out, h_out = b, h
    if PACK > 1:
        b_out, h_out = previous_pair(b, h, HEADS)
    store_rows(O, LSE, OBOX, sob, so0, so1, so2, soh, slb, sl0, sl1, sl2, slh, b_out, h_out, i0, i1, i2, xs0, xs1, xs2,
               dv, q_ok, acc, acc_tail, m_i, l_i, unit, HEAD_DV, BLOCK_DV, TAIL_DV, O_BOX, RANK, TM0, TM1, TM2)


@triton.jit
def previous_pair(b, h, HEADS):
    """The (batch, head) pair before (b, h) in batch-major order. (Packed programs find the pair
    they finished this way: a copy of the cursor taken before it moves would be the value the
    loop started with, which Triton's front end then does not carry through the loop.)"""
    first_head = h == 0
    return b - first_head.to(tl.int32), tl.where(first_head, HEADS - 1, h - 1)


@triton.jit
def store_rows(O, LSE, OBOX, sob, so0, so1, so2, soh, slb, sl0, sl1, sl2, slh, b, h, i0, i1, i2, xs0, xs1, xs2, dv,
               q_ok, acc, acc_tail, m_i, l_i, unit, HEAD_DV, BLOCK_DV: tl.constexpr, TAIL_DV: tl.constexpr,
               O_BOX: tl.constexpr, RANK: tl.constexpr, TM0: tl.constexpr, TM1: tl.constexpr, TM2: tl.constexpr):
    """Normalise the accumulated rows of (batch b, head h) (channels ``dv``, and with TAIL_DV the
    tail's after them) and store them and their LSE; rows that saw no key get zeros and an LSE of
    -inf. With O_BOX the output goes out as one box copy (first token (xs0, xs1, xs2)) through
    the host descriptor ``OBOX``."""
    empty = l_i == 0.0
    denominator = tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i * unit + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
    out = acc / denominator
    o_rows = b.to(tl.int64) * sob + h.to(tl.int64) * soh + i0 * so0 + i1 * so1 + i2 * so2
    if O_BOX:
        tl.static_assert(TAIL_DV == 0, "output boxes through descriptors take one head block")
        store_host_box(OBOX, b, h, HEAD_DV, 0, xs0, xs1, xs2, out.to(O.dtype.element_ty), RANK, TM0, TM1, TM2,
                       BLOCK_DV)
    else:
        tl.store(O + o_rows[:, None] + dv[None, :], out.to(O.dtype.element_ty),
                 mask=q_ok[:, None] & (dv[None, :] < HEAD_DV))
    if TAIL_DV > 0:
        dv_tail = BLOCK_DV + tl.arange(0, TAIL_DV)
        out_tail = acc_tail / denominator
        tl.store(O + o_rows[:, None] + dv_tail[None, :], out_tail.to(O.dtype.element_ty),
                 mask=q_ok[:, None] & (dv_tail[None, :] < HEAD_DV))
    l_rows = b.to(tl.int64) * slb + h.to(tl.int64) * slh + i0 * sl0 + i1 * sl1 + i2 * sl2
    tl.store(LSE + l_rows, lse, mask=q_ok)
