"""Backend ``cuda`` against backend ``triton`` and dense cuDNN SDPA on bench_neighborhood's problems.

Effective TFLOP/s count attended pairs only (4 * B * H * D * pairs forward, 3.5x that forward +
backward); efficiency = effective TFLOP/s / dense cuDNN TFLOP/s over the same tokens, as in
bench_neighborhood.py; the backward's alone (2.5x the forward's pairs, forward + backward time
minus forward time, against dense cuDNN's likewise) as issue 5 states its backward target. Also reports the cuda output's relative difference from triton's, and the
forward time of the cuda backend's portable (mma.sync) kernel and its forward + backward time with
the portable backward beside its defaults (on sm_90 the Hopper wgmma kernels;
HALOATTN_CUDA_FORWARD and HALOATTN_CUDA_BACKWARD pick them).

    python benchmarks/bench_cuda.py [--only 1,5,8] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import haloattn
from bench_neighborhood import BATCH, HEADS, PROBLEMS, attended_pairs, bench
from gradient_calls import forward_backward
from haloattn.problem import build_problem


def with_kernel(variable, kernel, run):
    """run() with HALOATTN_CUDA_FORWARD or HALOATTN_CUDA_BACKWARD (`variable`) set to `kernel`."""
    os.environ[variable] = kernel
    try:
        return run()
    finally:
        del os.environ[variable]


def time_backend(name, q, k, v, window, options):
    fwd = bench(lambda: haloattn.attention(q, k, v, window, backend=name, **options))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    go = torch.randn_like(q)
    fwd_bwd = bench(forward_backward(lambda: haloattn.attention(qg, kg, vg, window, backend=name, **options),
                                     [qg, kg, vg], go))
    return fwd, fwd_bwd


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="0,1,2,3,4,5,6,7,8,9", help="comma list of problem indices (bench_neighborhood.PROBLEMS)")
    parser.add_argument("--json")
    parser.add_argument("--no-portable", action="store_true", help="skip the portable kernels' timings (A/B runs)")
    args = parser.parse_args()
    rows = []
    for index in (int(i) for i in args.only.split(",") if i):
        name, spatial, window, options, D = PROBLEMS[index]
        torch.manual_seed(index)
        q, k, v = (torch.randn(BATCH, *spatial, HEADS, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        problem = build_problem(q, k, v, window, **options)
        flops = 4 * BATCH * HEADS * D * attended_pairs(problem)
        N = problem.tokens
        dq, dk, dv = (torch.randn(BATCH, HEADS, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dgo = torch.randn_like(dq)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            dense_f = bench(lambda: F.scaled_dot_product_attention(dq, dk, dv))
            dense_b = bench(forward_backward(lambda: F.scaled_dot_product_attention(dq, dk, dv), [dq, dk, dv], dgo))
        dense_flops = 4 * BATCH * HEADS * D * N * N
        # The dense backward alone (forward + backward minus forward), for issue 5's backward target.
        row = {"problem": name, "dense_fwd_tflops": dense_flops / dense_f / 1e9,
               "dense_fwdbwd_tflops": 3.5 * dense_flops / dense_b / 1e9,
               "dense_bwd_tflops": 2.5 * dense_flops / (dense_b - dense_f) / 1e9}
        outs = {}
        for backend in ("cuda", "triton"):
            try:
                outs[backend] = haloattn.attention(q, k, v, window, backend=backend, **options)
                f, fb = time_backend(backend, q, k, v, window, options)
            except Exception as exc:  # report and go on: one backend failing must not hide the other
                row[f"{backend}_error"] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            row.update({
                f"{backend}_fwd_ms": f, f"{backend}_fwdbwd_ms": fb,
                f"{backend}_fwd_eff": flops / f / 1e9 / row["dense_fwd_tflops"],
                f"{backend}_fwdbwd_eff": 3.5 * flops / fb / 1e9 / row["dense_fwdbwd_tflops"],
                f"{backend}_bwd_eff": 2.5 * flops / (fb - f) / 1e9 / row["dense_bwd_tflops"],
            })
        if "cuda_fwd_ms" in row and not args.no_portable:
            try:
                row["cuda_portable_fwd_ms"] = with_kernel(
                    "HALOATTN_CUDA_FORWARD", "portable",
                    lambda: bench(lambda: haloattn.attention(q, k, v, window, backend="cuda", **options)))
                row["cuda_portable_bwd_fwdbwd_ms"] = with_kernel(
                    "HALOATTN_CUDA_BACKWARD", "portable", lambda: time_backend("cuda", q, k, v, window, options)[1])
            except Exception as exc:
                row["cuda_portable_error"] = f"{type(exc).__name__}: {exc}"[:300]
        if "cuda_fwd_ms" in row and "triton_fwd_ms" in row:
            row["cuda_speedup_fwd"] = row["triton_fwd_ms"] / row["cuda_fwd_ms"]
            row["cuda_speedup_fwdbwd"] = row["triton_fwdbwd_ms"] / row["cuda_fwdbwd_ms"]
        if len(outs) == 2:
            a, b = outs["cuda"].float(), outs["triton"].float()
            row["cuda_vs_triton_rel_diff"] = ((a - b).norm() / b.norm()).item()
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, dq, dk, dv, dgo, outs
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print_table(rows)


def print_table(rows):
    """A compact closing table (the device reply carries only the end of the output)."""
    def cell(row, key, fmt):
        return format(row[key], fmt) if key in row else "-"

    print("problem | cuda fwd ms | eff | triton fwd ms | eff | cuda/triton fwd | portable fwd ms | cuda f+b ms | eff | "
          "triton f+b ms | eff | cuda/triton f+b | bwd eff cuda | triton | f+b with portable bwd ms | diff")
    for r in rows:
        print(" | ".join([
            r["problem"], cell(r, "cuda_fwd_ms", ".3f"), cell(r, "cuda_fwd_eff", ".2f"), cell(r, "triton_fwd_ms", ".3f"),
            cell(r, "triton_fwd_eff", ".2f"), cell(r, "cuda_speedup_fwd", ".2f"), cell(r, "cuda_portable_fwd_ms", ".3f"),
            cell(r, "cuda_fwdbwd_ms", ".2f"),
            cell(r, "cuda_fwdbwd_eff", ".2f"), cell(r, "triton_fwdbwd_ms", ".2f"), cell(r, "triton_fwdbwd_eff", ".2f"),
            cell(r, "cuda_speedup_fwdbwd", ".2f"), cell(r, "cuda_bwd_eff", ".2f"), cell(r, "triton_bwd_eff", ".2f"),
            cell(r, "cuda_portable_bwd_fwdbwd_ms", ".2f"),
            cell(r, "cuda_vs_triton_rel_diff", ".1e"),
        ]))
        for key in ("cuda_error", "triton_error", "cuda_portable_error"):
            if key in r:
                print("   ", key, r[key][:200])


if __name__ == "__main__":
    main()
