"""Can a Gluon forward beat Triton's dense ceiling on Hopper? A probe, not a backend.

Every issue-3 forward miss is the product of the tiles' waste and the kernel's rate on the pairs
it computes, and that rate is capped by the best plain dense flash loop Triton 3.6 generates: 0.80
of cuDNN at 128 channels (RESULTS.md, "Triton's own ceiling beside the kernel"). Triton does not
produce FlashAttention-3's structure for it (its automatic warp specialisation left the loop as it
was). Gluon, Triton's lower-level dialect, lets a kernel state that structure itself:

* a producer warp issues the TMA loads of K and V into a ring of ``STAGES`` shared-memory slots,
  handing them over with mbarriers (``_producer``);
* one or two consumer warpgroups of 64 query rows each (two: one in the default partition, one
  a worker, so each arrives on the slot's "empty" barrier itself, sharing every K/V tile) run the
  wgmma products and the online softmax on their rows (``_consumer``), with P handed to the
  second product from registers; one consumer runs on 64- or 128-key tiles, two programs a
  multiprocessor (``VARIANTS``);
* with ``PIPELINE`` a consumer issues the next tile's S = Q K^T before the current tile's
  O += P V and computes the softmax while the latter runs (FlashAttention-3's intra-warpgroup
  overlap; without it every product is waited for at once).

Problems: dense attention over ``[B, L, H, D]`` (bf16) and the 1-D neighbourhood of SEMANTICS.md
(window ``w``, no dilation, not causal: query ``i`` sees keys ``[s, s + w)`` with
``s = clamp(i - w // 2, 0, L - w)``), the walk visiting the key tiles its 128 queries' windows
touch and masking only tiles some row of the consumer does not fully see. Sequence lengths must
be multiples of 128 (the probe's descriptors span the flattened ``[B * L, H * D]`` view).

    python benchmarks/gluon_forward_probe.py --compile-only       # build for sm_90 on any machine
    python benchmarks/gluon_forward_probe.py [--json FILE]         # on a Hopper GPU: check and time

The GPU run checks each variant against SDPA (relative error) and times it with ``do_bench``
beside cuDNN, Triton's plain dense loop (bench_triton_ceiling.py) and the ``triton`` backend.
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

from haloattn.backends.triton.gluon_ring import accumulator_layout, allocate_ring, probabilities_layout

LOG2E = 1.4426950408889634
HALF_ROWS = 64  # query rows per consumer warpgroup (wgmma's M)
KEYS = 128  # keys per tile


@gluon.jit
def _window_start(i, L, window):
    """First key of query ``i``'s 1-D neighbourhood (window clamped inside the sequence)."""
    return gl.minimum(gl.maximum(i - window // 2, 0), L - window)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty,
              q_row, kv_row, col, first_tile, n_tiles, BN: gl.constexpr, STAGES: gl.constexpr,
              CONSUMERS: gl.constexpr):
    for half in gl.static_range(CONSUMERS):
        mbarrier.expect(q_ready.index(half), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row + half * q_desc.block_type.shape[0], col],
                                        q_ready.index(half), q_smem.index(half))
    for i in range(n_tiles):
        slot = i % STAGES
        # mbarriers start with phase 1 complete: the first pass over the ring does not wait
        empty_phase = ((i // STAGES) & 1) ^ 1
        row = kv_row + (first_tile + i) * BN
        mbarrier.wait(k_empty.index(slot), empty_phase)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row, col], k_ready.index(slot), k_bufs.index(slot))
        mbarrier.wait(v_empty.index(slot), empty_phase)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [row, col], v_ready.index(slot), v_bufs.index(slot))


@gluon.jit
def _scores_masked(s, first_query, tile_key, L, window, BMH: gl.constexpr, BN: gl.constexpr,
                   s_layout: gl.constexpr):
    """``s`` with -inf where a row's 1-D window does not hold the key."""
    rows = first_query + gl.arange(0, BMH, layout=gl.SliceLayout(1, s_layout))
    keys = tile_key + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    start = gl.expand_dims(_window_start(rows, L, window), 1)
    keys2 = gl.expand_dims(keys, 0)
    inside = (keys2 >= start) & (keys2 < start + window)
    return gl.where(inside, s, float("-inf"))


