"""The forward on Hopper in Gluon: FlashAttention-3's structure over the backend's own key walk.

Triton 3.6 generates one loop for the forward kernel (forward_kernel.py), and at 128 channels the
best it reaches on dense attention is about 0.80 of cuDNN's rate. Gluon, the lower-level dialect
in the same wheel, lets a kernel state the structure that closes the gap (1.08 of cuDNN dense;
RESULTS.md, "Gluon probes"):

* one producer warp issues the TMA copies of each key tile's K and V boxes into a ring of
  ``STAGES`` slots and hands them over with mbarriers (a slot is refilled once both consumers
  have arrived on its "empty" barrier);
* two consumer warpgroups of 64 queries each share the query box's key walk and every K/V tile;
  S = Q K^T of tile i is issued before O += P V of tile i - 1, so the softmax of tile i runs
  while the tensor cores work on the latter;
* ``setmaxnreg`` hands the producer's registers to the consumers;
* on a persistent grid a program walks a row of boxes (gluon_schedule.py deals them): the ring's
  position runs on from box to box and each consumer has two query slots, so the next box's
  queries and first tiles load while this box's last products, softmax and store run; the
  consumers' pipeline runs on too (a box's last O += P V behind the next box's first S).

The walk, the per-axis key ranges and the partial tiles' masks are the Triton kernels' device
functions (index_math, scores.mask_pairs), which Gluon calls unchanged: both kernels compute the
same pairs of the same boxes. K/V and the query/output boxes come through rank-5 descriptors
over ``[B, X0, X1, X2, H * D]`` (the heads merged, as host_descriptors.py does at rank 3; query
and key heads laid out back to back; GQA by head index). The LSE is written as the Triton
forward writes it (natural log, float32, one per query and head), so the backward runs on it.
gluon_forward_launch.py says which problems take this kernel.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .exp2_split import exp2_split
from .gluon_ring import accumulator_layout, allocate_ring, probabilities_layout
from .index_math import crosses, key_range, key_walk, next3, split3
from .scores import LN2, mask_pairs

# Query warpgroups a program (64 queries each: wgmma's M per warpgroup); the kernel below spells
# the two out (its warp_specialize list, the producer's loop over the query halves).
CONSUMERS = 2
_CONSUMERS = gl.constexpr(CONSUMERS)  # (the kernels' copy: a jitted function reads constexpr globals only)


@gluon.jit
def _half_origin(xs0, xs1, xs2, HALF: gl.constexpr, SPLIT: gl.constexpr, E0: gl.constexpr, E1: gl.constexpr,
                 E2: gl.constexpr):
    """First coordinates of consumer ``HALF``'s queries: the box is cut into consumers' parts of
    E0 x E1 x E2 along axis ``SPLIT`` (its slowest axis longer than 1, so each part is a run of
    whole rows of the box's row-major order)."""
    if SPLIT == 0:
        xs0 = xs0 + HALF * E0
    elif SPLIT == 1:
        xs1 = xs1 + HALF * E1
    else:
        xs2 = xs2 + HALF * E2
    return xs0, xs1, xs2


@gluon.jit
def _box_count(SCHEDULE, SCHEDULE_STRIDE, PERSISTENT: gl.constexpr):
    """Boxes this program walks: its row's count in the persistent grid's table
    (gluon_schedule.py), else one."""
    if PERSISTENT:
        count = gl.load(SCHEDULE + gl.program_id(0) * SCHEDULE_STRIDE)
    else:
        count = gl.to_tensor(1)
    return count


@gluon.jit
def _box_walk(q_desc, k_desc, SCHEDULE, SCHEDULE_STRIDE, k, PERSISTENT: gl.constexpr, BOXES, HEADS, L0, L1, L2, K0,
              K1, K2, S0, S1, S2, F0, F1, F2, NT1, NT2, GROUP, C0: gl.constexpr, C1: gl.constexpr, C2: gl.constexpr,
              WINDOW: gl.constexpr, SPLIT: gl.constexpr):
    """``_program_walk`` of this program's ``k``-th box: the work item from its row of the table,
    else its id."""
    if PERSISTENT:
        item = gl.load(SCHEDULE + gl.program_id(0) * SCHEDULE_STRIDE + 1 + k)
    else:
        item = gl.program_id(0)
    return _program_walk(q_desc, k_desc, item, BOXES, HEADS, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, NT1,
                         NT2, GROUP, C0, C1, C2, WINDOW, SPLIT)


@gluon.jit
def _load_tile(k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, i, coord, STAGES: gl.constexpr):
    """The producer's step ``i`` of the ring: the key tile at ``coord`` into slot i % STAGES, K
    and V each once both consumers have released the slot's last tile."""
    slot = i % STAGES
    # mbarriers start with phase 1 complete: the first pass over the ring does not wait
    empty_phase = ((i // STAGES) & 1) ^ 1
    mbarrier.wait(k_empty.index(slot), empty_phase)
    mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, coord, k_ready.index(slot), k_bufs.index(slot))
    mbarrier.wait(v_empty.index(slot), empty_phase)
    mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(v_desc, coord, v_ready.index(slot), v_bufs.index(slot))


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
              SCHEDULE, SCHEDULE_STRIDE, BOXES, HEADS, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, NT1, NT2, GROUP,
              C0: gl.constexpr, C1: gl.constexpr, C2: gl.constexpr, WINDOW: gl.constexpr, STAGES: gl.constexpr,
              SPLIT: gl.constexpr, QBUFS: gl.constexpr, PERSISTENT: gl.constexpr):
    """The producer warp, over this program's boxes: each box's query halves into its query slots
    (once the consumers have stored the output of the box that used them before), then its walk's
    K/V tiles into the ring, each slot once both consumers released it. The ring's position runs
    on across boxes, so the next box's first tiles come while the consumers finish the last."""
    position = gl.to_tensor(0)
    for boxes_done in range(_box_count(SCHEDULE, SCHEDULE_STRIDE, PERSISTENT)):
        b, h, q_col, kv_col, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2 = _box_walk(
            q_desc, k_desc, SCHEDULE, SCHEDULE_STRIDE, boxes_done, PERSISTENT, BOXES, HEADS, L0, L1, L2, K0, K1, K2,
            S0, S1, S2, F0, F1, F2, NT1, NT2, GROUP, C0, C1, C2, WINDOW, SPLIT)
        first_slot = (boxes_done % QBUFS) * _CONSUMERS
        # mbarriers start with phase 1 complete: a query slot's first use does not wait
        free_phase = ((boxes_done // QBUFS) & 1) ^ 1
        for half in gl.static_range(_CONSUMERS):
            hx0, hx1, hx2 = _half_origin(xs0, xs1, xs2, half, SPLIT, q_desc.block_type.shape[1],
                                         q_desc.block_type.shape[2], q_desc.block_type.shape[3])
            mbarrier.wait(q_empty.index(first_slot + half), free_phase)
            mbarrier.expect(q_ready.index(first_slot + half), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [b, hx0, hx1, hx2, q_col], q_ready.index(first_slot + half),
                                            q_smem.index(first_slot + half))
        position = _load_walk(k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, position, b,
                              kv_col, st0, st1, st2, n0, n1, n2, STAGES)


@gluon.jit
def _load_walk(k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, position, b, kv_col, st0, st1,
               st2, n0, n1, n2, STAGES: gl.constexpr):
    """The producer's steps over one box's key walk (first keys ``st``, ``n`` tiles per axis),
    from ring position ``position`` on; returns the position after them."""
    TK0: gl.constexpr = k_desc.block_type.shape[1]
    TK1: gl.constexpr = k_desc.block_type.shape[2]
    TK2: gl.constexpr = k_desc.block_type.shape[3]
    j0 = gl.to_tensor(0)
    j1 = gl.to_tensor(0)
    j2 = gl.to_tensor(0)
    n_tiles = n0 * n1 * n2
    for t in range(n_tiles):
        # (the ring's position as position + t: a loop over range(position, ...) here lost the
        # carried position in Triton 3.6's front end, whose loop then started at 0)
        _load_tile(k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, position + t,
                   [b, st0 + j0 * TK0, st1 + j1 * TK1, st2 + j2 * TK2, kv_col], STAGES)
        j0, j1, j2 = next3(j0, j1, j2, n1, n2)
    return position + n_tiles


@gluon.jit
def _masked(s, fill, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, ys0, ys1, ys2, lo0, hi0, lo1, hi1, lo2, hi2,
            TK0: gl.constexpr, TK1: gl.constexpr, TK2: gl.constexpr, RANK: gl.constexpr, s_layout: gl.constexpr):
    """Scores (or probabilities) of the key tile at (ys0, ys1, ys2) with ``fill`` outside each
    row's window (rows' key ranges rlo/rhi per axis), on the axes where the tile leaves the part
    every row sees [lo, hi)."""
    c0 = crosses(ys0, TK0, lo0, hi0)
    c1 = crosses(ys1, TK1, lo1, hi1)
    c2 = crosses(ys2, TK2, lo2, hi2)
    if c0 | c1 | c2:
        n0, n1, n2 = split3(gl.arange(0, TK0 * TK1 * TK2, layout=gl.SliceLayout(0, s_layout)), TK1, TK2)
        s = mask_pairs(s, fill, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, ys0 + n0, ys1 + n1, ys2 + n2,
                       c0, c1, c2, True, RANK, True)
    return s


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale, EXP2_EVERY: gl.constexpr):
    """One tile of the online softmax in log2 units: (P unnormalised, new maxima, new sums, alpha);
    one exp2 of P in EXP2_EVERY on the FMA pipe (exp2_split.py; 0: none)."""
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    # rows that have seen no key yet keep -inf maxima: subtract 0 there instead of -inf
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = exp2_split(s * qk_scale - gl.expand_dims(m_safe, 1), EXP2_EVERY)
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha


@gluon.jit
def _pipelined_step(q, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, acc, p16, m_i, l_i, i, s_zero, rlo0, rhi0,
                    rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1, hi1, lo2, hi2, ys0, ys1, ys2, qk_scale,
                    RANK: gl.constexpr, STAGES: gl.constexpr, TK0: gl.constexpr, TK1: gl.constexpr,
                    TK2: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr, o_rows: gl.constexpr,
                    RESCALE: gl.constexpr, EXP2_EVERY: gl.constexpr):
    """Step ``i`` of the ring (the key tile at ``ys``): its S issued, then tile i-1's O += P V
    (``p16``), and tile i's softmax while the latter is on the tensor cores; each slot released as
    soon as its product is done. Returns (P of tile i, acc, maxima, sums). Without RESCALE, step i
    is the first of another box (queries ``q``, fresh maxima and sums): tile i-1 was the last of
    this box, whose accumulator comes back complete, not rescaled."""
    BN: gl.constexpr = TK0 * TK1 * TK2
    D: gl.constexpr = q.shape[1]
    slot = i % STAGES
    prev = (i - 1) % STAGES
    mbarrier.wait(k_ready.index(slot), (i // STAGES) & 1)
    s = warpgroup_mma(q, k_bufs.index(slot).reshape([BN, D]).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(prev), ((i - 1) // STAGES) & 1)
    acc = warpgroup_mma(p16, v_bufs.index(prev).reshape([BN, D]), acc, is_async=True)
    s = warpgroup_mma_wait(1, deps=(s, ))
    mbarrier.arrive(k_empty.index(slot), count=1)
    s = _masked(s, float("-inf"), rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, ys0, ys1, ys2, lo0, hi0, lo1, hi1, lo2, hi2,
                TK0, TK1, TK2, RANK, s_layout)
    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, EXP2_EVERY)
    acc, p16 = warpgroup_mma_wait(0, deps=(acc, p16))
    mbarrier.arrive(v_empty.index(prev), count=1)
    if RESCALE:
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
    return gl.convert_layout(p.to(q.dtype), p_layout), acc, m_i, l_i


@gluon.jit
def _last_product(p16, v_bufs, v_ready, v_empty, acc, i, STAGES: gl.constexpr):
    """O += P V of step ``i``, the walk's last, waited for; its V slot released."""
    BN: gl.constexpr = p16.shape[1]
    D: gl.constexpr = acc.shape[1]
    last = i % STAGES
    mbarrier.wait(v_ready.index(last), (i // STAGES) & 1)
    acc = warpgroup_mma(p16, v_bufs.index(last).reshape([BN, D]), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc, p16))[0]
    mbarrier.arrive(v_empty.index(last), count=1)
    return acc


@gluon.jit
def _rows_and_keys(xs0, xs1, xs2, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, C0: gl.constexpr,
                   C1: gl.constexpr, C2: gl.constexpr, WINDOW: gl.constexpr, TQ0: gl.constexpr, TQ1: gl.constexpr,
                   TQ2: gl.constexpr, TK0: gl.constexpr, TK1: gl.constexpr, TK2: gl.constexpr,
                   s_rows: gl.constexpr):
    """A consumer's query rows from its first coordinates ``xs``: (x0, x1, x2), each row's keys per
    axis (rlo, rhi: the masks of the partial tiles compare against them), and per axis the keys
    every row sees (lo, hi: the tiles inside them skip the mask)."""
    _, _, lo0, hi0 = key_walk(xs0, L0, K0, S0, F0, C0, WINDOW, TQ0, TK0, True)
    _, _, lo1, hi1 = key_walk(xs1, L1, K1, S1, F1, C1, WINDOW, TQ1, TK1, True)
    _, _, lo2, hi2 = key_walk(xs2, L2, K2, S2, F2, C2, WINDOW, TQ2, TK2, True)
    m0, m1, m2 = split3(gl.arange(0, TQ0 * TQ1 * TQ2, layout=s_rows), TQ1, TQ2)
    x0, x1, x2 = xs0 + m0, xs1 + m1, xs2 + m2
    rlo0, rhi0 = key_range(x0, L0, K0, S0, F0, C0, WINDOW)
    rlo1, rhi1 = key_range(x1, L1, K1, S1, F1, C1, WINDOW)
    rlo2, rhi2 = key_range(x2, L2, K2, S2, F2, C2, WINDOW)
    return x0, x1, x2, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1, hi1, lo2, hi2


@gluon.jit
def _store_rows(o_desc, LSE, q_box, acc, m_i, l_i, x0, x1, x2, L0, L1, L2, xs0, xs1, xs2, b, h, q_col, slb, sl0, sl1,
                sl2, slh, o_rows: gl.constexpr):
    """A consumer's LSE (natural log, as forward_kernel.store_rows writes it) and normalised
    output, the latter through its query slot, free once every product has completed (the copy
    engine drops the box's rows outside the grid). Rows that saw no key (never NaN) get zeros and
    an LSE of -inf."""
    BM: gl.constexpr = o_desc.block_type.shape[1] * o_desc.block_type.shape[2] * o_desc.block_type.shape[3]
    D: gl.constexpr = o_desc.block_type.shape[4]
    empty = l_i == 0.0
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)
    inside = (x0 < L0) & (x1 < L1) & (x2 < L2)
    gl.store(LSE + b * slb + x0 * sl0 + x1 * sl1 + x2 * sl2 + h * slh, lse, mask=inside)
    out = acc / gl.expand_dims(gl.convert_layout(gl.where(empty, 1.0, l_i), o_rows), 1)
    q_box.reshape([BM, D]).store(out.to(o_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, xs0, xs1, xs2, q_col], q_box)
    tma.store_wait(0)


@gluon.jit
def _consumer_box(q_desc, k_desc, SCHEDULE, SCHEDULE_STRIDE, k, PERSISTENT: gl.constexpr, BOXES, HEADS, L0, L1, L2,
                  K0, K1, K2, S0, S1, S2, F0, F1, F2, NT1, NT2, GROUP, C0: gl.constexpr, C1: gl.constexpr,
                  C2: gl.constexpr, WINDOW: gl.constexpr, HALF: gl.constexpr, SPLIT: gl.constexpr,
                  s_rows: gl.constexpr):
    """Consumer HALF's part of this program's ``k``-th box: its batch, head and query column, its
    queries' first coordinates, the box's key walk (first key, tile steps per axis) and its rows'
    key ranges (``_rows_and_keys``: rlo/rhi per row, lo/hi shared, per axis)."""
    TQ0: gl.constexpr = q_desc.block_type.shape[1]
    TQ1: gl.constexpr = q_desc.block_type.shape[2]
    TQ2: gl.constexpr = q_desc.block_type.shape[3]
    TK0: gl.constexpr = k_desc.block_type.shape[1]
    TK1: gl.constexpr = k_desc.block_type.shape[2]
    TK2: gl.constexpr = k_desc.block_type.shape[3]
    b, h, q_col, _, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2 = _box_walk(
        q_desc, k_desc, SCHEDULE, SCHEDULE_STRIDE, k, PERSISTENT, BOXES, HEADS, L0, L1, L2, K0, K1, K2, S0, S1, S2,
        F0, F1, F2, NT1, NT2, GROUP, C0, C1, C2, WINDOW, SPLIT)
    xs0, xs1, xs2 = _half_origin(xs0, xs1, xs2, HALF, SPLIT, TQ0, TQ1, TQ2)
    _, _, _, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1, hi1, lo2, hi2 = _rows_and_keys(
        xs0, xs1, xs2, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, C0, C1, C2, WINDOW, TQ0, TQ1, TQ2, TK0, TK1,
        TK2, s_rows)
    return (b, h, q_col, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1,
            hi1, lo2, hi2)


@gluon.jit
def _consumer(o_desc, LSE, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, q_desc,
              k_desc, slb, sl0, sl1, sl2, slh, SCHEDULE, SCHEDULE_STRIDE, BOXES, HEADS, L0, L1, L2, K0, K1, K2, S0,
              S1, S2, F0, F1, F2, NT1, NT2, GROUP, qk_scale, C0: gl.constexpr, C1: gl.constexpr, C2: gl.constexpr,
              WINDOW: gl.constexpr, RANK: gl.constexpr, STAGES: gl.constexpr, HALF: gl.constexpr,
              SPLIT: gl.constexpr, QBUFS: gl.constexpr, PERSISTENT: gl.constexpr, EXP2_EVERY: gl.constexpr):
    """Consumer warpgroup HALF over this program's boxes, in the producer's order: its 64 queries
    over each box's walk, then their output and LSE; the query slot is handed back for a later
    box once the output's store has read it.

    The software pipeline runs on across boxes: a box's last O += P V goes to the tensor cores
    behind the next box's first S, whose softmax runs under it, so a box's turn costs the tensor
    cores no more than a step inside its walk. (Both consumers walk the same box at the same time:
    a pipeline that drained at every box would leave the tensor cores idle at every turn, for the
    first tile's scores and softmax and the last product; the issue's 2-D walks are 10-30 tiles.)"""
    TQ0: gl.constexpr = o_desc.block_type.shape[1]
    TQ1: gl.constexpr = o_desc.block_type.shape[2]
    TQ2: gl.constexpr = o_desc.block_type.shape[3]
    D: gl.constexpr = o_desc.block_type.shape[4]
    TK0: gl.constexpr = k_desc.block_type.shape[1]
    TK1: gl.constexpr = k_desc.block_type.shape[2]
    TK2: gl.constexpr = k_desc.block_type.shape[3]
    BM: gl.constexpr = TQ0 * TQ1 * TQ2
    BN: gl.constexpr = TK0 * TK1 * TK2
    s_layout: gl.constexpr = accumulator_layout(BN)
    o_layout: gl.constexpr = accumulator_layout(D)
    p_layout: gl.constexpr = probabilities_layout(o_layout)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = o_desc.dtype
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    no_max = gl.full([BM], float("-inf"), gl.float32, layout=s_rows)
    no_sum = gl.zeros([BM], gl.float32, layout=s_rows)
    m0, m1, m2 = split3(gl.arange(0, BM, layout=s_rows), TQ1, TQ2)
    boxes = _box_count(SCHEDULE, SCHEDULE_STRIDE, PERSISTENT)

    # the first box's first tile: its scores and softmax before any loop
    (b, h, q_col, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1, hi1,
     lo2, hi2) = _consumer_box(q_desc, k_desc, SCHEDULE, SCHEDULE_STRIDE, 0, PERSISTENT, BOXES, HEADS, L0, L1, L2,
                               K0, K1, K2, S0, S1, S2, F0, F1, F2, NT1, NT2, GROUP, C0, C1, C2, WINDOW, HALF, SPLIT,
                               s_rows)
    mbarrier.wait(q_ready.index(HALF), 0)
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q_smem.index(HALF).reshape([BM, D]), k_bufs.index(0).reshape([BN, D]).permute((1, 0)), s_zero,
                      use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    mbarrier.arrive(k_empty.index(0), count=1)
    s = _masked(s, float("-inf"), rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, st0, st1, st2, lo0, hi0, lo1, hi1, lo2, hi2,
                TK0, TK1, TK2, RANK, s_layout)
    p, m_i, l_i, _ = _softmax_step(s, no_max, no_sum, qk_scale, EXP2_EVERY)
    p16 = gl.convert_layout(p.to(dtype), p_layout)
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)

    position = gl.to_tensor(0)
    for boxes_done in range(boxes):
        # this box's walk after its first tile: step i issues tile i's S and tile i-1's O += P V
        q_slot = (boxes_done % QBUFS) * _CONSUMERS + HALF
        q = q_smem.index(q_slot).reshape([BM, D])
        n_tiles = n0 * n1 * n2
        j0, j1, j2 = next3(gl.to_tensor(0), gl.to_tensor(0), gl.to_tensor(0), n1, n2)
        for i in range(position + 1, position + n_tiles):
            p16, acc, m_i, l_i = _pipelined_step(q, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, acc, p16,
                                                 m_i, l_i, i, s_zero, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0,
                                                 lo1, hi1, lo2, hi2, st0 + j0 * TK0, st1 + j1 * TK1, st2 + j2 * TK2,
                                                 qk_scale, RANK, STAGES, TK0, TK1, TK2, s_layout, p_layout, o_rows,
                                                 True, EXP2_EVERY)
            j0, j1, j2 = next3(j0, j1, j2, n1, n2)
        position += n_tiles
        box_b, box_h, box_col, box0, box1, box2 = b, h, q_col, xs0, xs1, xs2

        # the turn: the next box's first S, then this box's last O += P V under its softmax
        if boxes_done + 1 < boxes:
            (b, h, q_col, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0,
             lo1, hi1, lo2, hi2) = _consumer_box(q_desc, k_desc, SCHEDULE, SCHEDULE_STRIDE, boxes_done + 1,
                                                 PERSISTENT, BOXES, HEADS, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1,
                                                 F2, NT1, NT2, GROUP, C0, C1, C2, WINDOW, HALF, SPLIT, s_rows)
            next_slot = ((boxes_done + 1) % QBUFS) * _CONSUMERS + HALF
            mbarrier.wait(q_ready.index(next_slot), ((boxes_done + 1) // QBUFS) & 1)
            p_next, acc, m_next, l_next = _pipelined_step(
                q_smem.index(next_slot).reshape([BM, D]), k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, acc,
                p16, no_max, no_sum, position, s_zero, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, lo0, hi0, lo1, hi1, lo2,
                hi2, st0, st1, st2, qk_scale, RANK, STAGES, TK0, TK1, TK2, s_layout, p_layout, o_rows, False,
                EXP2_EVERY)
        else:
            acc = _last_product(p16, v_bufs, v_ready, v_empty, acc, position - 1, STAGES)
            p_next, m_next, l_next = p16, m_i, l_i
        _store_rows(o_desc, LSE, q_smem.index(q_slot), acc, m_i, l_i, box0 + m0, box1 + m1, box2 + m2, L0, L1, L2,
                    box0, box1, box2, box_b, box_h, box_col, slb, sl0, sl1, sl2, slh, o_rows)
        mbarrier.arrive(q_empty.index(q_slot), count=1)
        p16, m_i, l_i = p_next, m_next, l_next
        acc = gl.zeros([BM, D], gl.float32, layout=o_layout)


@gluon.jit
def _program_walk(q_desc, k_desc, item, BOXES, HEADS, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, NT1, NT2, GROUP,
                  C0: gl.constexpr, C1: gl.constexpr, C2: gl.constexpr, WINDOW: gl.constexpr, SPLIT: gl.constexpr):
    """Work item ``item`` (query boxes fastest, then heads, then batches: ``BOXES`` boxes a head,
    ``HEADS`` heads): its batch and head, the query and key heads' first columns, its query box's
    first coordinates (the box: both consumers' halves, cut along axis SPLIT) and the box's key
    walk per axis (first key, tile steps)."""
    TQ0: gl.constexpr = q_desc.block_type.shape[1] * (2 if SPLIT == 0 else 1)
    TQ1: gl.constexpr = q_desc.block_type.shape[2] * (2 if SPLIT == 1 else 1)
    TQ2: gl.constexpr = q_desc.block_type.shape[3] * (2 if SPLIT == 2 else 1)
    D: gl.constexpr = q_desc.block_type.shape[4]
    TK0: gl.constexpr = k_desc.block_type.shape[1]
    TK1: gl.constexpr = k_desc.block_type.shape[2]
    TK2: gl.constexpr = k_desc.block_type.shape[3]
    box = item % BOXES
    head_of_batch = item // BOXES
    h = head_of_batch % HEADS
    b = head_of_batch // HEADS
    q_col = h * D
    kv_col = (h // GROUP) * D
    t0, t1, t2 = split3(box, NT1, NT2)
    xs0, xs1, xs2 = t0 * TQ0, t1 * TQ1, t2 * TQ2
    st0, n0, _, _ = key_walk(xs0, L0, K0, S0, F0, C0, WINDOW, TQ0, TK0, True)
    st1, n1, _, _ = key_walk(xs1, L1, K1, S1, F1, C1, WINDOW, TQ1, TK1, True)
    st2, n2, _, _ = key_walk(xs2, L2, K2, S2, F2, C2, WINDOW, TQ2, TK2, True)
    return b, h, q_col, kv_col, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2


@gluon.jit
def gluon_forward_kernel(q_desc, k_desc, v_desc, o_desc, LSE, slb, sl0, sl1, sl2, slh, L0, L1, L2, K0, K1, K2,
                         S0, S1, S2, F0, F1, F2, NT1, NT2, GROUP, qk_scale, BOXES, HEADS, SCHEDULE, SCHEDULE_STRIDE,
                         C0: gl.constexpr, C1: gl.constexpr, C2: gl.constexpr, WINDOW: gl.constexpr,
                         RANK: gl.constexpr, STAGES: gl.constexpr, SPLIT: gl.constexpr, QBUFS: gl.constexpr,
                         PERSISTENT: gl.constexpr, EXP2_EVERY: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                         CONSUMER_REGS: gl.constexpr):
    """Programs walking work items (query boxes of one (batch, head)): one each (program i the
    i-th), or on a PERSISTENT grid those of the program's row of the ``SCHEDULE`` table (rows of
    SCHEDULE_STRIDE int32: a count, then items; gluon_schedule.py). A box is cut into two parts
    of 64 queries (one consumer warpgroup each, sharing the box's key walk) along axis SPLIT; one
    producer warp. ``QBUFS`` query slots a consumer (two on a persistent grid: the next box's
    queries load while this one's finish). Per axis: lengths L, windows K, strides S, shifts F;
    NT1, NT2 query boxes along axes 1, 2 (``BOXES`` in all, a head of ``HEADS``)."""
    q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty = allocate_ring(
        q_desc, k_desc, v_desc, _CONSUMERS, STAGES, QBUFS)
    q_empty = gl.allocate_shared_memory(gl.int64, [_CONSUMERS * QBUFS, 1], mbarrier.MBarrierLayout())
    for q_slot in gl.static_range(_CONSUMERS * QBUFS):
        mbarrier.init(q_empty.index(q_slot), count=1)

    # (tuples spelt out: adding tuples in a kernel drops the constexpr wrappers workers need)
    gl.warp_specialize([
        (_consumer, (o_desc, LSE, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                     q_desc, k_desc, slb, sl0, sl1, sl2, slh, SCHEDULE, SCHEDULE_STRIDE, BOXES, HEADS, L0, L1, L2, K0,
                     K1, K2, S0, S1, S2, F0, F1, F2, NT1, NT2, GROUP, qk_scale, C0, C1, C2, WINDOW, RANK, STAGES,
                     0, SPLIT, QBUFS, PERSISTENT, EXP2_EVERY)),
        (_consumer, (o_desc, LSE, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                     q_desc, k_desc, slb, sl0, sl1, sl2, slh, SCHEDULE, SCHEDULE_STRIDE, BOXES, HEADS, L0, L1, L2, K0,
                     K1, K2, S0, S1, S2, F0, F1, F2, NT1, NT2, GROUP, qk_scale, C0, C1, C2, WINDOW, RANK, STAGES,
                     1, SPLIT, QBUFS, PERSISTENT, EXP2_EVERY)),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready,
                     v_empty, SCHEDULE, SCHEDULE_STRIDE, BOXES, HEADS, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1,
                     F2, NT1, NT2, GROUP, C0, C1, C2, WINDOW, STAGES, SPLIT, QBUFS, PERSISTENT)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
