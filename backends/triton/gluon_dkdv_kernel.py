"""The dK/dV pass on Hopper in Gluon: the forward's warp-specialised structure
(gluon_forward_kernel.py) over the Triton dK/dV kernel's key-major walk (backward_kernels.py).

One program holds one key box (64 keys: wgmma's M per warpgroup) of one (batch, kv head) in shared
memory and walks the query boxes that see any of its keys (index_math.query_walk, the inverse
rule), for each of the G query heads that share the kv head, as dkdv_kernel does:

* one producer warp issues the TMA copies of each step's query box, dO box and statistics rows
  (lse * log2 e, delta: row_stats_kernel's layout, written by the dQ pass) into a ring of
  ``STAGES`` slots and hands them over with mbarriers;
* two consumer warpgroups take the steps in turn (even steps, odd steps), each with its own dK and
  dV accumulators for the same 64 keys. Giving each consumer its own steps rather than its own half
  of a 128-key box keeps the pairs computed those of the 64-key box: a larger key box would see
  more query boxes, and its halves would compute each other's. The two partial sums meet in shared
  memory once, at the end (second consumer's into a float32 scratch, first consumer adds);
* per step and consumer: S^T = K Q^T and dP^T = V dO^T (both issued before either is waited on),
  P^T = exp2(S^T * scale * log2 e - lse2), the inverse rule's mask on boxes that leave the part of
  the window every query sees, dS^T = P^T (dP^T - delta), then dV += P^T dO and dK += dS^T Q with
  P^T and dS^T as register operands;
* ``setmaxnreg`` hands the producer's registers to the consumers.

dK is scaled once at the end (the scores' scale); both gradients leave through the K and V boxes'
shared memory and a TMA store each. gluon_dkdv_launch.py says which problems take this kernel.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .gluon_ring import accumulator_layout, probabilities_layout
from .index_math import crosses, key_walk, next3, query_range, query_walk, split3
from .scores import mask_pairs

@gluon.jit
def _step_after(j0, j1, j2, head, nq0, nq1, nq2):
    """The walk's cursor one step on: the next query box of this head, or the next head's first."""
    j0, j1, j2 = next3(j0, j1, j2, nq1, nq2)
    wrap = j0 == nq0
    return gl.where(wrap, 0, j0), j1, j2, head + wrap.to(gl.int32)


@gluon.jit
def _producer(q_desc, do_desc, st_desc, k_desc, v_desc, k_smem, v_smem, q_bufs, do_bufs, st_bufs, kv_ready, ready,
              empty, b, kvh, G, ys0, ys1, ys2, qs0, qs1, qs2, nq0, nq1, nq2, STAGES: gl.constexpr):
    TM0: gl.constexpr = q_desc.block_type.shape[1]
    TM1: gl.constexpr = q_desc.block_type.shape[2]
    TM2: gl.constexpr = q_desc.block_type.shape[3]
    D: gl.constexpr = q_desc.block_type.shape[4]
    W: gl.constexpr = st_desc.block_type.shape[4]
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [b, ys0, ys1, ys2, kvh * D], kv_ready, k_smem)
    tma.async_copy_global_to_shared(v_desc, [b, ys0, ys1, ys2, kvh * D], kv_ready, v_smem)
    step_bytes: gl.constexpr = q_desc.block_type.nbytes + do_desc.block_type.nbytes + st_desc.block_type.nbytes
    j0 = gl.to_tensor(0)
    j1 = gl.to_tensor(0)
    j2 = gl.to_tensor(0)
    head = gl.to_tensor(0)
    for i in range(G * nq0 * nq1 * nq2):
        slot = i % STAGES
        # mbarriers start with phase 1 complete: the first pass over the ring does not wait
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        h = kvh * G + head
        xs0, xs1, xs2 = qs0 + j0 * TM0, qs1 + j1 * TM1, qs2 + j2 * TM2
        mbarrier.expect(ready.index(slot), step_bytes)
        tma.async_copy_global_to_shared(q_desc, [b, xs0, xs1, xs2, h * D], ready.index(slot), q_bufs.index(slot))
        tma.async_copy_global_to_shared(do_desc, [b, xs0, xs1, xs2, h * D], ready.index(slot), do_bufs.index(slot))
        tma.async_copy_global_to_shared(st_desc, [b, xs0, xs1, xs2, h * W], ready.index(slot), st_bufs.index(slot))
        j0, j1, j2, head = _step_after(j0, j1, j2, head, nq0, nq1, nq2)


@gluon.jit
def _row_statistics(st_box, BQ: gl.constexpr, W: gl.constexpr, cols: gl.constexpr):
    """(lse * log2 e, delta) of a step's query rows from its statistics box, laid out as the
    columns of S^T."""
    layout: gl.constexpr = gl.BlockedLayout([1, W], [32, 1], [4, 1], [1, 0])
    stats = st_box.reshape([BQ, W]).load(layout)
    which = gl.expand_dims(gl.arange(0, W, layout=gl.SliceLayout(0, layout)), 0)
    lse2 = gl.sum(gl.where(which == 0, stats, 0.0), 1)
    delta = gl.sum(gl.where(which == 1, stats, 0.0), 1)
    return gl.convert_layout(lse2, cols), gl.convert_layout(delta, cols)


@gluon.jit
def _masked(p_t, qlo0, qhi0, qlo1, qhi1, qlo2, qhi2, xs0, xs1, xs2, c0, c1, c2, TM1: gl.constexpr,
            TM2: gl.constexpr, RANK: gl.constexpr, cols: gl.constexpr):
    """P^T of the query box at (xs0, xs1, xs2) with 0 outside each key row's queries (ranges
    qlo/qhi per axis), on the axes ``c*`` where the box leaves the queries that see every key. The
    columns' coordinates are made here, on such boxes only: held across the loop they would take
    three registers a column."""
    if c0 | c1 | c2:
        m0, m1, m2 = split3(gl.arange(0, p_t.shape[1], layout=cols), TM1, TM2)
        # rows (keys) carry the ranges, columns (queries) the coordinates: mask_pairs' "rows are
        # queries" orientation in its own terms, as in dkdv_kernel
        p_t = mask_pairs(p_t, 0.0, qlo0, qhi0, qlo1, qhi1, qlo2, qhi2, xs0 + m0, xs1 + m1, xs2 + m2,
                         c0, c1, c2, True, RANK, True)
    return p_t


@gluon.jit
def _consumer(dk_desc, dv_desc, k_smem, v_smem, q_bufs, do_bufs, st_bufs, kv_ready, ready, empty, scratch, reduced,
              b, kvh, G, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, ys0, ys1, ys2, qs0, qs1, qs2, nq0, nq1, nq2,
              qk_scale, scale, C0: gl.constexpr, C1: gl.constexpr, C2: gl.constexpr, WINDOW: gl.constexpr,
              RANK: gl.constexpr, STAGES: gl.constexpr, TM0: gl.constexpr, TM1: gl.constexpr, TM2: gl.constexpr,
              W: gl.constexpr, HALF: gl.constexpr):
    TN0: gl.constexpr = dk_desc.block_type.shape[1]
    TN1: gl.constexpr = dk_desc.block_type.shape[2]
    TN2: gl.constexpr = dk_desc.block_type.shape[3]
    D: gl.constexpr = dk_desc.block_type.shape[4]
    BN: gl.constexpr = TN0 * TN1 * TN2
    BQ: gl.constexpr = TM0 * TM1 * TM2
    s_layout: gl.constexpr = accumulator_layout(BQ)
    o_layout: gl.constexpr = accumulator_layout(D)
    p_layout: gl.constexpr = probabilities_layout(o_layout)
    rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols: gl.constexpr = gl.SliceLayout(0, s_layout)
    dtype: gl.constexpr = dk_desc.dtype

    # each key row's queries per axis, once: the masks of the partial steps compare against them
    n0, n1, n2 = split3(gl.arange(0, BN, layout=rows), TN1, TN2)
    qlo0, qhi0 = query_range(ys0 + n0, L0, K0, S0, F0, C0, WINDOW)
    qlo1, qhi1 = query_range(ys1 + n1, L1, K1, S1, F1, C1, WINDOW)
    qlo2, qhi2 = query_range(ys2 + n2, L2, K2, S2, F2, C2, WINDOW)
    k = k_smem.reshape([BN, D])
    v = v_smem.reshape([BN, D])
    dk = gl.zeros([BN, D], gl.float32, layout=o_layout)
    dv = gl.zeros([BN, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BN, BQ], gl.float32, layout=s_layout)
    j0 = gl.to_tensor(0)
    j1 = gl.to_tensor(0)
    j2 = gl.to_tensor(0)
    head = gl.to_tensor(0)
    if HALF == 1:
        j0, j1, j2, head = _step_after(j0, j1, j2, head, nq0, nq1, nq2)
    mbarrier.wait(kv_ready, 0)

    for i in range(HALF, G * nq0 * nq1 * nq2, 2):  # the two consumers' turns
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        q = q_bufs.index(slot).reshape([BQ, D])
        do = do_bufs.index(slot).reshape([BQ, D])
        s_t = warpgroup_mma(k, q.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp_t = warpgroup_mma(v, do.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        lse2, delta = _row_statistics(st_bufs.index(slot), BQ, W, cols)
        xs0, xs1, xs2 = qs0 + j0 * TM0, qs1 + j1 * TM1, qs2 + j2 * TM2
        # the keys every query of this box sees: a box inside them on every axis needs no mask
        _, _, lo0, hi0 = key_walk(xs0, L0, K0, S0, F0, C0, WINDOW, TM0, TN0, False)
        _, _, lo1, hi1 = key_walk(xs1, L1, K1, S1, F1, C1, WINDOW, TM1, TN1, False)
        _, _, lo2, hi2 = key_walk(xs2, L2, K2, S2, F2, C2, WINDOW, TM2, TN2, False)
        c0 = crosses(ys0, TN0, lo0, hi0)
        c1 = crosses(ys1, TN1, lo1, hi1)
        c2 = crosses(ys2, TN2, lo2, hi2)
        s_t = warpgroup_mma_wait(1, deps=(s_t, ))
        # query rows outside the grid came as zeros (q, dO and statistics): their dP^T and delta
        # are 0, so they add nothing
        p_t = _masked(gl.exp2(s_t * qk_scale - gl.expand_dims(lse2, 0)), qlo0, qhi0, qlo1, qhi1, qlo2, qhi2,
                      xs0, xs1, xs2, c0, c1, c2, TM1, TM2, RANK, cols)
        dp_t = warpgroup_mma_wait(0, deps=(dp_t, ))
        ds_t = p_t * (dp_t - gl.expand_dims(delta, 0))
        p16 = gl.convert_layout(p_t.to(dtype), p_layout)
        ds16 = gl.convert_layout(ds_t.to(dtype), p_layout)
        dv = warpgroup_mma(p16, do, dv, is_async=True)
        dk = warpgroup_mma(ds16, q, dk, is_async=True)
        dv, dk, p16, ds16 = warpgroup_mma_wait(0, deps=(dv, dk, p16, ds16))
        mbarrier.arrive(empty.index(slot), count=1)
        j0, j1, j2, head = _step_after(j0, j1, j2, head, nq0, nq1, nq2)
        j0, j1, j2, head = _step_after(j0, j1, j2, head, nq0, nq1, nq2)

    if HALF == 1:
        # the second consumer's sums go to the first through shared memory, float32
        scratch.index(0).store(dk)
        scratch.index(1).store(dv)
        mbarrier.arrive(reduced, count=1)
    else:
        mbarrier.wait(reduced, 0)
        # K and V are free: both consumers are past their last product. One gradient at a time,
        # so that only one partial sum is loaded beside the two accumulators.
        dk = dk + scratch.index(0).load(o_layout)
        k.store((dk * scale).to(dtype))
        dv = dv + scratch.index(1).load(o_layout)
        v.store(dv.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dk_desc, [b, ys0, ys1, ys2, kvh * D], k_smem)
        tma.async_copy_shared_to_global(dv_desc, [b, ys0, ys1, ys2, kvh * D], v_smem)
        tma.store_wait(0)


@gluon.jit
def gluon_dkdv_kernel(q_desc, do_desc, st_desc, k_desc, v_desc, dk_desc, dv_desc, L0, L1, L2, K0, K1, K2,
                      S0, S1, S2, F0, F1, F2, NK1, NK2, G, qk_scale, scale, C0: gl.constexpr, C1: gl.constexpr,
                      C2: gl.constexpr, WINDOW: gl.constexpr, RANK: gl.constexpr, ANCHOR: gl.constexpr,
                      STAGES: gl.constexpr, PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """One program: one key box of one (batch, kv head); two consumer warpgroups take its walk's
    steps in turn, one producer warp feeds them. Per axis: lengths L, windows K, strides S, shifts
    F; NK1, NK2 key boxes along axes 1, 2; G query heads a kv head."""
    TM0: gl.constexpr = q_desc.block_type.shape[1]
    TM1: gl.constexpr = q_desc.block_type.shape[2]
    TM2: gl.constexpr = q_desc.block_type.shape[3]
    W: gl.constexpr = st_desc.block_type.shape[4]
    TN0: gl.constexpr = k_desc.block_type.shape[1]
    TN1: gl.constexpr = k_desc.block_type.shape[2]
    TN2: gl.constexpr = k_desc.block_type.shape[3]
    kvh = gl.program_id(1)
    b = gl.program_id(2)
    t0, t1, t2 = split3(gl.program_id(0), NK1, NK2)
    ys0, ys1, ys2 = t0 * TN0, t1 * TN1, t2 * TN2
    qs0, nq0 = query_walk(ys0, L0, K0, S0, F0, C0, WINDOW, TN0, TM0, ANCHOR)
    qs1, nq1 = query_walk(ys1, L1, K1, S1, F1, C1, WINDOW, TN1, TM1, ANCHOR)
    qs2, nq2 = query_walk(ys2, L2, K2, S2, F2, C2, WINDOW, TN2, TM2, ANCHOR)

    k_smem = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    st_bufs = gl.allocate_shared_memory(st_desc.dtype, [STAGES] + st_desc.block_type.shape, st_desc.layout)
    BN: gl.constexpr = TN0 * TN1 * TN2
    D: gl.constexpr = k_desc.block_type.shape[4]
    scratch = gl.allocate_shared_memory(gl.float32, [2, BN, D], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    reduced = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    mbarrier.init(reduced, count=1)
    for slot in gl.static_range(STAGES):
        mbarrier.init(ready.index(slot), count=1)
        mbarrier.init(empty.index(slot), count=1)

    # (tuples spelt out: adding tuples in a kernel drops the constexpr wrappers workers need)
    gl.warp_specialize([
        (_consumer, (dk_desc, dv_desc, k_smem, v_smem, q_bufs, do_bufs, st_bufs, kv_ready, ready, empty, scratch,
                     reduced, b, kvh, G, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, ys0, ys1, ys2, qs0, qs1, qs2,
                     nq0, nq1, nq2, qk_scale, scale, C0, C1, C2, WINDOW, RANK, STAGES, TM0, TM1, TM2, W, 0)),
        (_consumer, (dk_desc, dv_desc, k_smem, v_smem, q_bufs, do_bufs, st_bufs, kv_ready, ready, empty, scratch,
                     reduced, b, kvh, G, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, ys0, ys1, ys2, qs0, qs1, qs2,
                     nq0, nq1, nq2, qk_scale, scale, C0, C1, C2, WINDOW, RANK, STAGES, TM0, TM1, TM2, W, 1)),
        (_producer, (q_desc, do_desc, st_desc, k_desc, v_desc, k_smem, v_smem, q_bufs, do_bufs, st_bufs, kv_ready,
                     ready, empty, b, kvh, G, ys0, ys1, ys2, qs0, qs1, qs2, nq0, nq1, nq2, STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
