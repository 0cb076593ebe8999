"""Backend ``triton`` on float32 without TF32 (three TF32 products, "tf32x3"): the forward's tile
choices side by side, at head dims 8-256: the measurements behind tiles.EXACT_FLOAT32_FORWARD_TILES
(16 queries, 32 keys: on 4 warps above 128 channels, on 2 from 32 to 128) and behind keeping the
16-bit tiles on narrower heads.

The 2026-12-01 shape sweep (RESULTS.md) found float32 problems at head dim 256 forward at 0.5-1 %
of cuDNN's bfloat16 rate, 3x below float32's own rate at head dim 128: the 16-bit cost model's
32-query tiles, fitted to shared memory, spill 2.7 KB a thread there (sm_90 compile report). Per
problem this times (CUDA-graph medians) the default forward, the 16-bit default's forward tiles
(what float32 ran before 2026-12-01) and each config of FORWARD_CANDIDATES, and
the default backward; checks every forward's output against the float64 reference (SEMANTICS.md:
float32 within 1e-5); and times dense float32 SDPA over the same tokens for scale.

    python benchmarks/bench_float32_forward_tiles.py [--only 0,5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

import haloattn
from haloattn.backend import AttentionInputs
from haloattn.backends.triton import launch, tiles
from haloattn.problem import build_problem

PROBLEMS = [  # (name, batch, spatial, window, options, head_dim, heads, kv_heads)
    ("2-D 145x138, 22x18, D=256", 4, (145, 138), (22, 18), {}, 256, 4, 4),
    ("3-D 11x47x30, 11^3 dil 1x1x2 causal cc- stride 11x7x10, GQA 12/3, D=256", 1, (11, 47, 30), 11,
     {"dilation": (1, 1, 2), "causal": (True, True, False), "stride": (11, 7, 10)}, 256, 12, 3),
    ("2-D 96x96, 13x13, D=192", 2, (96, 96), 13, {}, 192, 8, 8),
    ("1-D 8192, window 511, D=160", 2, (8192,), 511, {}, 160, 8, 8),
    ("2-D 64x64, 13x13, D=128", 2, (64, 64), 13, {}, 128, 8, 8),
    ("2-D 128x128, 31x31, D=128", 1, (128, 128), 31, {}, 128, 8, 8),
    ("3-D 19x31x13, 9x17x10 causal last axis, D=128", 1, (19, 31, 13), (9, 17, 10),
     {"causal": (False, False, True)}, 128, 8, 8),
    ("1-D 4096, window 255, D=64", 2, (4096,), 255, {}, 64, 8, 8),
    ("2-D 96x96, 21x21 dil 2, D=64", 2, (96, 96), 21, {"dilation": 2}, 64, 8, 8),
    ("2-D 64x64, 13x13, D=32", 2, (64, 64), 13, {}, 32, 8, 8),
    # Off the earlier list (2026-12-01, second run): narrow heads, and widths that split.
    ("2-D 56x56, 7x7, D=16", 4, (56, 56), 7, {}, 16, 6, 6),
    ("3-D 8x28x28, 3x7x7 causal time, D=8", 2, (8, 28, 28), (3, 7, 7), {"causal": (True, False, False)}, 8, 8, 8),
    ("1-D 6000, window 333 dil 3, GQA 12/4, D=48", 1, (6000,), 333, {"dilation": 3}, 48, 12, 4),
    ("2-D 70x90, 17x11 stride 2, D=96", 2, (70, 90), (17, 11), {"stride": 2}, 96, 6, 6),
]
# (label, forward settings over the default's): query and key tile tokens, warps.
FORWARD_CANDIDATES = [
    ("16 q / 32 kv, 4 warps", {"queries": 16, "keys": 32, "warps": 4}),
    ("16 q / 64 kv, 4 warps", {"queries": 16, "keys": 64, "warps": 4}),
    ("32 q / 32 kv, 4 warps", {"queries": 32, "keys": 32, "warps": 4}),
    ("16 q / 32 kv, 2 warps", {"queries": 16, "keys": 32, "warps": 2}),
    ("16 q / 32 kv, 1 warp", {"queries": 16, "keys": 32, "warps": 1}),
]
NEEDS = (True, True, True, False, False, False, False)


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def with_forward(problem, base, queries, keys, warps):
    """``base`` with the cheapest forward boxes of ``queries`` and ``keys`` tokens (the default's
    own choice of shapes, tiles._cheapest_boxes), read by pointer."""
    q, kv = tiles._cheapest_boxes(problem, queries, keys)[1:]
    fwd = dict(base["fwd"], q=list(q), kv=list(kv), warps=warps, stages=2, tma=False, pack=1)
    return tiles.normalise(dict(base, fwd=fwd), problem)


def problem_inputs(batch, spatial, window, options, D, heads, kv_heads):
    """Seeded float32 q, k, v and an output gradient on the GPU, with their problem and inputs."""
    torch.manual_seed(0)
    q = torch.randn(batch, *spatial, heads, D, device="cuda")
    k, v = (torch.randn(batch, *spatial, kv_heads, D, device="cuda") for _ in range(2))
    problem = build_problem(q, k, v, window, **options)
    return q, k, v, torch.randn_like(q), problem, AttentionInputs(q, k, v)


def run_problem(name, batch, spatial, window, options, D, heads, kv_heads):
    q, k, v, go, problem, inputs = problem_inputs(batch, spatial, window, options, D, heads, kv_heads)
    ref = haloattn.attention(q.double(), k.double(), v.double(), window, backend="reference", **options)
    default = tiles.default_config(problem, exact_float32=True)
    row = {"problem": name, "default fwd": default["fwd"]}
    # The forward of the 16-bit default (what float32 ran before 2026-12-01).
    before = tiles.normalise(dict(default, fwd=tiles.default_config(problem)["fwd"]), problem)
    configs = [("default", default), ("16-bit tiles", before)] + [
        (label, with_forward(problem, default, **c)) for label, c in FORWARD_CANDIDATES]
    for label, cfg in configs:
        out, lse = launch.forward(problem, inputs, cfg)
        row[f"{label} error"] = rel(out, ref)
        row[f"{label} fwd ms"] = do_bench_cudagraph(lambda: launch.forward(problem, inputs, cfg), rep=60,
                                                    return_mode="median")
        if label == "default":
            row["default bwd ms"] = do_bench_cudagraph(
                lambda: launch.backward(problem, inputs, out, lse, go, None, NEEDS, cfg), rep=60, return_mode="median")
    tokens = math.prod(spatial)
    dq, dk, dv = (torch.randn(batch, heads, tokens, D, device="cuda") for _ in range(3))
    row["dense fp32 SDPA fwd ms"] = do_bench_cudagraph(lambda: F.scaled_dot_product_attention(dq, dk, dv), rep=60,
                                                       return_mode="median")
    return row


def float32_arguments(doc: str) -> argparse.ArgumentParser:
    """The float32 tile benches' common options (--json, --only)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--only", default="", help="comma list of problem indices")
    return parser


