"""Neighbourhood attention at the shapes models run, not the issue's benchmark problems.

The issue benchmark (bench_neighborhood.py, bench_cuda.py) times one batch of 16 heads of 128
channels on large windows. Models differ: NAT / DiNAT image backbones run 2-8 heads of 32
channels on 7x7 windows at batch 64, video models 3-D windows of a few frames, long-sequence
models causal sliding windows with grouped-query heads. This script times, per such problem and
bf16, forward and forward+backward of: the dispatcher's own choice (what a user gets with no
backend named, and which backend that is), every fused backend that accepts the problem
(`triton`, `triton_window`, `cuda`), and dense cuDNN SDPA over the same tokens (the efficiency
yardstick of bench_neighborhood.py: effective TFLOP/s over attended pairs, divided by dense's).
Each backend's output is also compared with the reference backend in float32 on the GPU, so a
fast wrong answer cannot pass unseen. With ``--cudagraph`` each backend's calls are also timed as
CUDA-graph replays: device time alone, which on the small problems differs most from
``do_bench``'s (host time included). With ``--autotune`` the dispatcher's backend is also run
tuned (``HALOATTN_AUTOTUNE=1`` with that backend forced, on a fresh tuning cache): how far its
heuristic default is from its best candidate at these shapes (the tuned choices and every
candidate's time go to the JSON file).

    python benchmarks/bench_model_shapes.py [--only 0,3] [--cudagraph] [--autotune] [--json FILE] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_neighborhood import attended_pairs, bench_graph  # noqa: E402

import haloattn  # noqa: E402
from haloattn import tuning  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

# (name, batch, spatial, heads, kv heads, head dim, window, options)
PROBLEMS = [
    ("NAT-T stage 1: 56x56, 7x7, 2 heads of 32, batch 64", 64, (56, 56), 2, 2, 32, 7, {}),
    ("DiNAT-T stage 1: 56x56, 7x7 dilation 8, batch 64", 64, (56, 56), 2, 2, 32, 7, {"dilation": 8}),
    ("NAT-B stage 2: 28x28, 7x7, 8 heads of 32, batch 64", 64, (28, 28), 8, 8, 32, 7, {}),
    ("DiT-style 2-D: 64x64, 17x17, 16 heads of 64, batch 4", 4, (64, 64), 16, 16, 64, 17, {}),
    ("2-D 96x96, 13x13, 8 heads of 128, batch 4", 4, (96, 96), 8, 8, 128, 13, {}),
    ("video 3-D: 16x32x32, 5x9x9, 12 heads of 64, batch 2", 2, (16, 32, 32), 12, 12, 64, (5, 9, 9), {}),
    ("video 3-D causal time: 16x32x32, 5x9x9, batch 2", 2, (16, 32, 32), 12, 12, 64, (5, 9, 9),
     {"causal": (True, False, False)}),
    ("LLM sliding window: 8192, causal 2048, 32 / 8 heads of 128, batch 2", 2, (8192,), 32, 8, 128, 2048,
     {"causal": True}),
    ("Swin-T stage 1: 56x56 windows 7x7 shift 3, 3 heads of 32, batch 64", 64, (56, 56), 3, 3, 32, 7,
     {"pattern": "window", "shift": 3}),
    # Long windows (triton_window's two-kernel long-window path against the neighbourhood kernels)
    ("Swin V2 stage 1: 64x64 windows 16x16 shift 8, 4 heads of 32, batch 32", 32, (64, 64), 4, 4, 32, 16,
     {"pattern": "window", "shift": 8}),
    ("Swin-B 384 stage 1: 96x96 windows 12x12 shift 6, 4 heads of 32, batch 16", 16, (96, 96), 4, 4, 32, 12,
     {"pattern": "window", "shift": 6}),
    # Window 1 on some axes (boxes one token deep there since 2026-12-07)
    ("axial rows: 64x64, 1x63, 8 heads of 64, batch 8", 8, (64, 64), 8, 8, 64, (1, 63), {}),
    ("video per-frame: 16x32x32, 1x9x9, 12 heads of 64, batch 2", 2, (16, 32, 32), 12, 12, 64, (1, 9, 9), {}),
]
FUSED = ("triton", "triton_window", "cuda")
LABELS = ("default", "tuned") + FUSED


@contextmanager
def autotuning():
    """HALOATTN_AUTOTUNE=1 with a fresh tuning cache, for the calls inside."""
    saved = {name: os.environ.get(name) for name in (tuning.AUTOTUNE_ENV, tuning.CACHE_DIR_ENV)}
    with tempfile.TemporaryDirectory() as cache:
        os.environ[tuning.AUTOTUNE_ENV], os.environ[tuning.CACHE_DIR_ENV] = "1", cache
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def bench(fn, grad_to_none=None) -> float:
    return do_bench(fn, warmup=10, rep=60, grad_to_none=grad_to_none, return_mode="median")


def dense_times(batch, heads, tokens, head_dim, device, dtype):
    """cuDNN SDPA over all tokens: forward and forward+backward ms and TFLOP/s."""
    q, k, v = (torch.randn(batch, heads, tokens, head_dim, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    go = torch.randn_like(q)
    flops = 4 * batch * heads * head_dim * tokens * tokens
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        fwd = bench(lambda: F.scaled_dot_product_attention(q, k, v))
        fwdbwd = bench(lambda: F.scaled_dot_product_attention(q, k, v).backward(go), [q, k, v])
    return {"dense_fwd_tflops": flops / fwd / 1e9, "dense_fwdbwd_tflops": 3.5 * flops / fwdbwd / 1e9}


def time_problem(index, cudagraph=False, autotune=False):
    name, batch, spatial, heads, kv_heads, D, window, options = PROBLEMS[index]
    torch.manual_seed(index)
    dtype = torch.bfloat16
    q = torch.randn(batch, *spatial, heads, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, *spatial, kv_heads, D, device="cuda", dtype=dtype) for _ in range(2))
    problem = build_problem(q, k, v, window, **options)
    explanation = haloattn.explain(q, k, v, window, verbose=False, **options)
    fwd_flops = 4 * heads * D * attended_pairs(problem)  # attended_pairs counts the batch
    row = {"problem": name, "default_backend": explanation.chosen,
           "runs": [v.name for v in explanation.verdicts if v.can_run]}
    row.update(dense_times(batch, heads, math.prod(spatial), D, q.device, dtype))

    reference = haloattn.attention(q.float(), k.float(), v.float(), window, backend="reference", **options)
    go = torch.randn_like(q)
    for label, backend in [("default", None)] + [(b, b) for b in FUSED if b in row["runs"]]:
        time_backend(row, label, backend, q, k, v, window, options, go, reference, fwd_flops, cudagraph)
    if autotune:
        with autotuning():
            time_backend(row, "tuned", row["default_backend"], q, k, v, window, options, go, reference, fwd_flops,
                         cudagraph)
            row["tuned_entries"] = {f"needs_grad={needs_grad}": tuning.cached_entry(problem, needs_grad,
                                                                                    row["default_backend"])
                                    for needs_grad in (False, True)}
    return row


def time_backend(row, label, backend, q, k, v, window, options, go, reference, fwd_flops, cudagraph):
    """Error against the reference and times of one backend (None: the dispatcher's choice) into
    ``row[label + "_..."]``."""
    out = haloattn.attention(q, k, v, window, backend=backend, **options)
    row[f"{label}_max_abs_error"] = (out.float() - reference).abs().max().item()
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))

    def fwd():
        return haloattn.attention(q, k, v, window, backend=backend, **options)

    def fwdbwd():
        # Gradients returned, not accumulated into .grad: a CUDA graph cannot reset .grad between
        # its replays, so .backward() would time three extra additions there and not in do_bench.
        out = haloattn.attention(qg, kg, vg, window, backend=backend, **options)
        return torch.autograd.grad(out, (qg, kg, vg), go)

    row[f"{label}_fwd_ms"], row[f"{label}_fwdbwd_ms"] = bench(fwd), bench(fwdbwd)
    if cudagraph:
        bench_graph(row, f"{label}_fwd_graph_ms", fwd)
        bench_graph(row, f"{label}_fwdbwd_graph_ms", fwdbwd)
    for step, flops in (("fwd", fwd_flops), ("fwdbwd", 3.5 * fwd_flops)):
        row[f"{label}_{step}_eff"] = flops / row[f"{label}_{step}_ms"] / 1e9 / row[f"dense_{step}_tflops"]


def graph_ms(row, key):
    if f"{key}_graph_ms" in row:
        return f"{row[f'{key}_graph_ms']:.3f}"
    return "capture failed" if f"{key}_graph_ms_failure" in row else "-"


def markdown(rows):
    lines = ["| problem | default picks | backend | fwd ms | fwd eff | f+b ms | f+b eff | fwd graph ms | f+b graph ms "
             "| max abs err (fp32 ref) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for label in LABELS:
            if f"{label}_fwd_ms" not in row:
                continue
            lines.append(f"| {row['problem']} | {row['default_backend']} | {label} | {row[f'{label}_fwd_ms']:.3f} | "
                         f"{row[f'{label}_fwd_eff']:.2f} | {row[f'{label}_fwdbwd_ms']:.3f} | "
                         f"{row[f'{label}_fwdbwd_eff']:.2f} | {graph_ms(row, f'{label}_fwd')} | "
                         f"{graph_ms(row, f'{label}_fwdbwd')} | {row[f'{label}_max_abs_error']:.1e} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma list of problem indices")
    parser.add_argument("--cudagraph", action="store_true", help="also time CUDA-graph replays (device time)")
    parser.add_argument("--autotune", action="store_true", help="also the default backend tuned (see above)")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    indices = [int(i) for i in args.only.split(",") if i] or range(len(PROBLEMS))
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows = []
    for index in indices:
        rows.append(time_problem(index, args.cudagraph, args.autotune))
        print(json.dumps(rows[-1]), flush=True)
    table = markdown(rows)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
