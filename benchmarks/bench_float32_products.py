"""Backend ``triton`` on float32 without TF32: products on CUDA cores (``input_precision="ieee"``)
against three TF32 products on the tensor cores (``"tf32x3"``), side by side.

Per problem: forward and backward (dQ, dK, dV) as CUDA-graph replays for each precision with the
small backward tiles of exact float32 (tiles.EXACT_FLOAT32_RESIDENT) and, for tf32x3, also the
16-bit default's tiles; each output's and gradient's error relative to the float64 reference
(norm-wise, SEMANTICS.md section 7: float32 allows 1e-5); and dense SDPA in float32 over the same
tokens for scale (what a user of full attention in float32 gets).

    python benchmarks/bench_float32_products.py [--json FILE] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

import haloattn
from haloattn.backend import AttentionInputs
from haloattn.backends.triton import launch, tiles
from haloattn.problem import build_problem

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PROBLEMS = [  # (name, batch, spatial, window, options, head_dim, heads)
    ("2-D 64x64, 13x13, D=32", 2, (64, 64), 13, {}, 32, 8),
    ("2-D 64x64, 13x13, D=64", 2, (64, 64), 13, {}, 64, 8),
    ("2-D 64x64, 13x13, D=128", 2, (64, 64), 13, {}, 128, 8),
    ("1-D 4096, window 255, D=64", 2, (4096,), 255, {}, 64, 8),
    ("3-D 19x31x13, 9x17x10 causal last axis, D=128", 1, (19, 31, 13), (9, 17, 10),
     {"causal": (False, False, True)}, 128, 8),
]
NEEDS = (True, True, True, False, False, False, False)
VARIANTS = [  # (label, precision, backward tiles of exact float32)
    ("ieee", "ieee", True),
    ("tf32x3", "tf32x3", True),
    ("tf32x3, 16-bit tiles", "tf32x3", False),
]


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def run_problem(name, batch, spatial, window, options, D, heads):
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, *spatial, heads, D, device="cuda") for _ in range(3))
    go = torch.randn_like(q)
    problem = build_problem(q, k, v, window, **options)
    inputs = AttentionInputs(q, k, v)
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = haloattn.attention(*leaves, window, backend="reference", **options)
    ref_grads = torch.autograd.grad(ref, leaves, go.double())
    row = {"problem": name}
    for label, precision, small in VARIANTS:
        os.environ[launch.FLOAT32_PRODUCTS_ENV] = precision
        cfg = tiles.default_config(problem, exact_float32=small)
        out, lse = launch.forward(problem, inputs, cfg)
        grads = launch.backward(problem, inputs, out, lse, go, None, NEEDS, cfg)[:3]
        row[f"{label} error"] = max([rel(out, ref)] + [rel(g, r) for g, r in zip(grads, ref_grads)])
        row[f"{label} fwd ms"] = do_bench_cudagraph(lambda: launch.forward(problem, inputs, cfg), rep=60,
                                                    return_mode="median")
        row[f"{label} bwd ms"] = do_bench_cudagraph(
            lambda: launch.backward(problem, inputs, out, lse, go, None, NEEDS, cfg), rep=60, return_mode="median")
    os.environ.pop(launch.FLOAT32_PRODUCTS_ENV)
    tokens = math.prod(spatial)
    dq, dk, dv = (torch.randn(batch, heads, tokens, D, device="cuda", requires_grad=True) for _ in range(3))
    dgo = torch.randn(batch, heads, tokens, D, device="cuda")
    row["dense fp32 SDPA fwd ms"] = do_bench_cudagraph(lambda: F.scaled_dot_product_attention(dq, dk, dv), rep=60,
                                                       return_mode="median")
    row["dense fp32 SDPA f+b ms"] = do_bench_cudagraph(
        lambda: torch.autograd.grad(F.scaled_dot_product_attention(dq, dk, dv), (dq, dk, dv), dgo), rep=60,
        return_mode="median")
    return row


def markdown(rows):
    head = ["problem"] + [f"{label} {what}" for label, _, _ in VARIANTS for what in ("fwd ms", "bwd ms", "error")]
    head += ["dense fp32 SDPA fwd ms", "dense fp32 SDPA f+b ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["problem"]] + [f"{row[h]:.1e}" if h.endswith("error") else f"{row[h]:.3f}" for h in head[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows = []
    for problem in PROBLEMS:
        rows.append(run_problem(*problem))
        print(json.dumps(rows[-1]), flush=True)
    table = markdown(rows)
    print(table)
    for path, text in ((args.json, json.dumps(rows, indent=1)), (args.markdown, table + "\n")):
        if path:
            with open(path, "w") as f:
                f.write(text)


if __name__ == "__main__":
    main()
