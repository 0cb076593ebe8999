"""The Gluon forward with the split walk (gluon_split_walk.py): each consumer warpgroup computes
only the key tiles its own half of the query box sees.

The structure is gluon_forward_kernel.py's (a producer warp feeding a ring of K/V slots by TMA,
two consumer warpgroups of 64 queries, the softmax of one tile under the tensor cores' work on
the previous one), over a stream of the walk in two phases: the halves' exclusive tiles first,
alternating, each computed by its owner at once while the other consumer only waits for it to
land and releases it; then the shared tiles, pipelined. gluon_forward_kernel.py keeps the whole
walk (both consumers on every tile), faster where the split computes no fewer pairs
(tiles.gluon_forward_boxes weighs both; gluon_forward_launch.py launches either). Pipelining the
exclusive tiles too was measured on the H100 and gained nothing (RESULTS.md, "The split walk and
dilated problems on the Gluon forward"): they are too few per walk.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .gluon_forward_kernel import (_half_origin, _last_product, _load_tile, _masked, _pipelined_step,
                                   _program_walk, _rows_and_keys, _softmax_step, _store_rows)
from .gluon_ring import accumulator_layout, allocate_ring, probabilities_layout
from .gluon_split_walk import exclusive_coords, exclusive_tile, pick3, split_stream, stream_coords, with3
from .index_math import next3


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty,
              b, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2, q_col, kv_col, exclusive0, exclusive1, own0, shared_lo,
              shared, own1_lo, own1, STAGES: gl.constexpr, SPLIT: gl.constexpr):
    """The producer warp: both query halves, then the stream's K/V tiles (exclusive, then shared;
    gluon_split_walk.stream_coords) into the ring, each slot once both consumers released it."""
    TK0: gl.constexpr = k_desc.block_type.shape[1]
    TK1: gl.constexpr = k_desc.block_type.shape[2]
    TK2: gl.constexpr = k_desc.block_type.shape[3]
    for half in gl.static_range(2):
        hx0, hx1, hx2 = _half_origin(xs0, xs1, xs2, half, SPLIT, q_desc.block_type.shape[1],
                                     q_desc.block_type.shape[2], q_desc.block_type.shape[3])
        mbarrier.expect(q_ready.index(half), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, hx0, hx1, hx2, q_col], q_ready.index(half), q_smem.index(half))
    r0, r1, r2 = with3(n0, n1, n2, SPLIT, 1)
    for i in range(exclusive0 + exclusive1 + shared * r0 * r1 * r2):
        j0, j1, j2 = stream_coords(i, exclusive0, exclusive1, own0, shared_lo, shared, own1_lo, own1, n0, n1, n2,
                                   SPLIT)
        _load_tile(k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, i,
                   [b, st0 + j0 * TK0, st1 + j1 * TK1, st2 + j2 * TK2, kv_col], STAGES)


@gluon.jit
def _exclusive_tiles(q, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, acc, m_i, l_i, rlo0, rhi0, rlo1, rhi1,
                     rlo2, rhi2, lo0, hi0, lo1, hi1, lo2, hi2, st0, st1, st2, n0, n1, n2, exclusive0, exclusive1,
                     own0, own1_lo, own1, qk_scale, RANK: gl.constexpr, STAGES: gl.constexpr, TK0: gl.constexpr,
                     TK1: gl.constexpr, TK2: gl.constexpr, HALF: gl.constexpr, SPLIT: gl.constexpr,
                     s_layout: gl.constexpr, p_layout: gl.constexpr, o_rows: gl.constexpr,
                     EXP2_EVERY: gl.constexpr):
    """The split walk's first phase (gluon_split_walk.py): this consumer computes its own tiles
    at once, without the software pipeline, and releases the other half's as they land."""
    BN: gl.constexpr = TK0 * TK1 * TK2
    BM: gl.constexpr = q.shape[0]
    D: gl.constexpr = q.shape[1]
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    for t in range(exclusive0 + exclusive1):
        owner, index = exclusive_tile(t, exclusive0, exclusive1)
        slot = t % STAGES
        phase = (t // STAGES) & 1
        mbarrier.wait(k_ready.index(slot), phase)
        if owner == HALF:
            j0, j1, j2 = exclusive_coords(owner, index, own0, own1_lo, own1, n0, n1, n2, SPLIT)
            s = warpgroup_mma(q, k_bufs.index(slot).reshape([BN, D]).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
            s = warpgroup_mma_wait(0, deps=(s, ))
            mbarrier.arrive(k_empty.index(slot), count=1)
            s = _masked(s, float("-inf"), rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, st0 + j0 * TK0, st1 + j1 * TK1,
                        st2 + j2 * TK2, lo0, hi0, lo1, hi1, lo2, hi2, TK0, TK1, TK2, RANK, s_layout)
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, EXP2_EVERY)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
            p16 = gl.convert_layout(p.to(q.dtype), p_layout)
            mbarrier.wait(v_ready.index(slot), phase)
            acc = warpgroup_mma(p16, v_bufs.index(slot).reshape([BN, D]), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc, p16))[0]
        else:
            mbarrier.arrive(k_empty.index(slot), count=1)
            mbarrier.wait(v_ready.index(slot), phase)
        mbarrier.arrive(v_empty.index(slot), count=1)
    return acc, m_i, l_i


