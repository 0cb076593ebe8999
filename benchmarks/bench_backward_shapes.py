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
* both kernels on 128-token resident boxes of the cost model's shape, 8 warps (added 2026-12-06
  with two blocked problems, where the knob's refitted 128-key box straddles two windows; not yet
  run).

The first run (2026-12-02) found the dK/dV kernel's walk by the inverse rule computing up to
1.6x the pairs of the dQ kernel's on the forward's boxes; since then dK/dV takes boxes of its own
(tiles.KEY_MAJOR_BOXES), and ``--rule`` times only the default against the config before that
rule ("before").

Every variant's gradients are checked against the default's, the default's against the float64
reference.

    python benchmarks/bench_backward_shapes.py [--only 0,5] [--rule] [--json FILE] [--compile-only [--workers N]]

``--compile-only`` runs every kernel once, untimed, one process per problem and config, --workers
at a time (fills Triton's cache so that the timed run after it compiles nothing).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_kernel_timing import (bench_main, default_without, kernel_cells, random_problem,  # noqa: E402
                                    time_backward_configs)

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
    # --rule's checks of the dK/dV boxes' rule (tiles.KEY_MAJOR_*): the issue's strided problem and
    # problems drawn at random (2-D and 3-D, 48-128 channels) whose dK/dV boxes the rule changes
    ("2-D 128x128, 32x32 stride 16, 16 heads of 128", 1, (128, 128), 32, {"stride": 16}, 128, 16, 16,
     torch.bfloat16),
    ("2-D 80x96, 11x15, D=64", 2, (80, 96), (11, 15), {}, 64, 8, 8, torch.bfloat16),
    ("3-D 20x40x40, 13x5x7, D=128", 2, (20, 40, 40), (13, 5, 7), {}, 128, 8, 8, torch.float16),
    ("2-D 128x80, 11x11 causal last axis, D=64", 2, (128, 80), 11, {"causal": (False, True)}, 64, 8, 8,
     torch.bfloat16),
    ("3-D 96x24x48, 13x7x9 stride 1x2x2, D=64", 2, (96, 24, 48), (13, 7, 9), {"stride": (1, 2, 2)}, 64, 8, 8,
     torch.bfloat16),
    ("3-D 20x24x12, 7x13x11, D=128", 2, (20, 24, 12), (7, 13, 11), {}, 128, 8, 8, torch.bfloat16),
    ("3-D 64x24x16, 3x11x15, D=64", 2, (64, 24, 16), (3, 11, 15), {}, 64, 8, 8, torch.float16),
    ("3-D 24x12x8, 15x7x3, D=48", 2, (24, 12, 8), (15, 7, 3), {}, 48, 8, 8, torch.bfloat16),
    ("2-D 48x64, 9x11, GQA 8/2, D=64", 2, (48, 64), (9, 11), {}, 64, 8, 2, torch.bfloat16),
    ("3-D 64x16x64, 5x5x7, D=64", 2, (64, 16, 64), (5, 5, 7), {}, 64, 8, 8, torch.bfloat16),
    ("3-D 24x24x56, 7x5x13, D=96", 2, (24, 24, 56), (7, 5, 13), {}, 96, 8, 8, torch.bfloat16),
    ("2-D 128x56, 15x9, D=96", 2, (128, 56), (15, 9), {}, 96, 8, 8, torch.float16),
    ("3-D 12x12x32, 11x9x3 dilation 1x1x2, D=128", 2, (12, 12, 32), (11, 9, 3), {"dilation": (1, 1, 2)}, 128, 8, 8,
     torch.bfloat16),
    ("2-D 96x80, 13x13 stride 13x2, D=64", 2, (96, 80), 13, {"stride": (13, 2)}, 64, 8, 8, torch.bfloat16),
    # Dilated grids (2026-12-06): the tuner found the dilation-2 problem's dK/dV 1.07x
    # faster on 4x16 boxes than on the default 8x8, which key_major_cost ranks 7 % dearer there.
    ("2-D 128x128, 31x31 dilation 2, 16 heads of 128", 1, (128, 128), 31, {"dilation": 2}, 128, 16, 16,
     torch.bfloat16),
    ("2-D 96x96, 13x13 dilation 3, 8 heads of 128, batch 2", 2, (96, 96), 13, {"dilation": 3}, 128, 8, 8,
     torch.bfloat16),
    ("2-D 64x96, 11x9 dilation 2x4, D=64", 2, (64, 96), (11, 9), {"dilation": (2, 4)}, 64, 8, 8, torch.bfloat16),
    # Blocked windows (2026-12-06): 128-token resident boxes that stay inside one window (the
    # "resident 128" knob's refitted 4x32 box straddles two).
    ("2-D 128x128, 16x16 stride 16, 16 heads of 128", 1, (128, 128), 16, {"stride": 16}, 128, 16, 16,
     torch.bfloat16),
    ("3-D 8x32x32, 4x8x8 stride 4x8x8, 8 heads of 128, batch 2", 2, (8, 32, 32), (4, 8, 8), {"stride": (4, 8, 8)},
     128, 8, 8, torch.bfloat16),
]
BOX_PAIRS = 4  # the cheapest (resident, streamed) box pairs timed beside the default