@gluon.jit
def _tile_needs_mask(first_query, tile_key, L, window, WINDOWED: gl.constexpr, BMH: gl.constexpr,
                     BN: gl.constexpr):
    """Whether some row of the half misses some key of the tile (window starts grow with the row)."""
    if WINDOWED:
        last_start = _window_start(first_query + BMH - 1, L, window)
        first_end = _window_start(first_query, L, window) + window
        return (tile_key < last_start) | (tile_key + BN > first_end)
    else:
        return False


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale, first_query, tile_key, L, window, WINDOWED: gl.constexpr,
                  BMH: gl.constexpr, BN: gl.constexpr, s_layout: gl.constexpr):
    """One tile of the online softmax in log2 units: (P unnormalised, new maxima, new sums, alpha)."""
    if _tile_needs_mask(first_query, tile_key, L, window, WINDOWED, BMH, BN):
        s = _scores_masked(s, first_query, tile_key, L, window, BMH, BN, s_layout)
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    # rows that have seen no key yet keep -inf maxima: subtract 0 there instead of -inf
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_safe, 1))
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_new, alpha


@gluon.jit
def _consumer(o_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty,
              q_row, col, q_start, first_tile, n_tiles, L, window, qk_scale,
              HALF: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, WINDOWED: gl.constexpr,
              PIPELINE: gl.constexpr):
    BMH: gl.constexpr = o_desc.block_type.shape[0]
    D: gl.constexpr = o_desc.block_type.shape[1]
    s_layout: gl.constexpr = accumulator_layout(BN)
    o_layout: gl.constexpr = accumulator_layout(D)
    p_layout: gl.constexpr = probabilities_layout(o_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = o_desc.dtype

    q = q_smem.index(HALF)
    first_query = q_start + HALF * BMH
    m_i = gl.full([BMH], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BMH], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BMH, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BMH, BN], gl.float32, layout=s_layout)
    mbarrier.wait(q_ready.index(HALF), 0)

    if PIPELINE:
        # tile 0's scores and softmax before the loop; each step then issues tile i's S, tile
        # i-1's O += P V, and runs tile i's softmax while the latter is on the tensor cores
        mbarrier.wait(k_ready.index(0), 0)
        s = warpgroup_mma(q, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s, ))
        mbarrier.arrive(k_empty.index(0), count=1)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, first_query, first_tile * BN, L, window,
                                           WINDOWED, BMH, BN, s_layout)
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        for i in range(1, n_tiles):
            slot = i % STAGES
            prev = (i - 1) % STAGES
            mbarrier.wait(k_ready.index(slot), (i // STAGES) & 1)
            s = warpgroup_mma(q, k_bufs.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(prev), ((i - 1) // STAGES) & 1)
            acc = warpgroup_mma(p16, v_bufs.index(prev), acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s, ))
            mbarrier.arrive(k_empty.index(slot), count=1)
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, first_query, (first_tile + i) * BN, L,
                                               window, WINDOWED, BMH, BN, s_layout)
            acc, p16 = warpgroup_mma_wait(0, deps=(acc, p16))
            mbarrier.arrive(v_empty.index(prev), count=1)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
            p16 = gl.convert_layout(p.to(dtype), p_layout)
        last = (n_tiles - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
        acc = warpgroup_mma(p16, v_bufs.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, p16))[0]
        mbarrier.arrive(v_empty.index(last), count=1)
    else:
        for i in range(n_tiles):
            slot = i % STAGES
            phase = (i // STAGES) & 1
            mbarrier.wait(k_ready.index(slot), phase)
            s = warpgroup_mma(q, k_bufs.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s, ))
            mbarrier.arrive(k_empty.index(slot), count=1)
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, first_query, (first_tile + i) * BN, L,
                                               window, WINDOWED, BMH, BN, s_layout)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
            p16 = gl.convert_layout(p.to(dtype), p_layout)
            mbarrier.wait(v_ready.index(slot), phase)
            acc = warpgroup_mma(p16, v_bufs.index(slot), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc, p16))[0]
            mbarrier.arrive(v_empty.index(slot), count=1)

    out = acc / gl.expand_dims(gl.convert_layout(l_i, o_rows), 1)
    # Q's slot is free once every product has completed: the output goes out through it
    q.store(out.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row + HALF * BMH, col], q)
    tma.store_wait(0)


