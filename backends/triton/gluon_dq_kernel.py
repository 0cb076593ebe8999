"""The backward's dQ pass on Hopper in Gluon: the Gluon forward's boxes, walk and warp roles
(gluon_forward_kernel.py) with the Triton dQ kernel's arithmetic (backward_kernels.dq_kernel).

A program walks query boxes of 128 queries (the forward's whole walk: both consumers' halves of a
box share its key walk and every K/V tile of the ring), one box or, on a persistent grid, its row
of the host's schedule (gluon_schedule.py):

* one producer warp issues each box's query and dO halves (one query slot a consumer; the next
  box's once the consumer has stored this one's dQ through it) and the walk's K and V tiles into
  a ring of ``STAGES`` slots, which runs on from box to box;
* each consumer warpgroup (64 queries) starts a box with its rows' statistics: lse * log2 e from
  the forward's LSE and delta = rowsum(dO * O) - dLSE, stored in the statistics rows the dK/dV
  pass reads (as dq_kernel's own_row_stats does);
* per key tile: the previous tile's dQ += dS K issued (dS from registers), then S = Q K^T and
  dP = dO V^T, which run behind it; once S and that product are done the previous tile's K slot
  is released, P = exp2(S * scale * log2 e - lse2) formed and masked by the window (P zeroed
  after, or S set to -inf before: EXP_FIRST); once dP is done its V slot is released and dS =
  P (dP - delta) kept for the next step's product;
* dQ * scale leaves through the consumer's query slot and a TMA store.

The walk, key ranges and partial tiles' masks are the forward's (index_math, scores.mask_pairs):
the pairs computed are those of the forward's boxes, on GLUON_DQ_KEYS-key tiles
(tiles.gluon_dq_boxes). gluon_dq_launch.py says which calls take it.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .gluon_forward_kernel import _CONSUMERS, _box_count, _box_walk, _consumer_box, _half_origin, _load_walk, _masked
from .gluon_ring import accumulator_layout, allocate_ring, probabilities_layout
from .index_math import next3, split3
from .scores import LOG2E


@gluon.jit
def _producer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty,
              v_ready, v_empty, SCHEDULE, SCHEDULE_STRIDE, BOXES, HEADS, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1,
              F2, NT1, NT2, GROUP, C0: gl.constexpr, C1: gl.constexpr, C2: gl.constexpr, WINDOW: gl.constexpr,
              STAGES: gl.constexpr, SPLIT: gl.constexpr, PERSISTENT: gl.constexpr):
    """The producer warp, over this program's boxes: each box's query and dO halves into the
    consumers' slots (once each has stored the dQ of the box before), then its walk's K/V tiles
    into the ring, whose position runs on across boxes."""
    half_bytes: gl.constexpr = q_desc.block_type.nbytes + do_desc.block_type.nbytes
    position = gl.to_tensor(0)
    for boxes_done in range(_box_count(SCHEDULE, SCHEDULE_STRIDE, PERSISTENT)):
        b, h, q_col, kv_col, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2 = _box_walk(
            q_desc, k_desc, SCHEDULE, SCHEDULE_STRIDE, boxes_done, PERSISTENT, BOXES, HEADS, L0, L1, L2, K0, K1, K2,
            S0, S1, S2, F0, F1, F2, NT1, NT2, GROUP, C0, C1, C2, WINDOW, SPLIT)
        # mbarriers start with phase 1 complete: a slot's first use does not wait
        free_phase = (boxes_done & 1) ^ 1
        for half in gl.static_range(_CONSUMERS):
            hx0, hx1, hx2 = _half_origin(xs0, xs1, xs2, half, SPLIT, q_desc.block_type.shape[1],
                                         q_desc.block_type.shape[2], q_desc.block_type.shape[3])
            mbarrier.wait(q_empty.index(half), free_phase)
            mbarrier.expect(q_ready.index(half), half_bytes)
            tma.async_copy_global_to_shared(q_desc, [b, hx0, hx1, hx2, q_col], q_ready.index(half),
                                            q_smem.index(half))
            tma.async_copy_global_to_shared(do_desc, [b, hx0, hx1, hx2, q_col], q_ready.index(half),
                                            do_smem.index(half))
        position = _load_walk(k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, position, b,
                              kv_col, st0, st1, st2, n0, n1, n2, STAGES)


@gluon.jit
def _row_statistics(do_box, O, LSE, DLSE, STATS, b, h, xs0, xs1, xs2, L0, L1, L2, sob, so0, so1, so2, soh, slb, sl0,
                    sl1, sl2, slh, stb, st0, st1, st2, sth, HAS_DLSE: gl.constexpr, TQ1: gl.constexpr,
                    TQ2: gl.constexpr, s_rows: gl.constexpr):
    """A consumer's rows' (lse2, delta) in the scores' row layout: lse2 = lse * log2 e, +inf for
    rows outside the grid and rows that saw no key (their P is then 0, never NaN); delta =
    rowsum(dO * O) - dLSE. Both are also stored as the statistics rows ``[lse * log2 e, delta,
    0, 0]`` of the dK/dV pass (dq_kernel's own_row_stats writes the same)."""
    BM: gl.constexpr = do_box.shape[1] * do_box.shape[2] * do_box.shape[3]
    D: gl.constexpr = do_box.shape[4]
    # 16-byte pieces of a row a thread: each warp reads whole rows of O
    tile: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // D, D // 8], [4, 1], [1, 0])
    rows: gl.constexpr = gl.SliceLayout(1, tile)
    m0, m1, m2 = split3(gl.arange(0, BM, layout=rows), TQ1, TQ2)
    x0, x1, x2 = xs0 + m0, xs1 + m1, xs2 + m2
    inside = (x0 < L0) & (x1 < L1) & (x2 < L2)
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, tile))
    o_rows = b * sob + x0 * so0 + x1 * so1 + x2 * so2 + h * soh
    o = gl.load(O + gl.expand_dims(o_rows, 1) + gl.expand_dims(cols, 0), mask=gl.expand_dims(inside, 1), other=0.0)
    do = do_box.reshape([BM, D]).load(tile)
    delta = gl.sum(o.to(gl.float32) * do.to(gl.float32), 1)
    l_rows = b * slb + x0 * sl0 + x1 * sl1 + x2 * sl2 + h * slh
    if HAS_DLSE:
        delta -= gl.load(DLSE + l_rows, mask=inside, other=0.0)
    lse2 = gl.load(LSE + l_rows, mask=inside, other=0.0) * LOG2E
    st_rows = b * stb + x0 * st0 + x1 * st1 + x2 * st2 + h * sth
    which = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, tile)), 0)
    stats = gl.where(which == 0, gl.expand_dims(lse2, 1), gl.where(which == 1, gl.expand_dims(delta, 1), 0.0))
    gl.store(STATS + gl.expand_dims(st_rows, 1) + which, stats, mask=gl.expand_dims(inside, 1) & (which < 4))
    lse2 = gl.where(inside & (lse2 != float("-inf")), lse2, float("inf"))
    return gl.convert_layout(lse2, s_rows), gl.convert_layout(delta, s_rows)