@gluon.jit
def _shared_tiles(q, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, acc, m_i, l_i, rlo0, rhi0, rlo1, rhi1,
                  rlo2, rhi2, lo0, hi0, lo1, hi1, lo2, hi2, st0, st1, st2, n0, n1, n2, first, shared_lo, shared,
                  qk_scale, RANK: gl.constexpr, STAGES: gl.constexpr, TK0: gl.constexpr, TK1: gl.constexpr,
                  TK2: gl.constexpr, SPLIT: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
                  o_rows: gl.constexpr, EXP2_EVERY: gl.constexpr):
    """The tiles both halves compute (stream positions from ``first``; at least one), pipelined:
    the first tile's scores and softmax before the loop; each step then issues tile i's S, tile
    i-1's O += P V, and runs tile i's softmax while the latter is on the tensor cores."""
    BN: gl.constexpr = TK0 * TK1 * TK2
    BM: gl.constexpr = q.shape[0]
    D: gl.constexpr = q.shape[1]
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    # the shared rows' box of the walk (the cut axis' shared rows times the other axes' steps),
    # walked row-major by a cursor from its origin
    e0, e1, e2 = with3(n0, n1, n2, SPLIT, shared)
    o0, o1, o2 = with3(st0, st1, st2, SPLIT, pick3(st0, st1, st2, SPLIT) + shared_lo * pick3(TK0, TK1, TK2, SPLIT))
    count = e0 * e1 * e2
    slot = first % STAGES
    mbarrier.wait(k_ready.index(slot), (first // STAGES) & 1)
    s = warpgroup_mma(q, k_bufs.index(slot).reshape([BN, D]).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    mbarrier.arrive(k_empty.index(slot), count=1)
    s = _masked(s, float("-inf"), rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, o0, o1, o2, lo0, hi0, lo1, hi1, lo2, hi2,
                TK0, TK1, TK2, RANK, s_layout)
    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, EXP2_EVERY)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
    p16 = gl.convert_layout(p.to(q.dtype), p_layout)
    j0, j1, j2 = next3(gl.to_tensor(0), gl.to_tensor(0), gl.to_tensor(0), e1, e2)
    for i in range(first + 1, first + count):
        p16, acc, m_i, l_i = _pipelined_step(q, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, acc, p16, m_i,
                                             l_i, i, s_zero, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1, hi1,
                                             lo2, hi2, o0 + j0 * TK0, o1 + j1 * TK1, o2 + j2 * TK2, qk_scale, RANK,
                                             STAGES, TK0, TK1, TK2, s_layout, p_layout, o_rows, True,
                                             EXP2_EVERY)
        j0, j1, j2 = next3(j0, j1, j2, e1, e2)
    return _last_product(p16, v_bufs, v_ready, v_empty, acc, first + count - 1, STAGES), m_i, l_i


@gluon.jit
def _consumer(o_desc, LSE, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty, b, h, q_col,
              slb, sl0, sl1, sl2, slh, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, xs0, xs1, xs2, st0, st1, st2,
              n0, n1, n2, exclusive0, exclusive1, own0, shared_lo, shared, own1_lo, own1, qk_scale,
              C0: gl.constexpr, C1: gl.constexpr, C2: gl.constexpr, WINDOW: gl.constexpr, RANK: gl.constexpr,
              STAGES: gl.constexpr, TK0: gl.constexpr, TK1: gl.constexpr, TK2: gl.constexpr, HALF: gl.constexpr,
              SPLIT: gl.constexpr, EXP2_EVERY: gl.constexpr):
    """Consumer warpgroup HALF: its 64 queries over its own exclusive tiles, then the shared ones;
    the output and LSE of its rows."""
    TQ0: gl.constexpr = o_desc.block_type.shape[1]
    TQ1: gl.constexpr = o_desc.block_type.shape[2]
    TQ2: gl.constexpr = o_desc.block_type.shape[3]
    D: gl.constexpr = o_desc.block_type.shape[4]
    BM: gl.constexpr = TQ0 * TQ1 * TQ2
    BN: gl.constexpr = TK0 * TK1 * TK2
    s_layout: gl.constexpr = accumulator_layout(BN)
    o_layout: gl.constexpr = accumulator_layout(D)
    p_layout: gl.constexpr = probabilities_layout(o_layout)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    xs0, xs1, xs2 = _half_origin(xs0, xs1, xs2, HALF, SPLIT, TQ0, TQ1, TQ2)
    x0, x1, x2, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1, hi1, lo2, hi2 = _rows_and_keys(
        xs0, xs1, xs2, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, C0, C1, C2, WINDOW, TQ0, TQ1, TQ2, TK0, TK1,
        TK2, s_rows)
    q_box = q_smem.index(HALF)
    q = q_box.reshape([BM, D])
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=s_rows)
    l_i = gl.zeros([BM], gl.float32, layout=s_rows)
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)
    mbarrier.wait(q_ready.index(HALF), 0)

    acc, m_i, l_i = _exclusive_tiles(q, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, acc, m_i, l_i,
                                     rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1, hi1, lo2, hi2, st0, st1, st2,
                                     n0, n1, n2, exclusive0, exclusive1, own0, own1_lo, own1, qk_scale, RANK, STAGES,
                                     TK0, TK1, TK2, HALF, SPLIT, s_layout, p_layout, o_rows, EXP2_EVERY)
    if shared > 0:
        acc, m_i, l_i = _shared_tiles(q, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, acc, m_i, l_i,
                                      rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1, hi1, lo2, hi2, st0, st1, st2,
                                      n0, n1, n2, exclusive0 + exclusive1, shared_lo, shared, qk_scale, RANK, STAGES,
                                      TK0, TK1, TK2, SPLIT, s_layout, p_layout, o_rows, EXP2_EVERY)

    # (a half past the grid's end sees no key: zeros and an LSE of -inf)
    _store_rows(o_desc, LSE, q_box, acc, m_i, l_i, x0, x1, x2, L0, L1, L2, xs0, xs1, xs2, b, h, q_col, slb, sl0, sl1,
                sl2, slh, o_rows)


