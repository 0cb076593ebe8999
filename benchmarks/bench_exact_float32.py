"""Backend ``triton`` on float32 without tf32 (exact products on CUDA cores, ``tl.dot`` with
``input_precision="ieee"``): the backward with its default tiles against smaller ones, and the
forward with 64-, 32- and 16-token query tiles.

These kernels multiply on CUDA cores, so a product tile's accumulators and operands live in
registers; 64-token tiles spill (the dK/dV kernel compiled to 32 registers and 11-54 KB of spill
stores at head dims 32-128 on sm_90). Times CUDA-graph replays of each backward per config and
checks the gradients agree.

    python benchmarks/bench_exact_float32.py [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from triton.testing import do_bench_cudagraph

from haloattn.backend import AttentionInputs
from haloattn.backends.triton import launch, tiles
from haloattn.problem import build_problem

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernel_variants import write_json  # noqa: E402

PROBLEMS = [  # (name, spatial, window, options, head_dim, heads)
    ("2-D 64x64, 13x13, D=32", (64, 64), 13, {}, 32, 8),
    ("2-D 64x64, 13x13, D=64", (64, 64), 13, {}, 64, 8),
    ("2-D 64x64, 13x13, D=128", (64, 64), 13, {}, 128, 8),
    ("1-D 4096, window 255, D=64", (4096,), 255, {}, 64, 8),
    ("3-D 8x24x24, 3x7x7, D=64", (8, 24, 24), (3, 7, 7), {}, 64, 8),
]
NEEDS = (True, True, True, False, False, False, False)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for name, spatial, window, options, d, heads in PROBLEMS:
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, *spatial, heads, d, device="cuda") for _ in range(3))
        problem = build_problem(q, k, v, window, **options)
        inputs = AttentionInputs(q, k, v)
        out, lse = launch.forward(problem, inputs)
        go = torch.randn_like(out)
        default = tiles.default_config(problem, exact_float32=False)
        exact = tiles.default_config(problem, exact_float32=True)
        row = {"problem": name}
        grads = {}
        for label, cfg in (("default", default), ("exact-float32 tiles", exact)):
            run = lambda cfg=cfg: launch.backward(problem, inputs, out, lse, go, None, NEEDS, cfg)[:3]
            grads[label] = run()
            row[label] = do_bench_cudagraph(run, rep=100, return_mode="median")
        ext = tiles.group_extents(problem)
        for tokens in (64, 32, 16):  # forward query tiles against 32-token key tiles, 4 warps
            fwd = dict(default["fwd"], q=tiles.fit(default["fwd"]["q"], ext, tokens),
                       kv=tiles.fit(default["fwd"]["kv"], ext, 32 if tokens < 64 else 64))
            cfg = dict(default, fwd=fwd)
            row[f"forward q{tokens}"] = do_bench_cudagraph(lambda cfg=cfg: launch.forward(problem, inputs, cfg),
                                                           rep=100, return_mode="median")
        print(f"{name}: forward " + ", ".join(f"{k[8:]} {v:.3f} ms" for k, v in row.items() if k.startswith("forward")),
              flush=True)
        diff = max(((a - b).norm() / b.norm()).item() for a, b in zip(grads["exact-float32 tiles"], grads["default"]))
        row["speedup"] = row["default"] / row["exact-float32 tiles"]
        rows.append(row)
        print(f"{name}: backward {row['default']:.3f} -> {row['exact-float32 tiles']:.3f} ms "
              f"({row['speedup']:.2f}x), gradients differ by {diff:.1e}; tiles dq {exact['dq']['q']}/{exact['dq']['kv']}, "
              f"dkdv {exact['dkdv']['kv']}/{exact['dkdv']['q']}", flush=True)
        write_json(args.json, rows)


if __name__ == "__main__":
    main()
