"""The 16-bit backward's tiles above head dim 128, per kernel, side by side.

At 160-256 channels the backward takes 2.5-5x its forward's time (the off-list sweep of
2026-12-01, seeds 58-71), where 2.5x is its share of the products. Per problem this times
(CUDA-graph medians, device time) the dQ kernel alone (dQ asked for) and the dK/dV kernel alone
(dK, dV asked for) on the default config and on each (resident tokens, streamed tokens, warps)
variant of VARIANTS, both kernels on the cheapest boxes of those sizes around the forward's tile
shapes, fitted to shared memory as the default is; every variant's gradients are checked against
the default's, the default's against the float64 reference. (The first run, 2026-11-29, timed
64 / 64, 128 / 64 and 128 / 32 on the first two problems: 128 / 32 won at 160 channels, 64 / 64
at 256.)

    python benchmarks/bench_wide_backward_tiles.py [--only 0,5] [--rule] [--json FILE] [--compile-only [--workers N]]

``--rule`` times only the default and the config before the wide heads' rules (tiles.WIDE_*).

``--compile-only`` runs every kernel once, untimed, one process per problem and config, --workers
at a time (fills Triton's cache so that the timed run that follows compiles nothing).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_kernel_timing import (bench_main, default_without, kernel_cells, random_problem,  # noqa: E402
                                    time_backward_configs)

from haloattn.backends.triton import tiles  # noqa: E402

# (name, batch, spatial, window, options, head_dim, heads, kv_heads, dtype)
PROBLEMS = [
    ("3-D 16x32x32, 5x9x9, D=160", 2, (16, 32, 32), (5, 9, 9), {}, 160, 8, 8, torch.bfloat16),
    ("2-D 96x96, 13x13, D=256", 2, (96, 96), 13, {}, 256, 8, 8, torch.bfloat16),
    ("3-D 11x56x30, 6x4x17 causal last axis, D=160 (sweep #59)", 1, (11, 56, 30), (6, 4, 17),
     {"causal": (False, False, True)}, 160, 16, 16, torch.bfloat16),
    ("3-D 15x15x38, 6x6x6, D=160, batch 37 (sweep #65)", 37, (15, 15, 38), 6, {}, 160, 2, 2, torch.float16),
    ("2-D 134x115, 32x5, GQA 6/1, D=160 (sweep #68)", 3, (134, 115), (32, 5), {}, 160, 6, 1, torch.float16),
    ("1-D 19082, window 625, D=192 (sweep #70)", 2, (19082,), 625, {}, 192, 8, 8, torch.bfloat16),
    ("3-D 20x29x30, 9x9x9 dil 2x1x1, D=160 (sweep #71)", 2, (20, 29, 30), 9, {"dilation": (2, 1, 1)}, 160, 8, 8,
     torch.float16),
    ("2-D 128x128, 31x31, D=256", 1, (128, 128), 31, {}, 256, 8, 8, torch.bfloat16),
    # --rule's checks of the wide heads' rules (tiles.WIDE_*_BACKWARD_*) beyond the problems
    # they were fitted on
    ("2-D 96x96, 13x13, D=192", 2, (96, 96), 13, {}, 192, 8, 8, torch.bfloat16),
    ("1-D 8192, window 511, D=256", 2, (8192,), 511, {}, 256, 8, 8, torch.bfloat16),
    ("3-D 16x24x24, 5x7x7 causal time, GQA 8/2, D=256", 2, (16, 24, 24), (5, 7, 7), {"causal": (True, False, False)},
     256, 8, 2, torch.float16),
    ("2-D 80x80, 21x21 dil 2, D=144", 2, (80, 80), 21, {"dilation": 2}, 144, 8, 8, torch.bfloat16),
    ("1-D 16384, window 1023 causal, D=160", 1, (16384,), 1023, {"causal": True}, 160, 8, 8, torch.bfloat16),
    ("2-D 64x64, 3x3, D=160, batch 8", 8, (64, 64), 3, {}, 160, 8, 8, torch.bfloat16),
]
VARIANTS = [(128, 32, 8), (128, 64, 8), (64, 64, 8), (64, 32, 8), (64, 32, 4), (32, 64, 4)]


def with_backward(problem, base, resident, streamed, warps):
    """``base`` with both backward kernels on ``resident`` / ``streamed`` tokens around the
    forward's tile shapes, on ``warps`` warps, fitted as tiles.default_config fits its rules'."""
    return tiles.normalise(dict(base, **tiles._backward_around_forward(problem, base, resident, streamed, warps)),
                           problem)


def run_problem(name, batch, spatial, window, options, D, heads, kv_heads, dtype, timed=True, only_config=None,
                rule=False):
    """One problem's row: the default, the config before the rules (tiles.WIDE_16BIT_BACKWARD_RULES
    off) and, unless ``rule``, VARIANTS; ``only_config``: that one config (an index into them)
    after the default, untimed."""
    problem, inputs, go = random_problem(batch, spatial, window, options, D, heads, kv_heads, dtype)
    default = tiles.default_config(problem)
    configs = [("default", default), ("before", default_without("WIDE_16BIT_BACKWARD_RULES", problem))]
    if not rule:
        configs += [(f"{r}/{s}/{w}", with_backward(problem, default, r, s, w)) for r, s, w in VARIANTS]
    if only_config is not None:  # a compile-only worker's one config (its forward first)
        configs = [configs[0]] if only_config == 0 else [configs[0], configs[only_config]]
    return time_backward_configs(name, problem, inputs, go, window, options, configs, timed, rep=40)


def table(rows) -> str:
    lines = ["| problem | forward ms | default dQ tiles | dQ ms: default; variants | dK/dV ms: default; variants | "
             "backward / forward | default / best (per kernel) | before / default |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = kernel_cells(r)
        lines.append(f"| {r['problem']} | {r['forward ms']:.3f} | {r['default tiles']} | {c['dq']} | {c['dkdv']} | "
                     f"{c['default'] / r['forward ms']:.2f} | {c['default'] / c['best']:.2f} | "
                     f"{(r['before dq ms'] + r['before dkdv ms']) / c['default']:.2f}x |")
    return "\n".join(lines)


def main():
    bench_main(__doc__, __file__, PROBLEMS, run_problem, lambda index, rule: 2 if rule else 2 + len(VARIANTS), table)


if __name__ == "__main__":
    main()
