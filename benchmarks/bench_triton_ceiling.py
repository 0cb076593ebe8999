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

With ``--backward`` the same question for the backward (RESULTS.md's bounds leave the issue's
forward + backward misses open until it is answered): a plain dense flash-attention backward in
the deterministic two-kernel form the `triton` backend uses (a key-major dK/dV kernel and a
query-major dQ kernel, each recomputing P: seven products a pair), under every config of
BACKWARD_CONFIGS, against cuDNN's backward and the `triton` backend's (window = the sequence).
Backward TFLOP/s count 2.5x the forward's work, as bench_neighborhood.py does; the gradients are
checked against cuDNN's.

``--interpret-check`` runs the plain kernels (forward with its LSE, both backward kernels) in
Triton's CPU interpreter on small float32 problems against float64 autograd, so the benchmark's
own kernels can be checked without a GPU (set ``TRITON_INTERPRET=1``).

    python benchmarks/bench_triton_ceiling.py [--length 16384] [--heads 16] [--head-dim 128] [--backward]
        [--json FILE]
    TRITON_INTERPRET=1 python benchmarks/bench_triton_ceiling.py --interpret-check
"""

from __future__ import annotations

import argparse
import json
import os

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
# backward: (query block, key block, warps, stages), both kernels alike: the dK/dV kernel holds the
# key block and streams query blocks, the dQ kernel the reverse
BACKWARD_CONFIGS = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 8, 2), (128, 64, 8, 2), (128, 128, 8, 2),
                    (32, 64, 4, 2), (64, 32, 4, 2)]
LOG2E = 1.4426950408889634


@triton.jit
def dense_forward(Q, K, V, O, LSE, L, H, stride_token, stride_batch, scale_log2,
                  D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DESCRIPTORS: tl.constexpr,
                  STORE_LSE: tl.constexpr = False):
    """One program: BM queries of one (batch, head) against every key, online softmax; with
    STORE_LSE each row's log-sum-exp of the scaled scores, in log2 units, into ``LSE[b, h, row]``
    (what the backward kernels recompute P from)."""
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
    if STORE_LSE:
        tl.store(LSE + (b * H + h).to(tl.int64) * L + rows, m_i * scale_log2 + tl.math.log2(l_i), mask=rows < L)


@triton.jit
def _head_slice(L, stride_batch, D: tl.constexpr):
    """This program's (batch, head): the offset of its ``[L, D]`` slice in the token tensors and of
    its rows in the ``[B, H, L]`` statistics."""
    h = tl.program_id(1)
    b = tl.program_id(2)
    return b.to(tl.int64) * stride_batch + h * D, (b * tl.num_programs(1) + h).to(tl.int64) * L


@triton.jit
def _token_rows(ptr, tokens, stride_token, cols, L):
    """Rows ``tokens`` of a ``[L, D]`` slice (``ptr`` at its start); rows past the end read 0."""
    return tl.load(ptr + tokens[:, None] * stride_token + cols[None, :], mask=tokens[:, None] < L, other=0.0)


@triton.jit
def _row_stats(LSE, DELTA, tokens, L):
    """LSE and delta of rows ``tokens``; rows past the end get an infinite LSE (so P = 0 there)."""
    inside = tokens < L
    return (tl.load(LSE + tokens, mask=inside, other=float("inf")),
            tl.load(DELTA + tokens, mask=inside, other=0.0))


@triton.jit
def dense_backward_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, L, stride_token, stride_batch, scale, scale_log2,
                        D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """One program: dK and dV of BN keys of one (batch, head), every query block in turn (P and
    dP recomputed from the stored LSE and delta = rowsum(dO O); no atomics)."""
    base, stats = _head_slice(L, stride_batch, D)
    keys = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.arange(0, D)
    k = _token_rows(K + base, keys, stride_token, cols, L)
    v = _token_rows(V + base, keys, stride_token, cols, L)
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    for step in range(0, tl.cdiv(L, BM)):
        rows = step * BM + tl.arange(0, BM)
        q = _token_rows(Q + base, rows, stride_token, cols, L)
        do = _token_rows(DO + base, rows, stride_token, cols, L)
        lse, delta = _row_stats(LSE + stats, DELTA + stats, rows, L)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * scale_log2 - lse[None, :])
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        ds_t = p_t * (tl.dot(v, tl.trans(do)) - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    out = base + keys[:, None] * stride_token + cols[None, :]
    tl.store(DK + out, (dk * scale).to(DK.dtype.element_ty), mask=keys[:, None] < L)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys[:, None] < L)


@triton.jit
def dense_backward_dq(Q, K, V, DO, LSE, DELTA, DQ, L, stride_token, stride_batch, scale, scale_log2,
                      D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """One program: dQ of BM queries of one (batch, head), every key block in turn."""
    base, stats = _head_slice(L, stride_batch, D)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.arange(0, D)
    q = _token_rows(Q + base, rows, stride_token, cols, L)
    do = _token_rows(DO + base, rows, stride_token, cols, L)
    lse, delta = _row_stats(LSE + stats, DELTA + stats, rows, L)
    dq = tl.zeros([BM, D], tl.float32)
    for step in range(0, tl.cdiv(L, BN)):
        keys = step * BN + tl.arange(0, BN)
        k = _token_rows(K + base, keys, stride_token, cols, L)
        v = _token_rows(V + base, keys, stride_token, cols, L)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * scale_log2 - lse[:, None])
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    tl.store(DQ + base + rows[:, None] * stride_token + cols[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=rows[:, None] < L)


def _blocks_divide(length, *blocks):
    # the plain kernels mask no key: every key block must lie inside the sequence
    if any(length % block for block in blocks):
        raise ValueError(f"--length {length}: the plain kernels need a multiple of their blocks {blocks}")


def plain_forward(q, k, v, config, with_lse=False):
    """The plain forward's output, and with ``with_lse`` its LSE ([B, H, L], log2 units)."""
    bm, bn, warps, stages, descriptors = config
    batch, length, heads, dim = q.shape
    _blocks_divide(length, bn)
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, length, dtype=torch.float32, device=q.device) if with_lse else out
    grid = (triton.cdiv(length, bm), heads, batch)
    dense_forward[grid](q, k, v, out, lse, length, heads, q.stride(1), q.stride(0), dim ** -0.5 * LOG2E,
                        D=dim, BM=bm, BN=bn, DESCRIPTORS=descriptors, STORE_LSE=with_lse, num_warps=warps,
                        num_stages=stages)
    return (out, lse) if with_lse else out


