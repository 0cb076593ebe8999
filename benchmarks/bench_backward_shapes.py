"""The 16-bit backward's tile shapes at 32-128 channels, per kernel, side by side.

At the shapes models run (kernel_split.py --models, 2026-12-02) the dK/dV kernel took 1.2-1.4x
the dQ kernel on 1-D and NAT-sized problems, 1.8x on a 2-D 17x17 window at 64 channels and 2.3x
on 3-D video windows at 64 channels, where its share of the products is 4/3 (four products a
step against three). This times, per problem (CUDA-graph medians, device time), the dQ kernel
alone (dQ asked for) and the dK/dV kernel alone (dK, dV asked for) on the default config and on
variants of the backward's tiles:

* ``box R/S``: both kernels on the resident box R and streamed box S, for the cheapest
  (forward_cost) pairs of 64-token boxes;
* one knob of the default's dK/dV changed: warps, stages, descriptor loads, the in-step dK wait,
  128 resident keys on 8 warps, 32 streamed queries.

Every variant's gradients are checked against the default's, the default's against the float64
reference.

    python benchmarks/bench_backward_shapes.py [--only 0,5] [--json FILE] [--compile-only [--workers N]]

``--compile-only`` runs every kernel once, untimed, one process per problem and config, --workers
at a time (fills Triton's cache so that the timed run after it compiles nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_kernel_timing import compile_in_workers, kernel_cells, time_backward_configs  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import tiles  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

# (name, batch, spatial, window, options, head_dim, heads, kv_heads, dtype)
PROBLEMS = [
    ("video 3-D 16x32x32, 5x9x9, 12 heads of 64, batch 2", 2, (16, 32, 32), (5, 9, 9), {}, 64, 12, 12,
     torch.bfloat16),
    ("video 3-D causal time, as above", 2, (16, 32, 32), (5, 9, 9), {"causal": (True, False, False)}, 64, 12, 12,
     torch.bfloat16),
    ("DiT 2-D 64x64, 17x17, 16 heads of 64, batch 4", 4, (64, 64), 17, {}, 64, 16, 16, torch.bfloat16),
    ("3-D 16x48x48, 7x15x15, 16 heads of 128", 1, (16, 48, 48), (7, 15, 15), {}, 128, 16, 16, torch.bfloat16),
    ("2-D 96x96, 13x13, 8 heads of 128, batch 4", 4, (96, 96), 13, {}, 128, 8, 8, torch.bfloat16),
    ("3-D 8x32x32, 3x7x7, 8 heads of 64, GQA 8/2, batch 2", 2, (8, 32, 32), (3, 7, 7), {}, 64, 8, 2, torch.float16),
    ("3-D 8x32x32, 5x9x9, 8 heads of 32, batch 2", 2, (8, 32, 32), (5, 9, 9), {}, 32, 8, 8, torch.bfloat16),
    ("2-D 128x128, 31x31, 16 heads of 64", 1, (128, 128), 31, {}, 64, 16, 16, torch.bfloat16),
]
BOX_PAIRS = 4  # the cheapest (resident, streamed) box pairs timed beside the default


def cheapest_box_pairs(problem, count):
    """The ``count`` cheapest (resident, streamed) pairs of 64-token boxes (forward_cost, the
    resident box in the forward's query role)."""
    shapes = tiles._shapes(problem.rank, 64, tiles.group_extents(problem))
    ranked = sorted((tiles.forward_cost(problem, r, s, 1.0), r, s) for r in shapes for s in shapes)
    return [(list(r), list(s)) for _, r, s in ranked[:count]]


def variants(problem, default):
    """(label, config) of every variant after the default, each fitted to shared memory."""
    out = []
    for resident, streamed in cheapest_box_pairs(problem, BOX_PAIRS):
        if (resident, streamed) == (default["dq"]["q"], default["dq"]["kv"]):
            continue
        box = lambda part, **tile: dict(default[part], **tile)  # noqa: E731
        out.append((f"box {resident}/{streamed}",
                    dict(default, dq=box("dq", q=resident, kv=streamed), dkdv=box("dkdv", q=streamed, kv=resident))))
    key_major = default["dkdv"]
    ext = tiles.group_extents(problem)
    knobs = [
        ("dkdv 8 warps", dict(warps=8)),
        ("dkdv 3 stages", dict(stages=3)),
        (f"dkdv tma {not key_major['tma']}", dict(tma=not key_major["tma"])),
        (f"dkdv wait_dk {not key_major['wait_dk']}", dict(wait_dk=not key_major["wait_dk"])),
        ("dkdv resident 128, 8 warps", dict(kv=tiles.fit(key_major["kv"], ext, 128), warps=8)),
        ("dkdv streamed 32", dict(q=tiles.fit(key_major["q"], ext, 32))),
    ]
    out += [(label, dict(default, dkdv=dict(key_major, **change))) for label, change in knobs]
    return [(label, tiles.normalise(config, problem)) for label, config in out]


def run_problem(name, batch, spatial, window, options, D, heads, kv_heads, dtype, timed=True, only_config=None):
    """One problem's row: the default and its variants; ``only_config``: that one config (an
    index into them) after the default, untimed."""
    torch.manual_seed(0)
    q = torch.randn(batch, *spatial, heads, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, *spatial, kv_heads, D, device="cuda", dtype=dtype) for _ in range(2))
    go = torch.randn_like(q)
    problem = build_problem(q, k, v, window, **options)
    inputs = AttentionInputs(q, k, v)
    default = tiles.default_config(problem)
    configs = [("default", default)] + variants(problem, default)
    if only_config is not None:  # a compile-only worker's one config (its forward first)
        configs = [configs[0]] if only_config == 0 else [configs[0], configs[only_config]]
    return time_backward_configs(name, problem, inputs, go, window, options, configs, timed, rep=40)


def config_count(index):
    """How many configs problem ``index`` times (on the GPU's device: its limits shape the
    default; the tensors are left unwritten)."""
    name, batch, spatial, window, options, D, heads, kv_heads, dtype = PROBLEMS[index]
    q = torch.empty(batch, *spatial, heads, D, device="cuda", dtype=dtype)
    k = torch.empty(batch, *spatial, kv_heads, D, device="cuda", dtype=dtype)
    problem = build_problem(q, k, k, window, **options)
    return 1 + len(variants(problem, tiles.default_config(problem)))


def table(rows) -> str:
    lines = ["| problem | forward ms | default dQ tiles | dQ ms: default; variants | dK/dV ms: default; variants | "
             "dK/dV / dQ (default) | backward / forward | default / best (per kernel) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = kernel_cells(r)
        lines.append(f"| {r['problem']} | {r['forward ms']:.3f} | {r['default tiles']} | {c['dq']} | {c['dkdv']} | "
                     f"{r['default dkdv ms'] / r['default dq ms']:.2f} | {c['default'] / r['forward ms']:.2f} | "
                     f"{c['default'] / c['best']:.2f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--only", default="", help="comma list of problem indices")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a compile-only worker: "problem:config"
    args = parser.parse_args()
    only = [int(i) for i in args.only.split(",") if i] or list(range(len(PROBLEMS)))
    if args.one is not None:
        problem, config = (int(part) for part in args.one.split(":"))
        run_problem(*PROBLEMS[problem], timed=False, only_config=config)
        return
    if args.compile_only:
        jobs = [f"{i}:{c}" for i in only for c in range(config_count(i))]
        sys.exit(compile_in_workers(__file__, jobs, args.workers))
    rows = []
    for i in only:
        rows.append(run_problem(*PROBLEMS[i]))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