@gluon.jit
def _dq_step(q, do, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, dq, ds16, lse2, delta, i, s_zero, rlo0, rhi0,
             rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1, hi1, lo2, hi2, ys0, ys1, ys2, qk_scale, RANK: gl.constexpr,
             STAGES: gl.constexpr, TK0: gl.constexpr, TK1: gl.constexpr, TK2: gl.constexpr, s_layout: gl.constexpr,
             p_layout: gl.constexpr, FIRST: gl.constexpr, EXP_FIRST: gl.constexpr):
    """Step ``i`` of the ring (the key tile at ``ys``): the previous step's dQ += dS K issued
    (unless this is a box's FIRST step), then this tile's S and dP, which run behind it; once
    S and that product are done, the previous K slot is released and P is formed under dP; then
    dS. Returns (dq, dS of this tile as the next product's operand)."""
    BN: gl.constexpr = TK0 * TK1 * TK2
    D: gl.constexpr = q.shape[1]
    slot = i % STAGES
    prev = (i - 1) % STAGES
    phase = (i // STAGES) & 1
    mbarrier.wait(k_ready.index(slot), phase)
    if not FIRST:
        dq = warpgroup_mma(ds16, k_bufs.index(prev).reshape([BN, D]), dq, is_async=True)
    s = warpgroup_mma(q, k_bufs.index(slot).reshape([BN, D]).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(slot), phase)
    dp = warpgroup_mma(do, v_bufs.index(slot).reshape([BN, D]).permute((1, 0)), s_zero, use_acc=False,
                       is_async=True)
    if FIRST:
        s = warpgroup_mma_wait(1, deps=(s, ))
    else:
        s, dq, ds16 = warpgroup_mma_wait(1, deps=(s, dq, ds16))
        mbarrier.arrive(k_empty.index(prev), count=1)
    # EXP_FIRST: P formed first and zeroed outside the windows after. With S masked first, ptxas
    # places the wait for dP at the top of the block after the mask's branch, before all but one
    # of the tile's exp2s (tiles.GLUON_DQ_EXP_FIRST_MAX_RANK says where each order won). Scores
    # outside a window may overflow exp2 to inf: the mask selects 0 there, never multiplies.
    # lse2 is +inf where a row has no key or lies outside the grid: P is 0 there, never NaN.
    if EXP_FIRST:
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 1))
        p = _masked(p, 0.0, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, ys0, ys1, ys2, lo0, hi0, lo1, hi1, lo2, hi2, TK0,
                    TK1, TK2, RANK, s_layout)
    else:
        s = _masked(s, float("-inf"), rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, ys0, ys1, ys2, lo0, hi0, lo1, hi1, lo2,
                    hi2, TK0, TK1, TK2, RANK, s_layout)
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 1))
    dp = warpgroup_mma_wait(0, deps=(dp, ))
    mbarrier.arrive(v_empty.index(slot), count=1)
    ds16 = gl.convert_layout((p * (dp - gl.expand_dims(delta, 1))).to(q.dtype), p_layout)
    return dq, ds16


