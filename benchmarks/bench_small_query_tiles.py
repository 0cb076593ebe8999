"""The `triton` kernels with 16- and 32-query tiles on small windows, against the heuristic default.

A query tile's keys are the union of its queries' windows: with a 7x7 window an 8x8 tile walks
a 14x14 box, 4.85 computed pairs per attended one on NAT-T's 56x56 grid; a 2x8 tile walks 8x14,
2.6 (``efficiency_bounds.computed_pairs``). At head dims of 32-64 the scores' softmax, not the
products, sets a step's time, so fewer computed pairs may win although a 16-row product runs on
mma.sync with one warp. Per problem (bf16) this times, as CUDA-graph replays (device time): the
default forward, and forwards with (queries, keys, warps, stages) from VARIANTS, each with the
query and key boxes ``tiles.forward_cost`` finds cheapest for those sizes; then the default
backward and backwards whose resident tiles have 16 or 32 tokens. Each output and gradient is
checked against the default's.

    python benchmarks/bench_small_query_tiles.py [--only 0,2] [--small-windows] [--json FILE] [--markdown FILE]

``--compile-only`` runs each config once without timing: several such processes side by side
fill Triton's cache, so that the timed run after them compiles nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_forward_pack import PROBLEMS  # noqa: E402
from bench_neighborhood import bench_graph  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import launch, tiles  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

# (queries, keys, warps, stages) of the forward variants
VARIANTS = [(16, 64, 1, 3), (16, 32, 1, 3), (32, 64, 1, 3), (32, 64, 2, 3)]
# (resident tokens, streamed tokens, warps) of the backward variants (both kernels)
BACKWARD_VARIANTS = [(16, 64, 1), (32, 64, 1), (32, 32, 1)]


def cheapest_boxes(problem, queries: int, keys: int):
    """The query and key boxes of these sizes with the fewest computed pairs (and masked axes)."""
    return min(((tiles.forward_cost(problem, q, kv, 1.0), q, kv)
                for q in tiles._shapes(problem, queries) for kv in tiles._shapes(problem, keys)),
               key=lambda c: c[0])[1:]


def forward_variant(problem, default, queries, keys, warps, stages):
    q, kv = cheapest_boxes(problem, queries, keys)
    fwd = dict(default["fwd"], q=list(q), kv=list(kv), warps=warps, stages=stages, tma=False,
               pack=tiles.packed_pairs(problem, q, kv, False))
    return dict(default, fwd=tiles._fit_shared(problem, "fwd", fwd))


def backward_variant(problem, default, resident, streamed, warps):
    q, kv = cheapest_boxes(problem, resident, streamed)
    knobs = dict(warps=warps, stages=2, tma=False)
    dq = dict(default["dq"], q=list(q), kv=list(kv), **knobs)
    dkdv = dict(default["dkdv"], q=list(kv), kv=list(q), **knobs, wait_dk=False)
    return dict(default, dq=tiles._fit_shared(problem, "dq", dq), dkdv=tiles._fit_shared(problem, "dkdv", dkdv))


# More narrow-head problems for ``--rule``: ranks 1-3, head dims 16 and 32, windows the NAT
# shapes above do not have.
RULE_PROBLEMS = [
    ("2-D 32x32, 7x7, 4x16, batch 8", 8, (32, 32), 4, 16, 7, {}),
    ("1-D 512, window 31, 4x32, batch 8", 8, (512,), 4, 32, 31, {}),
    ("1-D 2048, causal 127, 8x32, batch 4", 4, (2048,), 8, 32, 127, {"causal": True}),
    ("2-D 64x64, 13x13, 4x32, batch 8", 8, (64, 64), 4, 32, 13, {}),
    ("2-D 64x64, 13x13 dilation 2, 4x32, batch 8", 8, (64, 64), 4, 32, 13, {"dilation": 2}),
    ("2-D 64x64, 31x31, 4x32, batch 4", 4, (64, 64), 4, 32, 31, {}),
    ("3-D 8x16x16, 3x5x5, 4x32, batch 4", 4, (8, 16, 16), 4, 32, (3, 5, 5), {}),
    ("3-D 8x32x32, 3x7x7 causal time, 6x32, batch 2", 2, (8, 32, 32), 6, 32, (3, 7, 7), {"causal": (True, False, False)}),
]


# Small windows at head dims of 64 and more, where 64-query tiles compute 4-12 pairs per attended
# one (2026-12-01 shape sweep, #49 and #54) and the small tiles were never timed: ``--small-windows``
# times these with SMALL_WINDOW_VARIANTS / SMALL_WINDOW_BACKWARD_VARIANTS.
SMALL_WINDOW_PROBLEMS = [
    ("2-D 117x114, 5x3, 12x80, batch 3 (sweep #54)", 3, (117, 114), 12, 80, (5, 3), {}),
    ("2-D 64x64, 3x3, 8x128, batch 8", 8, (64, 64), 8, 128, 3, {}),
    ("3-D 8x24x24, 3x3x3, 8x64, batch 4", 4, (8, 24, 24), 8, 64, 3, {}),
    ("1-D 8192, window 15, 8x128, batch 4", 4, (8192,), 8, 128, 15, {}),
    ("2-D 105x146, 7x7 dil 2x1 stride 2, 6x256, batch 4 (sweep #49)", 4, (105, 146), 6, 256, 7,
     {"dilation": (2, 1), "stride": 2}),
    ("2-D 56x56, 7x7, 8x64, batch 16", 16, (56, 56), 8, 64, 7, {}),
    ("2-D 32x32, 5x5, 4x256, batch 8", 8, (32, 32), 4, 256, 5, {}),
    ("3-D 16x16x16, 3x5x5, 8x128, batch 2", 2, (16, 16, 16), 8, 128, (3, 5, 5), {}),
]
SMALL_WINDOW_VARIANTS = [(16, 32, 1, 3), (16, 32, 2, 3), (16, 64, 2, 3), (32, 32, 2, 3), (32, 64, 2, 3),
                         (32, 64, 4, 3)]
SMALL_WINDOW_BACKWARD_VARIANTS = [(16, 32, 2), (32, 32, 2), (32, 64, 2), (32, 64, 4)]


def wide_default(problem):
    """The default config as it was before the narrow-head small tiles (tiles.NARROW_*): no small
    forward blocks, no small backward tiles, and packable walks on the wide forward's own block
    (the short-walk block is set to it, which gives its boxes, warps and stages back)."""
    saved = tiles.NARROW_FORWARD_BLOCKS, tiles.NARROW_BACKWARD_TILES, tiles.NARROW_SHORT_WALK_BLOCK
    tiles.NARROW_FORWARD_BLOCKS, tiles.NARROW_BACKWARD_TILES = {}, (32, 32, 1, 1e-9)
    tiles.default_config.cache_clear(), tiles._best_forward.cache_clear()
    try:
        q, kv, warps, stages = tiles._best_forward(problem, tiles.descriptor_loads(problem))
        tiles.NARROW_SHORT_WALK_BLOCK = ((math.prod(q), math.prod(kv)), (warps, stages))
        return tiles.default_config(problem)
    finally:
        tiles.NARROW_FORWARD_BLOCKS, tiles.NARROW_BACKWARD_TILES, tiles.NARROW_SHORT_WALK_BLOCK = saved
        tiles.default_config.cache_clear(), tiles._best_forward.cache_clear()


def time_rule(name, batch, spatial, heads, dim, window, options, compile_only=False):
    """The default against ``wide_default``: forward and backward, outputs compared."""
    q, k, v = (torch.randn(batch, *spatial, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    problem = build_problem(q, k, v, window, **options)
    inputs = AttentionInputs(q, k, v)
    configs = {"new": tiles.default_config(problem), "old": wide_default(problem)}
    row = {"problem": name, **{f"{n}_tiles": [c["fwd"]["q"], c["fwd"]["kv"], c["fwd"]["warps"], c["dq"]["q"],
                                              c["dq"]["kv"], c["dq"]["warps"]] for n, c in configs.items()}}
    measure = (lambda r, key, fn: fn()) if compile_only else bench_graph
    grad_out = torch.randn_like(q)
    needs = (True, True, True, False, False, False, False)
    results = {}
    for n, config in configs.items():
        out, lse = launch.forward(problem, inputs, config)
        results[n] = (out, launch.backward(problem, inputs, out, lse, grad_out, None, needs, config))
        measure(row, f"fwd_{n}", lambda: launch.forward(problem, inputs, config))
        measure(row, f"bwd_{n}", lambda: launch.backward(problem, inputs, out, lse, grad_out, None, needs, config))
    row["out_diff"] = largest_difference([results["new"][0]], [results["old"][0]])
    row["grad_diff"] = largest_difference(results["new"][1], results["old"][1])
    if not compile_only:
        row["fwd_gain"], row["bwd_gain"] = row["fwd_old"] / row["fwd_new"], row["bwd_old"] / row["bwd_new"]
    print(json.dumps(row), flush=True)
    return row


def largest_difference(a, b) -> float:
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b) if x is not None)


def time_problem(name, batch, spatial, heads, dim, window, options, compile_only=False, variants=None,
                 backward_variants=None):
    q, k, v = (torch.randn(batch, *spatial, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    problem = build_problem(q, k, v, window, **options)
    inputs = AttentionInputs(q, k, v)
    default = tiles.default_config(problem)
    row = {"problem": name, "q": default["fwd"]["q"], "kv": default["fwd"]["kv"]}
    measure = (lambda r, key, fn: fn()) if compile_only else bench_graph
    measure(row, "fwd_default", lambda: launch.forward(problem, inputs, default))
    out, lse = launch.forward(problem, inputs, default)
    for queries, keys, warps, stages in variants or VARIANTS:
        key = f"fwd_{queries}x{keys}_w{warps}_s{stages}"
        config = forward_variant(problem, default, queries, keys, warps, stages)
        row[key + "_tiles"] = [config["fwd"]["q"], config["fwd"]["kv"], config["fwd"]["pack"]]
        row[key + "_diff"] = largest_difference(launch.forward(problem, inputs, config), (out, lse))
        measure(row, key, lambda: launch.forward(problem, inputs, config))
    grad_out = torch.randn_like(out)
    needs = (True, True, True, False, False, False, False)

    def backward(config):
        return launch.backward(problem, inputs, out, lse, grad_out, None, needs, config)

    measure(row, "bwd_default", lambda: backward(default))
    grads = backward(default)
    for resident, streamed, warps in backward_variants or BACKWARD_VARIANTS:
        key = f"bwd_{resident}x{streamed}_w{warps}"
        config = backward_variant(problem, default, resident, streamed, warps)
        row[key + "_tiles"] = [config["dq"]["q"], config["dq"]["kv"]]
        row[key + "_diff"] = largest_difference(backward(config), grads)
        measure(row, key, lambda: backward(config))
    if compile_only:
        return row
    for kind in ("fwd", "bwd"):
        times = {k: t for k, t in row.items() if k.startswith(kind + "_") and isinstance(t, float)
                 and not k.endswith("_diff")}
        best = min(times, key=times.get)
        row[kind + "_best"], row[kind + "_gain"] = best, row[kind + "_default"] / times[best]
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma list of problem indices (bench_forward_pack.PROBLEMS)")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--rule", action="store_true",
                        help="the default against the default before the narrow-head rule, on PROBLEMS + RULE_PROBLEMS")
    parser.add_argument("--small-windows", action="store_true",
                        help="SMALL_WINDOW_PROBLEMS (head dims 64-256) with their own variants")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    torch.manual_seed(0)
    problems = PROBLEMS + RULE_PROBLEMS if args.rule else SMALL_WINDOW_PROBLEMS if args.small_windows else PROBLEMS
    indices = [int(i) for i in args.only.split(",")] if args.only else range(len(problems))
    timer = time_rule if args.rule else time_problem
    if args.small_windows:
        def timer(*spec, compile_only=False):
            return time_problem(*spec, compile_only=compile_only, variants=SMALL_WINDOW_VARIANTS,
                                backward_variants=SMALL_WINDOW_BACKWARD_VARIANTS)
    rows = [timer(*problems[i], compile_only=args.compile_only) for i in indices]
    if args.compile_only:
        return
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write((rule_table if args.rule else variants_table)(rows))


def variants_table(rows) -> str:
    lines = ["| problem | default tiles | fwd default ms | best fwd variant | ms | gain | bwd default ms "
             "| best bwd variant | ms | gain |", "|---" * 10 + "|"]
    for r in rows:
        fwd, bwd = r["fwd_best"], r["bwd_best"]
        lines.append(f"| {r['problem']} | {r['q']} / {r['kv']} | {r['fwd_default']:.4f} | {fwd} "
                     f"{r.get(fwd + '_tiles', '')} | {r[fwd]:.4f} | {r['fwd_gain']:.2f} | {r['bwd_default']:.4f} | "
                     f"{bwd} {r.get(bwd + '_tiles', '')} | {r[bwd]:.4f} | {r['bwd_gain']:.2f} |")
    return "\n".join(lines) + "\n"


def rule_table(rows) -> str:
    lines = ["| problem | tiles before (fwd q / kv / warps, dq q / kv / warps) | tiles now | fwd before ms | now "
             "| gain | bwd before ms | now | gain |", "|---" * 9 + "|"]
    for r in rows:
        lines.append(f"| {r['problem']} | {r['old_tiles']} | {r['new_tiles']} | {r['fwd_old']:.4f} | "
                     f"{r['fwd_new']:.4f} | {r['fwd_gain']:.2f} | {r['bwd_old']:.4f} | {r['bwd_new']:.4f} | "
                     f"{r['bwd_gain']:.2f} |")
    return "\n".join(lines) + "\n"

if __name__ == "__main__":
    main()