def selected_problems(args) -> list:
    """Indices of PROBLEMS that --only names (all by default), once float32 products are known
    to run without TF32."""
    assert not torch.backends.cuda.matmul.allow_tf32, "float32 products must run without TF32 (PyTorch's default)"
    return [int(i) for i in args.only.split(",") if i] or list(range(len(PROBLEMS)))


def timed_rows(run, indices) -> list:
    """``run(*PROBLEMS[i])`` for each index, each row printed as JSON as it comes."""
    rows = []
    for i in indices:
        rows.append(run(*PROBLEMS[i]))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    return rows


def main():
    args = float32_arguments(__doc__).parse_args()
    rows = timed_rows(run_problem, selected_problems(args))
    labels = ["default", "16-bit tiles"] + [label for label, _ in FORWARD_CANDIDATES]
    print("| problem | default fwd tiles | " + " | ".join(f"{l} fwd ms (error)" for l in labels)
          + " | default bwd ms | dense fp32 SDPA fwd ms |")
    print("|---" * (len(labels) + 4) + "|")
    for r in rows:
        cells = [f"{r[l + ' fwd ms']:.3f} ({r[l + ' error']:.1e})" for l in labels]
        tiles_cell = f"{r['default fwd']['q']} / {r['default fwd']['kv']}, {r['default fwd']['warps']} warps"
        print(f"| {r['problem']} | {tiles_cell} | " + " | ".join(cells)
              + f" | {r['default bwd ms']:.3f} | {r['dense fp32 SDPA fwd ms']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
