"""The Gluon probe's structure on 2-D and 3-D neighbourhoods, beside the triton backend's forward.

gluon_forward_probe.py asks how fast a warp-specialised Gluon loop runs dense attention. The
issue's misses are on 2-D and 3-D windows, where the backend walks 64-query boxes over 64-key
boxes (tiles.py's cost model picks them). This probe runs the same boxes and the same walk
(index_math.key_walk, anchored; index_math.key_range and scores.mask_pairs for the partial tiles,
the backend's own device functions, which Gluon calls as they are) under Gluon's structure:

* one producer warp issues the TMA copies of each key tile's K and V boxes (rank-5 descriptors
  over ``[B, X0, X1, X2, H * D]``, the heads merged as host_descriptors.py does at rank 3) into a
  ring of ``STAGES`` slots, handing them over with mbarriers;
* each consumer warpgroup holds 64 queries: S = Q K^T of tile i is issued before O += P V of
  tile i - 1, and the softmax of tile i runs while the latter is on the tensor cores;
* a 64-query box (the backend's default) runs on one consumer, ``maxnreg`` 128 over 8 warps
  letting two programs share a multiprocessor as the backend's 4-warp programs do; a 128-query
  box (the cost model's cheapest for 128 queries) on two consumers that share its key walk and
  every K/V tile, each testing its masks against the keys its own half sees in full.

Scope (a probe): rank 1-3 neighbourhoods with any per-axis window, stride and causal flag; no
dilation, bias, softcap, mods or additional keys; 16-bit inputs with 64 or 128 channels, query
and key heads laid out back to back (GQA by head index). Outputs are checked against the triton
backend's (itself checked against the float64 oracle by the test suite), LSE is not written.

    python benchmarks/gluon_neighborhood_probe.py --compile-only   # build for sm_90 on any machine
    python benchmarks/gluon_neighborhood_probe.py [--json FILE]     # on a Hopper GPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_ring import accumulator_layout, allocate_ring, probabilities_layout  # noqa: E402 (beside this file)

from haloattn.backends.triton.index_math import crosses, key_range, key_walk, next3, split3  # noqa: E402
from haloattn.backends.triton.scores import mask_pairs  # noqa: E402

LOG2E = 1.4426950408889634


@gluon.jit
def _axis_walks(pid, L0, L1, L2, K0, K1, K2, S0, S1, S2, NT1, NT2, C0: gl.constexpr, C1: gl.constexpr,
                C2: gl.constexpr, TQ0: gl.constexpr, TQ1: gl.constexpr, TQ2: gl.constexpr, TK0: gl.constexpr,
                TK1: gl.constexpr, TK2: gl.constexpr):
    """The query box (all consumers' queries) of program ``pid`` and its walk per axis: (first
    query coordinate, walk start, tiles) for each of the three axes."""
    t0, t1, t2 = split3(pid, NT1, NT2)
    xs0, xs1, xs2 = t0 * TQ0, t1 * TQ1, t2 * TQ2
    st0, n0, _, _ = key_walk(xs0, L0, K0, S0, 0, C0, False, TQ0, TK0, True)
    st1, n1, _, _ = key_walk(xs1, L1, K1, S1, 0, C1, False, TQ1, TK1, True)
    st2, n2, _, _ = key_walk(xs2, L2, K2, S2, 0, C2, False, TQ2, TK2, True)
    return xs0, xs1, xs2, st0, st1, st2, n0, n1, n2


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
def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty,
              b, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2, q_col, kv_col, STAGES: gl.constexpr,
              CONSUMERS: gl.constexpr, SPLIT: gl.constexpr):
    TK0: gl.constexpr = k_desc.block_type.shape[1]
    TK1: gl.constexpr = k_desc.block_type.shape[2]
    TK2: gl.constexpr = k_desc.block_type.shape[3]
    for half in gl.static_range(CONSUMERS):
        hx0, hx1, hx2 = _half_origin(xs0, xs1, xs2, half, SPLIT, q_desc.block_type.shape[1],
                                     q_desc.block_type.shape[2], q_desc.block_type.shape[3])
        mbarrier.expect(q_ready.index(half), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, hx0, hx1, hx2, q_col], q_ready.index(half), q_smem.index(half))
    j0 = gl.to_tensor(0)
    j1 = gl.to_tensor(0)
    j2 = gl.to_tensor(0)
    for i in range(n0 * n1 * n2):
        slot = i % STAGES
        # mbarriers start with phase 1 complete: the first pass over the ring does not wait
        empty_phase = ((i // STAGES) & 1) ^ 1
        coord = [b, st0 + j0 * TK0, st1 + j1 * TK1, st2 + j2 * TK2, kv_col]
        mbarrier.wait(k_empty.index(slot), empty_phase)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, coord, k_ready.index(slot), k_bufs.index(slot))
        mbarrier.wait(v_empty.index(slot), empty_phase)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, coord, v_ready.index(slot), v_bufs.index(slot))
        j0, j1, j2 = next3(j0, j1, j2, n1, n2)


@gluon.jit
def _masked(s, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, ys0, ys1, ys2, lo0, hi0, lo1, hi1, lo2, hi2,
            TK0: gl.constexpr, TK1: gl.constexpr, TK2: gl.constexpr, RANK: gl.constexpr, MASKS: gl.constexpr,
            s_layout: gl.constexpr):
    """Scores of the key tile at (ys0, ys1, ys2) with -inf outside each row's window (rows' key
    ranges rlo/rhi per axis), on the axes where the tile leaves the part every row sees [lo, hi).
    MASKS=False (timing only, wrong outputs) measures what the masks cost."""
    c0 = crosses(ys0, TK0, lo0, hi0)
    c1 = crosses(ys1, TK1, lo1, hi1)
    c2 = crosses(ys2, TK2, lo2, hi2)
    if MASKS:
        if c0 | c1 | c2:
            n0, n1, n2 = split3(gl.arange(0, TK0 * TK1 * TK2, layout=gl.SliceLayout(0, s_layout)), TK1, TK2)
            s = mask_pairs(s, float("-inf"), rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, ys0 + n0, ys1 + n1, ys2 + n2,
                           c0, c1, c2, True, RANK, True)
    return s


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale):
    """One tile of the online softmax in log2 units: (P unnormalised, new maxima, new sums, alpha)."""
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    # rows that have seen no key yet keep -inf maxima: subtract 0 there instead of -inf
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_safe, 1))
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha


@gluon.jit
def _consumer(o_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty, b, q_col,
              L0, L1, L2, K0, K1, K2, S0, S1, S2, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2, qk_scale,
              C0: gl.constexpr, C1: gl.constexpr, C2: gl.constexpr, RANK: gl.constexpr, STAGES: gl.constexpr,
              TK0: gl.constexpr, TK1: gl.constexpr, TK2: gl.constexpr, HALF: gl.constexpr, SPLIT: gl.constexpr,
              MASKS: gl.constexpr):
    TQ0: gl.constexpr = o_desc.block_type.shape[1]
    TQ1: gl.constexpr = o_desc.block_type.shape[2]
    TQ2: gl.constexpr = o_desc.block_type.shape[3]
    D: gl.constexpr = o_desc.block_type.shape[4]
    BM: gl.constexpr = o_desc.block_type.shape[1] * TQ1 * TQ2
    BN: gl.constexpr = TK0 * TK1 * TK2
    s_layout: gl.constexpr = accumulator_layout(BN)
    o_layout: gl.constexpr = accumulator_layout(D)
    p_layout: gl.constexpr = probabilities_layout(o_layout)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = o_desc.dtype

    xs0, xs1, xs2 = _half_origin(xs0, xs1, xs2, HALF, SPLIT, TQ0, TQ1, TQ2)
    # the keys every query of this consumer sees (its tiles inside them skip the mask)
    _, _, lo0, hi0 = key_walk(xs0, L0, K0, S0, 0, C0, False, TQ0, TK0, True)
    _, _, lo1, hi1 = key_walk(xs1, L1, K1, S1, 0, C1, False, TQ1, TK1, True)
    _, _, lo2, hi2 = key_walk(xs2, L2, K2, S2, 0, C2, False, TQ2, TK2, True)
    q_box = q_smem.index(HALF)
    q = q_box.reshape([BM, D])
    m0, m1, m2 = split3(gl.arange(0, BM, layout=s_rows), TQ1, TQ2)
    x0, x1, x2 = xs0 + m0, xs1 + m1, xs2 + m2
    # each row's keys per axis, once: the masks of the partial tiles compare against them
    rlo0, rhi0 = key_range(x0, L0, K0, S0, 0, C0, False)
    rlo1, rhi1 = key_range(x1, L1, K1, S1, 0, C1, False)
    rlo2, rhi2 = key_range(x2, L2, K2, S2, 0, C2, False)
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=s_rows)
    l_i = gl.zeros([BM], gl.float32, layout=s_rows)
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    n_tiles = n0 * n1 * n2
    mbarrier.wait(q_ready.index(HALF), 0)

    # tile 0's scores and softmax before the loop; each step then issues tile i's S, tile i-1's
    # O += P V, and runs tile i's softmax while the latter is on the tensor cores
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q, k_bufs.index(0).reshape([BN, D]).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    mbarrier.arrive(k_empty.index(0), count=1)
    s = _masked(s, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, st0, st1, st2, lo0, hi0, lo1, hi1, lo2, hi2, TK0, TK1, TK2,
                RANK, MASKS, s_layout)
    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale)
    p16 = gl.convert_layout(p.to(dtype), p_layout)
    j0, j1, j2 = next3(gl.to_tensor(0), gl.to_tensor(0), gl.to_tensor(0), n1, n2)
    for i in range(1, n_tiles):
        slot = i % STAGES
        prev = (i - 1) % STAGES
        mbarrier.wait(k_ready.index(slot), (i // STAGES) & 1)
        s = warpgroup_mma(q, k_bufs.index(slot).reshape([BN, D]).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
        mbarrier.wait(v_ready.index(prev), ((i - 1) // STAGES) & 1)
        acc = warpgroup_mma(p16, v_bufs.index(prev).reshape([BN, D]), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s, ))
        mbarrier.arrive(k_empty.index(slot), count=1)
        s = _masked(s, rlo0, rhi0, rlo1, rhi1, rlo2, rhi2, st0 + j0 * TK0, st1 + j1 * TK1, st2 + j2 * TK2,
                    lo0, hi0, lo1, hi1, lo2, hi2, TK0, TK1, TK2, RANK, MASKS, s_layout)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale)
        acc, p16 = warpgroup_mma_wait(0, deps=(acc, p16))
        mbarrier.arrive(v_empty.index(prev), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        j0, j1, j2 = next3(j0, j1, j2, n1, n2)
    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
    acc = warpgroup_mma(p16, v_bufs.index(last).reshape([BN, D]), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc, p16))[0]
    mbarrier.arrive(v_empty.index(last), count=1)

    out = acc / gl.expand_dims(gl.convert_layout(l_i, o_rows), 1)
    # Q's slot is free once every product has completed: the output goes out through it (the
    # copy engine drops the box's rows outside the grid)
    q.store(out.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, xs0, xs1, xs2, q_col], q_box)
    tma.store_wait(0)


@gluon.jit
def probe_forward(q_desc, k_desc, v_desc, o_desc, L0, L1, L2, K0, K1, K2, S0, S1, S2, NT1, NT2, GROUP, qk_scale,
                  C0: gl.constexpr, C1: gl.constexpr, C2: gl.constexpr, RANK: gl.constexpr, STAGES: gl.constexpr,
                  CONSUMERS: gl.constexpr, SPLIT: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                  CONSUMER_REGS: gl.constexpr, MASKS: gl.constexpr):
    """One program: one query box of one (batch, head), cut into CONSUMERS parts of 64 queries (one
    consumer warpgroup each, sharing the box's key walk) along axis SPLIT; one producer warp."""
    TQ0: gl.constexpr = q_desc.block_type.shape[1] * (CONSUMERS if SPLIT == 0 else 1)
    TQ1: gl.constexpr = q_desc.block_type.shape[2] * (CONSUMERS if SPLIT == 1 else 1)
    TQ2: gl.constexpr = q_desc.block_type.shape[3] * (CONSUMERS if SPLIT == 2 else 1)
    D: gl.constexpr = q_desc.block_type.shape[4]
    TK0: gl.constexpr = k_desc.block_type.shape[1]
    TK1: gl.constexpr = k_desc.block_type.shape[2]
    TK2: gl.constexpr = k_desc.block_type.shape[3]
    h = gl.program_id(1)
    b = gl.program_id(2)
    q_col = h * D
    kv_col = (h // GROUP) * D
    xs0, xs1, xs2, st0, st1, st2, n0, n1, n2 = _axis_walks(
        gl.program_id(0), L0, L1, L2, K0, K1, K2, S0, S1, S2, NT1, NT2, C0, C1, C2, TQ0, TQ1, TQ2, TK0, TK1, TK2)

    q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty = allocate_ring(
        q_desc, k_desc, v_desc, CONSUMERS, STAGES)

    # (tuples spelt out: adding tuples in a kernel drops the constexpr wrappers workers need)
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_consumer, (o_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty, b, q_col,
                         L0, L1, L2, K0, K1, K2, S0, S1, S2, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2, qk_scale,
                         C0, C1, C2, RANK, STAGES, TK0, TK1, TK2, 0, SPLIT, MASKS)),
            (_consumer, (o_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty, b, q_col,
                         L0, L1, L2, K0, K1, K2, S0, S1, S2, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2, qk_scale,
                         C0, C1, C2, RANK, STAGES, TK0, TK1, TK2, 1, SPLIT, MASKS)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready,
                         v_empty, b, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2, q_col, kv_col, STAGES, CONSUMERS,
                         SPLIT)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (o_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty, b, q_col,
                         L0, L1, L2, K0, K1, K2, S0, S1, S2, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2, qk_scale,
                         C0, C1, C2, RANK, STAGES, TK0, TK1, TK2, 0, SPLIT, MASKS)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready,
                         v_empty, b, xs0, xs1, xs2, st0, st1, st2, n0, n1, n2, q_col, kv_col, STAGES, CONSUMERS,
                         SPLIT)),
        ], [1], [PRODUCER_REGS])