@gluon.jit
def _last_dq_product(ds16, k_bufs, k_empty, dq, i, STAGES: gl.constexpr):
    """dQ += dS K of step ``i``, a box's last, waited for; its K slot released."""
    BN: gl.constexpr = ds16.shape[1]
    D: gl.constexpr = dq.shape[1]
    last = i % STAGES
    dq = warpgroup_mma(ds16, k_bufs.index(last).reshape([BN, D]), dq, is_async=True)
    dq = warpgroup_mma_wait(0, deps=(dq, ds16))[0]
    mbarrier.arrive(k_empty.index(last), count=1)
    return dq


@gluon.jit
def _consumer(dq_desc, O, LSE, DLSE, STATS, q_smem, do_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty,
              v_ready, v_empty, q_desc, k_desc, sob, so0, so1, so2, soh, slb, sl0, sl1, sl2, slh, stb, st0, st1, st2,
              sth, SCHEDULE, SCHEDULE_STRIDE, BOXES, HEADS, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, NT1, NT2,
              GROUP, qk_scale, scale, C0: gl.constexpr, C1: gl.constexpr, C2: gl.constexpr, WINDOW: gl.constexpr,
              RANK: gl.constexpr, STAGES: gl.constexpr, HALF: gl.constexpr, SPLIT: gl.constexpr,
              PERSISTENT: gl.constexpr, HAS_DLSE: gl.constexpr, EXP_FIRST: gl.constexpr):
    """Consumer warpgroup HALF over this program's boxes: its 64 queries' statistics, their walk's
    dQ, and its store, after which the query slot goes back to the producer."""
    TQ0: gl.constexpr = dq_desc.block_type.shape[1]
    TQ1: gl.constexpr = dq_desc.block_type.shape[2]
    TQ2: gl.constexpr = dq_desc.block_type.shape[3]
    D: gl.constexpr = dq_desc.block_type.shape[4]
    TK0: gl.constexpr = k_desc.block_type.shape[1]
    TK1: gl.constexpr = k_desc.block_type.shape[2]
    TK2: gl.constexpr = k_desc.block_type.shape[3]
    BM: gl.constexpr = TQ0 * TQ1 * TQ2
    BN: gl.constexpr = TK0 * TK1 * TK2
    s_layout: gl.constexpr = accumulator_layout(BN)
    o_layout: gl.constexpr = accumulator_layout(D)
    p_layout: gl.constexpr = probabilities_layout(o_layout)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    dtype: gl.constexpr = dq_desc.dtype
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    q = q_smem.index(HALF).reshape([BM, D])
    do = do_smem.index(HALF).reshape([BM, D])
    position = gl.to_tensor(0)
    for boxes_done in range(_box_count(SCHEDULE, SCHEDULE_STRIDE, PERSISTENT)):
        (b, h, q_col, xs0, xs1, xs2, st0_, st1_, st2_, n0, n1, n2, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1,
         hi1, lo2, hi2) = _consumer_box(q_desc, k_desc, SCHEDULE, SCHEDULE_STRIDE, boxes_done, PERSISTENT, BOXES,
                                        HEADS, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, NT1, NT2, GROUP, C0,
                                        C1, C2, WINDOW, HALF, SPLIT, s_rows)
        mbarrier.wait(q_ready.index(HALF), boxes_done & 1)
        lse2, delta = _row_statistics(do_smem.index(HALF), O, LSE, DLSE, STATS, b, h, xs0, xs1, xs2, L0, L1, L2,
                                      sob, so0, so1, so2, soh, slb, sl0, sl1, sl2, slh, stb, st0, st1, st2, sth,
                                      HAS_DLSE, TQ1, TQ2, s_rows)
        # the box's first tile, then its others, each issuing the dQ product of the one before
        dq, ds16 = _dq_step(q, do, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty,
                            gl.zeros([BM, D], gl.float32, layout=o_layout), None, lse2, delta, position, s_zero,
                            rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1, hi1, lo2, hi2, st0_, st1_, st2_,
                            qk_scale, RANK, STAGES, TK0, TK1, TK2, s_layout, p_layout, True, EXP_FIRST)
        n_tiles = n0 * n1 * n2
        j0, j1, j2 = next3(gl.to_tensor(0), gl.to_tensor(0), gl.to_tensor(0), n1, n2)
        for i in range(position + 1, position + n_tiles):
            dq, ds16 = _dq_step(q, do, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, dq, ds16, lse2, delta, i,
                                s_zero, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1, hi1, lo2, hi2,
                                st0_ + j0 * TK0, st1_ + j1 * TK1, st2_ + j2 * TK2, qk_scale, RANK, STAGES, TK0, TK1,
                                TK2, s_layout, p_layout, False, EXP_FIRST)
            j0, j1, j2 = next3(j0, j1, j2, n1, n2)
        position += n_tiles
        dq = _last_dq_product(ds16, k_bufs, k_empty, dq, position - 1, STAGES)
        # the query slot holds dQ on its way out: Q is read by no product in flight now
        q.store((dq * scale).to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dq_desc, [b, xs0, xs1, xs2, q_col], q_smem.index(HALF))
        tma.store_wait(0)
        mbarrier.arrive(q_empty.index(HALF), count=1)


