"""The `triton` forward with several (batch, head) pairs per program, against one pair per program.

A forward program walks the key tiles of one query tile. With small windows that walk is a few
tiles long, and the program's prologue (query load, geometry) and epilogue (normalise, store)
take as long as its products, with nothing overlapping them. Packed programs (forward_kernel's
PACK) run their query tile for PACK consecutive (batch, head) pairs in one flat pipelined loop.
This script times, per problem (bf16): the heuristic default, and the default's tiles with 1, 2,
4, ... 16 pairs per program (pointer loads), as CUDA-graph replays (device time), checking each
output against the one-pair run.

    python benchmarks/bench_forward_pack.py [--json FILE] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_neighborhood import bench_graph  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import launch, tiles  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

# (name, batch, spatial, heads, head dim, window, options): the model shapes of
# bench_model_shapes.py that `triton` runs, and short walks of the benchmark.
PROBLEMS = [
    ("NAT-T 56x56, 7x7, 2x32, batch 64", 64, (56, 56), 2, 32, 7, {}),
    ("DiNAT-T 56x56, 7x7 dilation 8, 2x32, batch 64", 64, (56, 56), 2, 32, 7, {"dilation": 8}),
    ("NAT-B 28x28, 7x7, 8x32, batch 64", 64, (28, 28), 8, 32, 7, {}),
    ("NAT-B 14x14, 7x7, 16x32, batch 64", 64, (14, 14), 16, 32, 7, {}),
    ("NAT-T stage 4: 7x7, 7x7, 16x32, batch 64", 64, (7, 7), 16, 32, 7, {}),
    ("DiNAT-T stage 2: 28x28, 7x7 dilation 4, 4x32, batch 64", 64, (28, 28), 4, 32, 7, {"dilation": 4}),
    ("1-D 1024, window 64 stride 64, 12x64, batch 16", 16, (1024,), 12, 64, 64, {"stride": 64}),
    ("DiT 64x64, 17x17, 16x64, batch 4", 4, (64, 64), 16, 64, 17, {}),
    ("video 16x32x32, 5x9x9, 12x64, batch 2", 2, (16, 32, 32), 12, 64, (5, 9, 9), {}),
    ("1-D 4096, window 65, 8x64, batch 8", 8, (4096,), 8, 64, 65, {}),
    ("2-D 128x128, 16x16 stride 16, 16x128", 1, (128, 128), 16, 128, 16, {"stride": 16}),
    ("2-D 128x128, 31x31, 16x64", 1, (128, 128), 16, 64, 31, {}),
]
PACKS = (1, 2, 4, 8, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, batch, spatial, heads, dim, window, options in PROBLEMS:
        q, k, v = (torch.randn(batch, *spatial, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        problem = build_problem(q, k, v, window, **options)
        inputs = AttentionInputs(q, k, v)
        default = tiles.default_config(problem)
        row = {"problem": name, "default_pack": default["fwd"]["pack"], "default_tma": default["fwd"]["tma"],
               "q": default["fwd"]["q"], "kv": default["fwd"]["kv"],
               "steps": round(tiles.steps_per_tile(problem, default["fwd"]["q"], default["fwd"]["kv"]), 2)}
        bench_graph(row, "default", lambda: launch.forward(problem, inputs, default))
        reference, _ = launch.forward(problem, inputs, default)
        for pack in PACKS:
            if pack > batch * heads:
                continue
            config = dict(default, fwd=dict(default["fwd"], pack=pack, tma=False))
            out, _ = launch.forward(problem, inputs, config)
            row[f"diff_{pack}"] = (out.float() - reference.float()).abs().max().item()
            bench_graph(row, f"pack_{pack}", lambda: launch.forward(problem, inputs, config))
        best = min((p for p in PACKS if f"pack_{p}" in row), key=lambda p: row[f"pack_{p}"])
        row["best_pack"] = best
        row["default_vs_best"] = row["default"] / row[f"pack_{best}"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("| problem | steps/tile | default pack | default ms | "
                    + " | ".join(f"pack {p} ms" for p in PACKS) + " | best | default / best |\n")
            f.write("|---" * (6 + len(PACKS)) + "|\n")
            for r in rows:
                cells = [f"{r[f'pack_{p}']:.4f}" if f"pack_{p}" in r else "" for p in PACKS]
                f.write(f"| {r['problem']} | {r['steps']} | {r['default_pack']} | {r['default']:.4f} | "
                        + " | ".join(cells) + f" | {r['best_pack']} | {r['default_vs_best']:.2f} |\n")


if __name__ == "__main__":
    main()