@gluon.jit
def probe_forward(q_desc, k_desc, v_desc, o_desc, L, window, qk_scale, BN: gl.constexpr, STAGES: gl.constexpr,
                  WINDOWED: gl.constexpr, PIPELINE: gl.constexpr, CONSUMERS: gl.constexpr,
                  CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    """One program: 64 queries per consumer warpgroup (1 or 2) of one (batch, head), one producer warp."""
    BMH: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    q_start = gl.program_id(0) * (CONSUMERS * BMH)
    col = gl.program_id(1) * D
    kv_row = gl.program_id(2) * L
    q_row = kv_row + q_start
    if WINDOWED:
        first_tile = _window_start(q_start, L, window) // BN
        end_tile = gl.cdiv(_window_start(q_start + CONSUMERS * BMH - 1, L, window) + window, BN)
    else:
        first_tile = gl.to_tensor(0)
        end_tile = gl.cdiv(L, BN)
    n_tiles = end_tile - first_tile

    q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty = allocate_ring(
        q_desc, k_desc, v_desc, CONSUMERS, STAGES, 1)

    # (tuples spelt out: adding tuples in a kernel drops the constexpr wrappers workers need)
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_consumer, (o_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty, q_row, col,
                         q_start, first_tile, n_tiles, L, window, qk_scale, 0, BN, STAGES, WINDOWED, PIPELINE)),
            (_consumer, (o_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty, q_row, col,
                         q_start, first_tile, n_tiles, L, window, qk_scale, 1, BN, STAGES, WINDOWED, PIPELINE)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready,
                         v_empty, q_row, kv_row, col, first_tile, n_tiles, BN, STAGES, CONSUMERS)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (o_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready, v_empty, q_row, col,
                         q_start, first_tile, n_tiles, L, window, qk_scale, 0, BN, STAGES, WINDOWED, PIPELINE)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, k_empty, v_ready,
                         v_empty, q_row, kv_row, col, first_tile, n_tiles, BN, STAGES, CONSUMERS)),
        ], [1], [PRODUCER_REGS])


# (name, consumer warpgroups, keys a tile, stages, pipelined, consumer registers (2 consumers: the
# worker's), producer registers, maxnreg (None: the compiler's)). One consumer with 64-key tiles
# is the 2-D neighbourhood's building block (the triton backend's 2-D defaults are 64 x 64 tiles);
# its maxnreg of 128 lets two programs share a multiprocessor.
VARIANTS = [("2wg 128k s2", 2, 128, 2, False, 240, 24, None), ("2wg 128k s2 pipelined", 2, 128, 2, True, 240, 24, None),
            ("2wg 128k s3 pipelined", 2, 128, 3, True, 232, 24, None),
            ("1wg 64k s2 pipelined", 1, 64, 2, True, None, 24, 128),
            ("1wg 64k s3 pipelined", 1, 64, 3, True, None, 24, 128),
            ("1wg 128k s2 pipelined", 1, 128, 2, True, None, 24, 128)]