def plain_backward(q, k, v, out, lse, grad_out, config):
    """(dq, dk, dv) of the plain forward's output: delta = rowsum(dO O), then the dK/dV and dQ
    kernels (all four tensors ``[B, L, H, D]`` with one layout)."""
    bm, bn, warps, stages = config
    batch, length, heads, dim = q.shape
    _blocks_divide(length, bm, bn)
    delta = (grad_out.float() * out.float()).sum(-1).transpose(1, 2).contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    common = (length, q.stride(1), q.stride(0), dim ** -0.5, dim ** -0.5 * LOG2E)
    dense_backward_dkdv[(triton.cdiv(length, bn), heads, batch)](
        q, k, v, grad_out, lse, delta, dk, dv, *common, D=dim, BM=bm, BN=bn, num_warps=warps, num_stages=stages)
    dense_backward_dq[(triton.cdiv(length, bm), heads, batch)](
        q, k, v, grad_out, lse, delta, dq, *common, D=dim, BM=bm, BN=bn, num_warps=warps, num_stages=stages)
    return dq, dk, dv


def interpret_check():
    """The plain kernels in Triton's interpreter against float64 autograd (float32 inputs: the
    interpreter multiplies 16-bit operands as raw bits). Raises on a mismatch."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--interpret-check: run with TRITON_INTERPRET=1")
    from haloattn.backends.triton import interpreter_compat
    interpreter_compat.install()  # in-kernel loop bounds under NumPy >= 2.4
    gen = torch.Generator().manual_seed(0)
    for batch, length, heads, dim, fwd, bwd in ((1, 64, 2, 16, (32, 16, 4, 1, False), (16, 32, 4, 1)),
                                                (2, 96, 1, 32, (16, 32, 4, 1, False), (32, 16, 4, 1))):
        q, k, v, grad_out = (torch.randn(batch, length, heads, dim, generator=gen) for _ in range(4))
        out, lse = plain_forward(q, k, v, fwd, with_lse=True)
        grads = plain_backward(q, k, v, out, lse, grad_out, bwd)
        ref_in = [t.double().requires_grad_() for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in ref_in)).transpose(1, 2)
        ref_lse = torch.logsumexp((ref_in[0].transpose(1, 2) @ ref_in[1].transpose(1, 2).transpose(-1, -2))
                                  * dim ** -0.5, dim=-1) * LOG2E
        ref_grads = torch.autograd.grad(ref, ref_in, grad_out.double())
        errors = {"out": relative_error(out, ref), "lse": relative_error(lse, ref_lse)}
        errors.update({name: relative_error(g, r) for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads)})
        print(f"B={batch} L={length} H={heads} D={dim}: " + ", ".join(f"{n} {e:.1e}" for n, e in errors.items()))
        if not all(e < 1e-5 for e in errors.values()):
            raise SystemExit(f"plain kernels off the float64 reference: {errors}")


def relative_error(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _report(rows, flops_name):
    """Each row's rate as a fraction of the first's (cuDNN), printed as a table."""
    for row in rows:
        row["of_cudnn"] = row["tflops"] / rows[0]["tflops"]
    print(f"\nmethod | ms | {flops_name} TFLOP/s | of cuDNN")
    for row in rows:
        print(f"{row['method']} | {row['ms']:.3f} | {row['tflops']:.0f} | {row['of_cudnn']:.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--backward", action="store_true", help="time the backward instead of the forward")
    parser.add_argument("--interpret-check", action="store_true",
                        help="check the plain kernels in the CPU interpreter (TRITON_INTERPRET=1) and stop")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.interpret_check:
        interpret_check()
        return
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    shape = (args.batch, args.length, args.heads, args.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4.0 * args.batch * args.heads * args.head_dim * args.length ** 2
    if args.backward:
        flops *= 2.5
    rows = []

    def timed(name, fn, ref=None):
        out = fn()
        outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
        error = max(relative_error(o, r) for o, r in zip(outs, refs)) if ref is not None else 0.0
        ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
        rows.append({"method": name, "ms": ms, "tflops": flops / ms * 1e-9, "rel_err": error})
        print(f"{name:42s} {ms:8.3f} ms {flops / ms * 1e-9:7.1f} TFLOP/s  err {error:.1e}", flush=True)
        return out

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                  v.transpose(1, 2)).transpose(1, 2)

    if args.backward:
        grad_out = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]

        def backward_of(forward):
            out = forward(*leaves)
            return lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True)

        def cudnn_forward(q_, k_, v_):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q_.transpose(1, 2), k_.transpose(1, 2),
                                                      v_.transpose(1, 2)).transpose(1, 2)

        ref = timed("cudnn backward (dense SDPA)", backward_of(cudnn_forward))
        timed(f"haloattn triton backward, window {args.length}",
              backward_of(lambda q_, k_, v_: haloattn.attention(q_, k_, v_, args.length, backend="triton")), ref)
        out, lse = plain_forward(q, k, v, (64, 64, 4, 3, False), with_lse=True)
        for config in BACKWARD_CONFIGS:
            bm, bn, warps, stages = config
            name = f"plain Triton backward {bm}x{bn} w{warps} s{stages}"
            try:
                timed(name, lambda: plain_backward(q, k, v, out, lse, grad_out, config), ref)
            except Exception as exc:  # a config that does not compile here is a row, not the run
                print(f"{name}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
        _report(rows, "backward")
    else:
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
        _report(rows, "forward")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"shape": shape, "backward": args.backward, "rows": rows,
                       "device": torch.cuda.get_device_name()}, fh, indent=1)


if __name__ == "__main__":
    main()