@gluon.jit
def gluon_split_walk_kernel(q_desc, k_desc, v_desc, o_desc, LSE, slb, sl0, sl1, sl2, slh, L0, L1, L2, K0, K1, K2,
                            S0, S1, S2, F0, F1, F2, NT1, NT2, GROUP, qk_scale, BOXES, HEADS,
                            C0: gl.constexpr, C1: gl.constexpr, C2: gl.constexpr, WINDOW: gl.constexpr,
                            RANK: gl.constexpr, STAGES: gl.constexpr, SPLIT: gl.constexpr, SPLIT_CAUSAL: gl.constexpr,
                            EXP2_EVERY: gl.constexpr, PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """One program: work item ``program_id(0)`` (in the whole walk's order: one query box of one
    (batch, head)), cut into two parts of 64 queries (one consumer warpgroup each) along
    axis SPLIT (causal: SPLIT_CAUSAL), each computing only the key tiles its queries see
    (gluon_split_walk.py); one producer warp. Per axis: lengths L, windows K, strides S, shifts F;
    NT1, NT2 query boxes along axes 1, 2 (``BOXES`` in all, a head of ``HEADS``). Not persistent:
    its third ring slot leaves no room for a second box's queries."""
    b, h, q_col, kv_col, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2 = _program_walk(
        q_desc, k_desc, gl.program_id(0), BOXES, HEADS, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, NT1, NT2,
        GROUP, C0, C1, C2, WINDOW, SPLIT)
    TK0: gl.constexpr = k_desc.block_type.shape[1]
    TK1: gl.constexpr = k_desc.block_type.shape[2]
    TK2: gl.constexpr = k_desc.block_type.shape[3]
    exclusive0, exclusive1, own0, shared_lo, shared, own1_lo, own1 = split_stream(
        xs0, xs1, xs2, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, st0, st1, st2, n0, n1, n2,
        pick3(q_desc.block_type.shape[1], q_desc.block_type.shape[2], q_desc.block_type.shape[3], SPLIT),
        pick3(TK0, TK1, TK2, SPLIT), SPLIT_CAUSAL, WINDOW, SPLIT, True)

    q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty = allocate_ring(
        q_desc, k_desc, v_desc, 2, STAGES, 1)

    # (tuples spelt out: adding tuples in a kernel drops the constexpr wrappers workers need)
    gl.warp_specialize([
        (_consumer, (o_desc, LSE, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty, b, h, q_col,
                     slb, sl0, sl1, sl2, slh, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, xs0, xs1, xs2,
                     st0, st1, st2, n0, n1, n2, exclusive0, exclusive1, own0, shared_lo, shared, own1_lo, own1,
                     qk_scale, C0, C1, C2, WINDOW, RANK, STAGES, TK0, TK1, TK2, 0, SPLIT, EXP2_EVERY)),
        (_consumer, (o_desc, LSE, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty, b, h, q_col,
                     slb, sl0, sl1, sl2, slh, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, xs0, xs1, xs2,
                     st0, st1, st2, n0, n1, n2, exclusive0, exclusive1, own0, shared_lo, shared, own1_lo, own1,
                     qk_scale, C0, C1, C2, WINDOW, RANK, STAGES, TK0, TK1, TK2, 1, SPLIT, EXP2_EVERY)),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty,
                     b, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2, q_col, kv_col, exclusive0, exclusive1, own0,
                     shared_lo, shared, own1_lo, own1, STAGES, SPLIT)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