def _descriptors(q, k, v, out, consumers, keys):
    batch, length, heads, dim = q.shape
    if length % (consumers * HALF_ROWS) or length % keys:
        raise ValueError(f"L={length}: the probe needs a multiple of {consumers * HALF_ROWS} and {keys}")
    gl_dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[q.dtype]
    q_layout = gl.NVMMASharedLayout.get_default_for([HALF_ROWS, dim], gl_dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([keys, dim], gl_dtype)

    def flat(t, block, layout):
        view = t.reshape(batch * length, heads * dim)
        return TensorDescriptor(view, list(view.shape), list(view.stride()), block, layout)

    return (flat(q, [HALF_ROWS, dim], q_layout), flat(k, [keys, dim], kv_layout),
            flat(v, [keys, dim], kv_layout), flat(out, [HALF_ROWS, dim], q_layout))


def _kernel_args(q, k, v, out, window, variant):
    _, consumers, keys, stages, pipeline, consumer_regs, producer_regs, maxnreg = variant
    length = q.shape[1]
    descs = _descriptors(q, k, v, out, consumers, keys)
    windowed = window is not None and window < length
    options = dict(num_warps=4)
    if maxnreg:
        options["maxnreg"] = maxnreg
    return (*descs, length, window if windowed else length, q.shape[-1] ** -0.5 * LOG2E), dict(
        BN=keys, STAGES=stages, WINDOWED=windowed, PIPELINE=pipeline, CONSUMERS=consumers,
        CONSUMER_REGS=consumer_regs or 0, PRODUCER_REGS=producer_regs, **options)


def probe(q, k, v, window=None, variant=VARIANTS[1]):
    """The probe's output for ``[B, L, H, D]`` inputs (dense where ``window`` is None)."""
    batch, length, heads, _ = q.shape
    out = torch.empty_like(q)
    args, meta = _kernel_args(q, k, v, out, window, variant)
    probe_forward[(length // (variant[1] * HALF_ROWS), heads, batch)](*args, **meta)
    return out


def compile_only(shape, window):
    """Build every variant for sm_90 (no GPU needed) and print registers, spills and shared memory."""
    from gluon_compile import build_sm90, report

    q = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    for variant in VARIANTS:
        args, meta = _kernel_args(q, q, q, q, window, variant)
        report(f"{variant[0]} (window {window})", build_sm90(probe_forward, args, meta))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.compile_only:
        compile_only((1, 16384, 16, 128), None)
        compile_only((1, 32768, 16, 128), 2047)
        return
    run_gpu(args.json)


def run_gpu(json_path):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    import haloattn
    from bench_triton_ceiling import CONFIGS, plain_forward

    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    # (name, B, L, H, D, window): dense yardstick, the 1-D row, and off-list shapes
    problems = [("dense L=16384", 1, 16384, 16, 128, None), ("dense B=2 L=4096 H=8", 2, 4096, 8, 128, None),
                ("1-D L=32768 w=2047 (issue)", 1, 32768, 16, 128, 2047),
                ("1-D L=8192 w=513 B=2", 2, 8192, 8, 128, 513), ("dense D=64 L=16384", 1, 16384, 16, 64, None)]
    for name, batch, length, heads, dim, window in problems:
        shape = (batch, length, heads, dim)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        if window is None:
            pairs = length * length
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                def cudnn():
                    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                          v.transpose(1, 2)).transpose(1, 2)
                ref = cudnn()
                cudnn_ms = do_bench(cudnn, warmup=50, rep=300, return_mode="median")
        else:
            pairs = length * window
            ref = haloattn.attention(q, k, v, window=window, backend="reference") if length <= 8192 else None
            dense_q = q[:, :16384]
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                cudnn_ms = do_bench(lambda: F.scaled_dot_product_attention(
                    dense_q.transpose(1, 2), dense_q.transpose(1, 2), dense_q.transpose(1, 2)),
                    warmup=50, rep=300, return_mode="median")
            # cuDNN's dense rate at 16384 tokens: the yardstick
            cudnn_ms *= pairs / (16384 * min(length, 16384))
        flops = 4.0 * batch * heads * dim * pairs
        result = {"problem": name, "cudnn_tflops": flops / cudnn_ms * 1e-9, "methods": {}}
        candidates = [(variant[0], (lambda variant=variant: probe(q, k, v, window, variant))) for variant in VARIANTS]
        candidates.append(("haloattn triton", lambda: haloattn.attention(q, k, v, window=window or length,
                                                                         backend="triton")))
        if window is None:
            for config in CONFIGS:
                candidates.append((f"triton plain {config}", lambda config=config: plain_forward(q, k, v, config)))
        if ref is None:
            ref = haloattn.attention(q, k, v, window=window, backend="triton")
        for label, fn in candidates:
            try:
                out = fn()
                torch.cuda.synchronize()
                err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
            except Exception as exc:  # a variant that fails to build is reported, not fatal
                print(f"{name} | {label} | FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            tflops = flops / ms * 1e-9
            result["methods"][label] = {"ms": ms, "tflops": tflops, "of_cudnn": tflops / result["cudnn_tflops"],
                                        "rel_err": err}
            print(f"{name} | {label} | {ms:.3f} ms | {tflops:.0f} TFLOP/s | {tflops / result['cudnn_tflops']:.2f} "
                  f"of cuDNN | err {err:.1e}", flush=True)
        rows.append(result)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