def _rank3(values, fill):
    return [fill] * (3 - len(values)) + list(values)


def launch_args(q, k, v, out, problem, q_box, kv_box, stages, masks=True):
    """(grid, positional arguments, meta-parameters) of the probe for ``problem`` on these boxes
    (rank-3 lists: missing leading axes have length 1). A box of 128 queries runs on two
    consumer warpgroups, one of 64 on one."""
    batch, *spatial, heads, dim = q.shape
    kv_heads = k.shape[-2]
    axes = list(problem.axes)
    if any(a.dilation != 1 for a in axes) or problem.has_mods or problem.extra_tokens:
        raise ValueError("the probe runs undilated neighbourhoods without mods or additional keys")
    lengths = _rank3([a.length for a in axes], 1)
    windows = _rank3([a.window for a in axes], 1)
    strides = _rank3([a.stride for a in axes], 1)
    causal = _rank3([a.causal for a in axes], False)
    gl_dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[q.dtype]
    consumers = q_box[0] * q_box[1] * q_box[2] // 64
    split = next(axis for axis in range(3) if q_box[axis] > 1 or axis == 2)
    part = list(q_box)
    part[split] //= consumers

    def desc(t, box):
        view = t.reshape(batch, *lengths, t.shape[-2] * dim)
        block = [1, *box, dim]
        layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype)
        return TensorDescriptor(view, list(view.shape), list(view.stride()), block, layout)

    boxes = [-(-n // t) for n, t in zip(lengths, q_box)]
    grid = (boxes[0] * boxes[1] * boxes[2], heads, batch)
    args = (desc(q, part), desc(k, kv_box), desc(v, kv_box), desc(out, part), *lengths, *windows, *strides,
            boxes[1], boxes[2], heads // kv_heads, problem.scale * LOG2E)
    # one consumer: maxnreg 128 over 8 warps lets two programs share a multiprocessor
    meta = dict(C0=causal[0], C1=causal[1], C2=causal[2], RANK=len(axes), STAGES=stages, CONSUMERS=consumers,
                SPLIT=split, PRODUCER_REGS=24, CONSUMER_REGS=240 if consumers == 2 else 0, MASKS=masks,
                num_warps=4)
    if consumers == 1:
        meta["maxnreg"] = 128
    return grid, args, meta


def probe(q, k, v, problem, q_box, kv_box, stages=2, masks=True):
    out = torch.empty_like(q)
    grid, args, meta = launch_args(q, k, v, out, problem, q_box, kv_box, stages, masks)
    probe_forward[grid](*args, **meta)
    return out


# (name, spatial, window, options, heads, kv heads, head dim, batch): the 2-D / 3-D rows
# and off-list shapes (odd lengths, unequal windows, GQA, causal axes)
PROBLEMS = [
    ("2-D 128x128, 31x31 (issue)", (128, 128), 31, {}, 16, 16, 128, 1),
    ("2-D 128x128, 63x63 (issue)", (128, 128), 63, {}, 16, 16, 128, 1),
    ("2-D 128x128, 31x31 causal axis 0 (issue)", (128, 128), 31, {"causal": (True, False)}, 16, 16, 128, 1),
    ("3-D 16x48x48, 7x15x15 (issue)", (16, 48, 48), (7, 15, 15), {}, 16, 16, 128, 1),
    ("2-D 128x128, 31x31, D=64 (issue)", (128, 128), 31, {}, 16, 16, 64, 1),
    ("2-D 90x75, 13x21, GQA 8/2, B=2", (90, 75), (13, 21), {}, 8, 2, 128, 2),
    ("3-D 12x40x36, 5x9x7 causal time, stride 1x2x1", (12, 40, 36), (5, 9, 7),
     {"causal": (True, False, False), "stride": (1, 2, 1)}, 8, 8, 64, 1),
    ("1-D 32768, 2047 (issue)", (32768,), 2047, {}, 16, 16, 128, 1),
]


def _problem(spec, device, seed):
    from haloattn.problem import build_problem
    name, spatial, window, options, heads, kv_heads, dim, batch = spec
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, *spatial, heads, dim, device=device, generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, *spatial, kv_heads, dim, device=device, generator=g, dtype=torch.bfloat16)
            for _ in range(2))
    return name, q, k, v, window, options, build_problem(q, k, v, window, **options)


def variants(problem):
    """(label, query box, key box, stages, masks): the backend's default boxes (rank 3) on one
    consumer; the cost model's cheapest 128-query / 128-key boxes on two consumers, on 2 and 3
    stages, and once with the masks off (timing only: what the partial tiles' masks cost)."""
    from haloattn.backends.triton import tiles
    fwd = tiles.normalise(None, problem)["fwd"]
    found = []
    if _tokens(fwd["q"]) == 64:
        found.append((f"1 consumer {fwd['q']}x{fwd['kv']} s2", _rank3(fwd["q"], 1), _rank3(fwd["kv"], 1), 2, True))
    _, q_box, kv_box = tiles._cheapest_boxes(problem, 128, 128)
    if _tokens(q_box) == 128 and _tokens(kv_box) == 128:
        for stages, masks in ((2, True), (3, True), (2, False)):
            label = f"2 consumers {list(q_box)}x{list(kv_box)} s{stages}" + ("" if masks else " masks off (timing)")
            found.append((label, _rank3(q_box, 1), _rank3(kv_box, 1), stages, masks))
    return found


def _tokens(box):
    count = 1
    for extent in box:
        count *= extent
    return count


def compile_only():
    """Build every problem's variants for sm_90 (no GPU needed) and print what they come to."""
    from gluon_compile import build_sm90, report

    for index, spec in enumerate(PROBLEMS):
        name, q, k, v, *_, problem = _problem(spec, "cpu", index)
        for label, q_box, kv_box, stages, masks in variants(problem):
            _, args, meta = launch_args(q, k, v, q, problem, q_box, kv_box, stages, masks)
            report(f"{name} | {label}", build_sm90(probe_forward, args, meta))


def run_gpu(json_path):
    from triton.testing import do_bench

    import haloattn

    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    rows = []
    for index, spec in enumerate(PROBLEMS):
        name, q, k, v, window, options, problem = _problem(spec, "cuda", index)

        def triton_forward():
            return haloattn.attention(q, k, v, window, backend="triton", **options)

        ref = triton_forward()
        base_ms = do_bench(triton_forward, warmup=25, rep=200, return_mode="median")
        row = {"problem": name, "triton_ms": base_ms, "variants": {}}
        print(f"{name} | triton default | {base_ms:.3f} ms", flush=True)
        for label, q_box, kv_box, stages, masks in variants(problem):
            try:
                out = probe(q, k, v, problem, q_box, kv_box, stages, masks)
                torch.cuda.synchronize()
                err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                ms = do_bench(lambda: probe(q, k, v, problem, q_box, kv_box, stages, masks), warmup=25, rep=200,
                              return_mode="median")
            except Exception as exc:  # a variant that fails is reported, not fatal
                print(f"{name} | {label} | FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            row["variants"][label] = {"ms": ms, "speedup": base_ms / ms, "rel_err_vs_triton": err}
            print(f"{name} | gluon {label} | {ms:.3f} ms | {base_ms / ms:.2f}x triton | err {err:.1e}", flush=True)
        rows.append(row)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.compile_only:
        compile_only()
    else:
        run_gpu(args.json)


if __name__ == "__main__":
    main()
