"""How fast Triton itself runs dense attention on this GPU: the yardstick for the `triton`
backend's rate.

The issue-3 misses are the product of two factors (RESULTS.md, "Targets (issue 3)"): pairs
computed per attended pair (the tiles' waste) and the kernel's rate on the pairs it computes
(0.62-0.79 of cuDNN's dense rate). This script asks whether the second factor is haloattn's
kernel or Triton's compiler: it times, in one process, on one bf16 problem of one dense head
layout ``[B, L, H, D]``:

* ``plain``: a minimal dense flash-attention forward written here in plain Triton (online
  softmax in the log2 domain, one program per 128 or 64 queries and head, no masks at all),
  under every config of CONFIGS (pointer or tensor-descriptor loads); the best is Triton's rate;
* ``haloattn``: the `triton` backend on the same tokens with a window as long as the sequence
  (every query sees every key: the fused neighbourhood kernel with nothing to mask but the walk
  set-up it always pays);
* ``cudnn``: dense SDPA's cuDNN kernel over the same tokens (the issue's yardstick).

Each output is checked against cuDNN's (relative error), medians of ``do_bench``.

    python benchmarks/bench_triton_ceiling.py [--length 16384] [--heads 16] [--head-dim 128] [--json FILE]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import haloattn

# (queries, keys, warps, stages, descriptor loads)
CONFIGS = [(128, 64, 8, 2, False), (128, 64, 8, 3, False), (128, 128, 8, 2, False), (64, 64, 4, 3, False),
           (128, 64, 8, 2, True), (128, 64, 8, 3, True), (128, 128, 8, 2, True), (64, 64, 4, 3, True)]


@triton.jit
def dense_forward(Q, K, V, O, L, H, stride_token, stride_batch, scale_log2,
                  D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DESCRIPTORS: tl.constexpr):
    """One program: BM queries of one (batch, head) against every key, online softmax."""
    start = tl.program_id(0) * BM
    h = tl.program_id(1)
    b = tl.program_id(2)
    base = b.to(tl.int64) * stride_batch + h * D
    rows = start + tl.arange(0, BM)
    cols = tl.arange(0, D)
    if DESCRIPTORS:
        q_desc = tl.make_tensor_descriptor(Q + base, [L, D], [stride_token, 1], [BM, D])
        k_desc = tl.make_tensor_descriptor(K + base, [L, D], [stride_token, 1], [BN, D])
        v_desc = tl.make_tensor_descriptor(V + base, [L, D], [stride_token, 1], [BN, D])
        q = q_desc.load([start, 0])
    else:
        q = tl.load(Q + base + rows[:, None] * stride_token + cols[None, :], mask=rows[:, None] < L, other=0.0)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for step in range(0, tl.cdiv(L, BN)):
        j = step * BN
        keys = j + tl.arange(0, BN)
        if DESCRIPTORS:
            k = k_desc.load([j, 0])
        else:
            k = tl.load(K + base + keys[:, None] * stride_token + cols[None, :], mask=keys[:, None] < L, other=0.0)
        s = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2((m_i - m_new) * scale_log2)
        p = tl.math.exp2(s * scale_log2 - (m_new * scale_log2)[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if DESCRIPTORS:
            v = v_desc.load([j, 0])
        else:
            v = tl.load(V + base + keys[:, None] * stride_token + cols[None, :], mask=keys[:, None] < L, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(O + base + rows[:, None] * stride_token + cols[None, :], out.to(O.dtype.element_ty),
             mask=rows[:, None] < L)


def plain_forward(q, k, v, config):
    bm, bn, warps, stages, descriptors = config
    batch, length, heads, dim = q.shape
    out = torch.empty_like(q)
    grid = (triton.cdiv(length, bm), heads, batch)
    dense_forward[grid](q, k, v, out, length, heads, q.stride(1), q.stride(0), dim ** -0.5 * 1.4426950408889634,
                        D=dim, BM=bm, BN=bn, DESCRIPTORS=descriptors, num_warps=warps, num_stages=stages)
    return out


def relative_error(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    shape = (args.batch, args.length, args.heads, args.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4.0 * args.batch * args.heads * args.head_dim * args.length ** 2
    rows = []

    def timed(name, fn, ref=None):
        out = fn()
        error = relative_error(out, ref) if ref is not None else 0.0
        ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
        rows.append({"method": name, "ms": ms, "tflops": flops / ms * 1e-9, "rel_err": error})
        print(f"{name:42s} {ms:8.3f} ms {flops / ms * 1e-9:7.1f} TFLOP/s  err {error:.1e}", flush=True)
        return out

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                  v.transpose(1, 2)).transpose(1, 2)

    ref = timed("cudnn (dense SDPA)", cudnn)
    timed(f"haloattn triton, window {args.length}",
          lambda: haloattn.attention(q, k, v, args.length, backend="triton"), ref)
    for config in CONFIGS:
        bm, bn, warps, stages, descriptors = config
        name = f"plain Triton {bm}x{bn} w{warps} s{stages} {'desc' if descriptors else 'ptr'}"
        try:
            timed(name, lambda: plain_forward(q, k, v, config), ref)
        except Exception as exc:  # a config that does not compile here (shared memory) is a row, not the run
            print(f"{name}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
    cudnn_rate = rows[0]["tflops"]
    for row in rows:
        row["of_cudnn"] = row["tflops"] / cudnn_rate
    print("\nmethod | ms | TFLOP/s | of cuDNN")
    for row in rows:
        print(f"{row['method']} | {row['ms']:.3f} | {row['tflops']:.0f} | {row['of_cudnn']:.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"shape": shape, "rows": rows, "device": torch.cuda.get_device_name()}, fh, indent=1)


if __name__ == "__main__":
    main()