@gluon.jit
def gluon_dq_kernel(q_desc, do_desc, k_desc, v_desc, dq_desc, O, LSE, DLSE, STATS, sob, so0, so1, so2, soh, slb, sl0,
                    sl1, sl2, slh, stb, st0, st1, st2, sth, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, NT1, NT2,
                    GROUP, qk_scale, scale, BOXES, HEADS, SCHEDULE, SCHEDULE_STRIDE, C0: gl.constexpr,
                    C1: gl.constexpr, C2: gl.constexpr, WINDOW: gl.constexpr, RANK: gl.constexpr,
                    STAGES: gl.constexpr, SPLIT: gl.constexpr, PERSISTENT: gl.constexpr, HAS_DLSE: gl.constexpr,
                    EXP_FIRST: gl.constexpr, PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """Programs walking work items (query boxes of one (batch, head), as gluon_forward_kernel's):
    one each, or on a PERSISTENT grid those of the program's row of ``SCHEDULE``. O, LSE, dLSE
    (read where HAS_DLSE) and the statistics rows are read and written by pointer with their
    (batch, axis 0-2, head) strides; Q, dO, K, V and dQ through the descriptors."""
    q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty = allocate_ring(
        q_desc, k_desc, v_desc, _CONSUMERS, STAGES, 1)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [_CONSUMERS] + do_desc.block_type.shape, do_desc.layout)
    q_empty = gl.allocate_shared_memory(gl.int64, [_CONSUMERS, 1], mbarrier.MBarrierLayout())
    for half in gl.static_range(_CONSUMERS):
        mbarrier.init(q_empty.index(half), count=1)

    # (tuples spelt out: adding tuples in a kernel drops the constexpr wrappers workers need)
    gl.warp_specialize([
        (_consumer, (dq_desc, O, LSE, DLSE, STATS, q_smem, do_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty,
                     v_ready, v_empty, q_desc, k_desc, sob, so0, so1, so2, soh, slb, sl0, sl1, sl2, slh, stb, st0,
                     st1, st2, sth, SCHEDULE, SCHEDULE_STRIDE, BOXES, HEADS, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0,
                     F1, F2, NT1, NT2, GROUP, qk_scale, scale, C0, C1, C2, WINDOW, RANK, STAGES, 0, SPLIT,
                     PERSISTENT, HAS_DLSE, EXP_FIRST)),
        (_consumer, (dq_desc, O, LSE, DLSE, STATS, q_smem, do_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty,
                     v_ready, v_empty, q_desc, k_desc, sob, so0, so1, so2, soh, slb, sl0, sl1, sl2, slh, stb, st0,
                     st1, st2, sth, SCHEDULE, SCHEDULE_STRIDE, BOXES, HEADS, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0,
                     F1, F2, NT1, NT2, GROUP, qk_scale, scale, C0, C1, C2, WINDOW, RANK, STAGES, 1, SPLIT,
                     PERSISTENT, HAS_DLSE, EXP_FIRST)),
        (_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready,
                     k_empty, v_ready, v_empty, SCHEDULE, SCHEDULE_STRIDE, BOXES, HEADS, L0, L1, L2, K0, K1, K2, S0,
                     S1, S2, F0, F1, F2, NT1, NT2, GROUP, C0, C1, C2, WINDOW, STAGES, SPLIT, PERSISTENT)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
