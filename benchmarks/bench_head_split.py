"""The triton forward on head dims that are not powers of two: one padded block against a block
and a tail (tiles.head_split, config ``split_heads``), side by side in one run.

Per problem and head dim (bf16), the forward with the default config and the same config with
``split_heads`` off are timed in alternating rounds (CUDA-graph replays, median per round), and
both outputs compared with the reference backend in float32. Head dims 64 and 128 are controls
(nothing to split: both configs build the same kernel).

    python benchmarks/bench_head_split.py [--rounds 3] [--dims 80,160] [--compile-only] [--json F] [--markdown F]

``--compile-only`` runs each kernel once untimed (parallel processes, one per head dim, fill
Triton's cache before the timed run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
from triton.testing import do_bench_cudagraph

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_neighborhood import attended_pairs  # noqa: E402

import haloattn  # noqa: E402
from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import launch, tiles  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

# (name, batch, spatial, heads, window, options): the shapes of the model and issue benchmarks.
PROBLEMS = [
    ("2-D 64x64, 13x13, batch 4", 4, (64, 64), 8, 13, {}),
    ("2-D 128x128, 31x31", 1, (128, 128), 8, 31, {}),
    ("3-D 16x32x32, 5x9x9, batch 2", 2, (16, 32, 32), 8, (5, 9, 9), {}),
    ("1-D 16384, window 1023 causal", 1, (16384,), 8, 1023, {"causal": True}),
]
HEAD_DIMS = (64, 80, 96, 128, 160, 192)


def time_pair(problem, inputs, configs, rounds):
    """Median CUDA-graph ms of each config's forward, over ``rounds`` alternating rounds."""
    times = {name: [] for name in configs}
    for _ in range(rounds):
        for name, config in configs.items():
            times[name].append(do_bench_cudagraph(lambda: launch.forward(problem, inputs, config), rep=40,
                                                  return_mode="median"))
    return {name: statistics.median(t) for name, t in times.items()}


def run(rounds, dims, compile_only=False):
    rows = []
    for name, batch, spatial, heads, window, options in PROBLEMS:
        for D in dims:
            torch.manual_seed(D)
            q, k, v = (torch.randn(batch, *spatial, heads, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            problem = build_problem(q, k, v, window, **options)
            inputs = AttentionInputs(q, k, v)
            config = tiles.default_config(problem)
            configs = {"split": config, "padded": dict(config, fwd=dict(config["fwd"], split_heads=False))}
            if compile_only:
                for cfg in configs.values():
                    launch.forward(problem, inputs, cfg)
                continue
            reference = haloattn.attention(q.float(), k.float(), v.float(), window, backend="reference", **options)
            row = {"problem": name, "head_dim": D, "blocks": tiles.forward_head_blocks(problem),
                   "fwd_config": config["fwd"]}
            for label, cfg in configs.items():
                out, _ = launch.forward(problem, inputs, cfg)
                row[f"{label}_max_abs_error"] = (out.float() - reference).abs().max().item()
            row.update({f"{label}_ms": ms for label, ms in time_pair(problem, inputs, configs, rounds).items()})
            row["speedup"] = row["padded_ms"] / row["split_ms"]
            row["split_tflops"] = 4 * heads * D * attended_pairs(problem) / row["split_ms"] / 1e9
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def markdown(rows):
    lines = ["| problem | head dim | blocks (D, tail, Dv, tail) | padded ms | split ms | padded / split "
             "| split TFLOP/s | max abs err split / padded |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['problem']} | {r['head_dim']} | {tuple(r['blocks'])} | {r['padded_ms']:.3f} | "
                     f"{r['split_ms']:.3f} | {r['speedup']:.2f}x | {r['split_tflops']:.0f} | "
                     f"{r['split_max_abs_error']:.1e} / {r['padded_max_abs_error']:.1e} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dims", default=",".join(map(str, HEAD_DIMS)))
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    dims = [int(d) for d in args.dims.split(",")]
    if args.compile_only:
        run(0, dims, compile_only=True)
        torch.cuda.synchronize()
        return
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows = run(args.rounds, dims)
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
