"""Backend ``triton`` on float32 without TF32 (three TF32 products): the backward's tiles and warps
side by side, per kernel, at head dims 8-256.

Until 2026-12-01 the exact-float32 backward took 16-token resident and 32-token streamed tiles
around the 16-bit forward's shapes, on the 16-bit rule's warps (4, and 8 above 128 channels:
"before"); on the H200 run of 2026-12-01 20:05 UTC it took 4.8-16x its forward's time where
16-bit backwards take about 2.5-3.5x. Since then tiles.EXACT_FLOAT32_BACKWARD ("default"). Per problem of bench_float32_forward_tiles.PROBLEMS this times
(CUDA-graph medians, device time) the dQ kernel alone (dQ asked for) and the dK/dV kernel alone
(dK, dV asked for; the rows' statistics then come from a small torch step, the same for every
variant) on the default and on each variant of VARIANTS that builds without heavy spills at that
width (sm_90 compile reports, benchmarks/sm90_compile.py); every variant's gradients are checked
against the default's (float32, relative 1e-5), the default's against the float64 reference.

    python benchmarks/bench_float32_backward_tiles.py [--only 0,5] [--json FILE] [--compile-only]

``--compile-only`` runs every kernel once, untimed, one process per problem (fills Triton's cache
so that the timed run that follows compiles nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_kernel_timing import compile_in_workers, kernel_cells, time_backward_configs  # noqa: E402
from bench_float32_forward_tiles import (PROBLEMS, float32_arguments, problem_inputs,  # noqa: E402
                                         selected_problems, timed_rows)

from haloattn.backends.triton import tiles  # noqa: E402

# (resident tokens, streamed tokens, warps) per head width (up to this many channels): the ones
# whose sm_90 builds spill at most about 100 bytes a thread (more at 256, where every one spills).
VARIANTS = {
    32: [(16, 32, 1), (16, 32, 2), (16, 32, 4), (32, 32, 2), (32, 32, 4), (16, 16, 1)],
    64: [(16, 32, 2), (16, 32, 4), (32, 32, 4), (16, 16, 2)],
    128: [(16, 32, 4), (16, 32, 8), (16, 16, 4), (16, 16, 8)],
    256: [(16, 32, 4), (16, 32, 8), (16, 16, 8), (16, 16, 4)],
}


def variants_for(width):
    return next(v for channels, v in sorted(VARIANTS.items()) if width <= channels)


def with_backward(problem, base, resident, streamed, warps):
    """``base`` with both backward kernels on the cheapest boxes of ``resident`` / ``streamed``
    tokens around the forward's tile shapes, as tiles.default_config fits them."""
    ext = tiles.group_extents(problem)
    r, s = tiles.fit(base["fwd"]["q"], ext, resident), tiles.fit(base["fwd"]["kv"], ext, streamed)
    return tiles.normalise(dict(base, dq=dict(base["dq"], q=r, kv=s, warps=warps),
                                dkdv=dict(base["dkdv"], q=s, kv=r, warps=warps)), problem)


def before_2026_12_01(problem, base):
    """``base`` with the exact-float32 backward of before tiles.EXACT_FLOAT32_BACKWARD: 16 resident
    and 32 streamed tokens fitted to the 16-bit default forward's shapes, on its warps (4; 8
    above 128 channels)."""
    plain = tiles.default_config(problem)
    ext = tiles.group_extents(problem)
    resident = tiles.fit(plain["fwd"]["q"], ext, tiles.EXACT_FLOAT32_RESIDENT)
    streamed = tiles.fit(plain["fwd"]["kv"], ext, tiles.EXACT_FLOAT32_STREAM)
    warps = 8 if tiles.wide_backward(problem) else 4
    return tiles.normalise(dict(base, dq=dict(base["dq"], q=resident, kv=streamed, warps=warps),
                                dkdv=dict(base["dkdv"], q=streamed, kv=resident, warps=warps)), problem)


def run_problem(name, batch, spatial, window, options, D, heads, kv_heads, timed=True):
    go, problem, inputs = problem_inputs(batch, spatial, window, options, D, heads, kv_heads)[3:]
    default = tiles.default_config(problem, exact_float32=True)
    configs = [("default", default), ("before", before_2026_12_01(problem, default))] + [
        (f"{r}/{s}/{w}", with_backward(problem, default, r, s, w)) for r, s, w in variants_for(D)]
    return time_backward_configs(name, problem, inputs, go, window, options, configs, timed)


def main():
    parser = float32_arguments(__doc__)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a compile-only worker
    args = parser.parse_args()
    only = selected_problems(args)
    if args.one is not None:
        run_problem(*PROBLEMS[args.one], timed=False)
        return
    if args.compile_only:
        sys.exit(compile_in_workers(__file__, [str(i) for i in only], len(only)))
    rows = timed_rows(run_problem, only)
    print("| problem | forward ms | default dq / dkdv | dQ ms: default; variants | dK/dV ms: default; variants | "
          "before / default | default / best |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        c = kernel_cells(r)
        default = c["default"]
        tiles_cell = (f"{r['default dq']['q']}/{r['default dq']['kv']} {r['default dq']['warps']}w; "
                      f"{r['default dkdv']['q']}/{r['default dkdv']['kv']} {r['default dkdv']['warps']}w")
        before = r["before dq ms"] + r["before dkdv ms"]
        print(f"| {r['problem']} | {r['forward ms']:.3f} | {tiles_cell} | {c['dq']} | {c['dkdv']} | "
              f"{before / default:.2f}x | {default / c['best']:.2f} |")
        worst = max(v for k, v in r.items() if k.endswith(" error"))
        print(f"|  (errors: default vs float64 {r['default error vs float64']:.1e}, worst variant vs default {worst:.1e}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
