"""The forward's query tile and output through host descriptors of query-tile boxes
(launch.HOST_QUERY_BOXES) against the pointer gather and scatter, on the default configs: the
neighbourhood benchmark's problems, the extra model-shaped ones and the short walks of
bench_short_walks.py (where a program's one load and one store weigh most). CUDA-graph medians of
interleaved rounds; each output compared bit for bit.

    python3 benchmarks/bench_query_boxes.py [--rounds 3] [--only 1,5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernel_variants import EXTRA_PROBLEMS  # noqa: E402
from bench_neighborhood import BATCH, HEADS, PROBLEMS  # noqa: E402
from bench_short_walks import PROBLEMS as SHORT_WALKS, interleaved_ms  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import fast_launch, launch, tiles  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402


def problems():
    """(name, batch, spatial, heads, head dim, window, options) of every problem timed."""
    out = [(name, BATCH, spatial, HEADS, D, window, options) for name, spatial, window, options, D in
           PROBLEMS + EXTRA_PROBLEMS]
    for batch, spatial, heads, D, window, options in SHORT_WALKS[:9]:  # the blocked and small-window ones
        out.append((f"{batch}x{spatial} window {window} {options} D={D} heads {heads}", batch, spatial, heads, D,
                    window, options))
    return out


def with_boxes(on: bool, fn):
    def run():
        if launch.HOST_QUERY_BOXES != on:
            launch.HOST_QUERY_BOXES = on
            fast_launch.clear_plans()
        return fn()
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only")
    parser.add_argument("--json")
    args = parser.parse_args()
    chosen = problems()
    if args.only:
        chosen = [chosen[int(i)] for i in args.only.split(",")]
    print(f"device: {torch.cuda.get_device_name()}")
    print("| problem | fwd tiles | pointer ms | query boxes ms | speed-up | outputs |\n|---|---|---|---|---|---|")
    rows = []
    for name, batch, spatial, heads, D, window, options in chosen:
        torch.manual_seed(0)
        if "pattern" in options:
            continue  # Swin windows take the window kernels
        q, k, v = (torch.randn(batch, *spatial, heads, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        problem = build_problem(q, k, v, window, **options)
        inputs = AttentionInputs(q, k, v)
        config = tiles.default_config(problem)
        runs = {label: with_boxes(on, lambda: launch.forward(problem, inputs, config))
                for label, on in (("pointer", False), ("query boxes", True))}
        results = {label: fn() for label, fn in runs.items()}
        equal = all(torch.equal(a, b) for a, b in zip(results["pointer"], results["query boxes"]))
        ms = interleaved_ms(runs, args.rounds)
        fwd = config["fwd"]
        tiles_text = f"{fwd['q']}x{fwd['kv']} tma {fwd['tma']} pack {fwd.get('pack', 1)}"
        row = {"problem": name, "config": fwd, "ms": ms, "speed_up": ms["pointer"] / ms["query boxes"],
               "equal": equal}
        rows.append(row)
        print(f"| {name} | {tiles_text} | {ms['pointer']:.4f} | {ms['query boxes']:.4f} | {row['speed_up']:.3f}x | "
              f"{'equal' if equal else 'DIFFERENT'} |", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