def cheapest_box_pairs(problem, count):
    """The ``count`` cheapest (resident, streamed) pairs of 64-token boxes (forward_cost, the
    resident box in the forward's query role)."""
    shapes = tiles._shapes(problem, 64)
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
    # Both kernels on 128-token resident boxes of the cost model's shape, 8 warps: twice the
    # queries (keys) per streamed tile, half the streamed tiles' trips from L2.
    _, resident, streamed = tiles._cheapest_boxes(problem, 128, 64)
    resident, streamed = list(resident), list(streamed)
    out.append((f"both resident {resident}/{streamed}, 8 warps",
                dict(default, dq=dict(default["dq"], q=resident, kv=streamed, warps=8),
                     dkdv=dict(key_major, q=streamed, kv=resident, warps=8))))
    return [(label, tiles.normalise(config, problem)) for label, config in out]


def problem_configs(problem, rule):
    """(label, config) pairs of one problem, the default first: with ``rule`` the config before
    the rule beside it, else the variants."""
    default = tiles.default_config(problem)
    before = [("before", default_without("KEY_MAJOR_BOXES", problem))]
    return [("default", default)] + (before if rule else variants(problem, default))


def run_problem(name, batch, spatial, window, options, D, heads, kv_heads, dtype, timed=True, only_config=None,
                rule=False):
    """One problem's row: the default and its variants (``rule``: the config before the rule);
    ``only_config``: that one config (an index into them) after the default, untimed."""
    problem, inputs, go = random_problem(batch, spatial, window, options, D, heads, kv_heads, dtype)
    configs = problem_configs(problem, rule)
    if only_config is not None:  # a compile-only worker's one config (its forward first)
        configs = [configs[0]] if only_config == 0 else [configs[0], configs[only_config]]
    return time_backward_configs(name, problem, inputs, go, window, options, configs, timed, rep=40)


def config_count(index, rule):
    """How many configs problem ``index`` times (on the GPU's device: its limits shape the
    default; the tensors are left unwritten)."""
    name, batch, spatial, window, options, D, heads, kv_heads, dtype = PROBLEMS[index]
    q = torch.empty(batch, *spatial, heads, D, device="cuda", dtype=dtype)
    k = torch.empty(batch, *spatial, kv_heads, D, device="cuda", dtype=dtype)
    problem = build_problem(q, k, k, window, **options)
    return len(problem_configs(problem, rule))


def before_over_default(row, cells) -> str:
    """The config before the rule over the default, both kernels' time (``--rule`` rows)."""
    if "before dq ms" not in row:
        return "-"
    return f"{(row['before dq ms'] + row['before dkdv ms']) / cells['default']:.2f}x"


def table(rows) -> str:
    lines = ["| problem | forward ms | default dQ tiles | dQ ms: default; variants | dK/dV ms: default; variants | "
             "dK/dV / dQ (default) | backward / forward | default / best (per kernel) | before / default |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = kernel_cells(r)
        lines.append(f"| {r['problem']} | {r['forward ms']:.3f} | {r['default tiles']} | {c['dq']} | {c['dkdv']} | "
                     f"{r['default dkdv ms'] / r['default dq ms']:.2f} | {c['default'] / r['forward ms']:.2f} | "
                     f"{c['default'] / c['best']:.2f} | {before_over_default(r, c)} |")
    return "\n".join(lines)


def main():
    bench_main(__doc__, __file__, PROBLEMS, run_problem, config_count, table)


if __name__ == "__main__":
    main()
