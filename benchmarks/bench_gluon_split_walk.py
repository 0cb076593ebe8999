"""The Gluon forward's tilings side by side: both consumers on the box's whole walk (on a persistent
grid, and on a program a box), and the split walk (each consumer computes only its own half's key
tiles; gluon_split_walk.py) on 128- and 64-key tiles, against the Triton forward of the backend's
default config.

Per problem and tiling: the forward's median time (``do_bench``), its speed-up over the Triton
forward and over the whole walk, the cost model's prediction of that ratio at the tiling's speed
(tiles.gluon_forward_cost with the program steps, over forward_cost of the Triton forward: what
GLUON_FORWARD_SPEEDS is fitted to) at speed 1.40, the pairs the tiling computes per attended pair,
and the output's relative error against the reference backend in float32 on the GPU.

    python benchmarks/bench_gluon_split_walk.py [--only 0,2] [--tilings whole,whole-per-box] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_neighborhood import attended_pairs  # noqa: E402
from bench_wide_forward_tiles import bf16_problem, time_forward  # noqa: E402

from haloattn.backends.triton import fast_launch, launch, tiles  # noqa: E402
from haloattn.backends.triton.gluon_regroup import dilation_groups, regrouped  # noqa: E402

# (name, spatial, window, options, heads, kv_heads, head_dim, batch): the 128-channel
# undilated rows first, then shapes no issue lists
PROBLEMS = [
    ("1-D 32768, window 2047", (32768,), 2047, {}, 16, 16, 128, 1),
    ("2-D 128x128, 31x31", (128, 128), 31, {}, 16, 16, 128, 1),
    ("2-D 128x128, 63x63", (128, 128), 63, {}, 16, 16, 128, 1),
    ("2-D 128x128, 31x31 causal axis 0", (128, 128), 31, {"causal": (True, False)}, 16, 16, 128, 1),
    ("2-D 128x128, 31x31 dilation 2", (128, 128), 31, {"dilation": 2}, 16, 16, 128, 1),
    ("3-D 16x48x48, 7x15x15", (16, 48, 48), (7, 15, 15), {}, 16, 16, 128, 1),
    ("3-D 16x48x48, 7x15x15 causal time", (16, 48, 48), (7, 15, 15), {"causal": (True, False, False)}, 16, 16,
     128, 1),
    ("2-D 128x128, 32x32 stride 16", (128, 128), 32, {"stride": 16}, 16, 16, 128, 1),
    ("2-D 128x128, 16x16 stride 16", (128, 128), 16, {"stride": 16}, 16, 16, 128, 1),
    ("2-D 96x80, 21x13, GQA 16/4, B=2", (96, 80), (21, 13), {}, 16, 4, 128, 2),
    ("3-D 8x32x32, 5x9x9, B=2", (8, 32, 32), (5, 9, 9), {}, 8, 8, 128, 2),
    ("2-D 64x64, windows 16x16 shifted 8, B=4", (64, 64), 16, {"pattern": "window", "shift": 8}, 8, 8, 128, 4),
    ("1-D 8192, causal window 1024, B=2", (8192,), 1024, {"causal": True}, 16, 16, 128, 2),
    # window 1 on some axes: boxes one token deep there (tiles._shapes)
    ("2-D 128x128, axial 1x63", (128, 128), (1, 63), {}, 16, 16, 128, 1),
    ("3-D 16x48x48, per-frame 1x15x15", (16, 48, 48), (1, 15, 15), {}, 16, 16, 128, 1),
]

# tiles.GLUON_TILINGS, one at a time (each at speed 1.40 here)
TILINGS = list(tiles.GLUON_TILINGS)


def computed_pairs(problem, tiling) -> float:
    """Pairs the Gluon forward computes on this tiling (gluon_forward_cost at speed 1 counts
    computed pairs plus the masked-axis surcharge; the surcharge is left out here), on the
    problem's regrouping where it is dilated."""
    problem = regrouped(problem).problem
    per_axis = tiles._axis_walks(problem, tiling.q, tiling.kv)
    if tiling.split_walk:
        per_axis[tiling.split] = tiles._axis_split_steps(problem.axes[tiling.split], problem.pattern,
                                                         tiling.q[tiling.split], tiling.kv[tiling.split],
                                                         tiles.ANCHOR_TILES)
    steps = math.prod(visited for visited, _ in per_axis)
    return steps * math.prod(tiling.q) * math.prod(tiling.kv) * problem.heads * problem.batch


def print_fitted_speeds(rows) -> None:
    """Per tiling, the speed at which the cost model would have predicted each measured ratio
    (the prediction is at GLUON_FORWARD_SPEED and scales with the speed, but for the programs'
    fixed steps): the value GLUON_FORWARD_SPEEDS wants for that tiling, its median and range."""
    for label in TILINGS:
        fits = sorted(tiles.GLUON_FORWARD_SPEED * t["speedup"] / t["predicted"]
                      for row in rows for name, t in row["tilings"].items() if name == label)
        if fits:
            print(f"# fitted speed, {label}: median {fits[len(fits) // 2]:.2f} (range {fits[0]:.2f}-{fits[-1]:.2f}, "
                  f"{len(fits)} problems)", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only")
    parser.add_argument("--json")
    parser.add_argument("--tilings", help="comma-separated names of tiles.GLUON_TILINGS (default: all)")
    args = parser.parse_args()
    tilings = TILINGS if args.tilings is None else args.tilings.split(",")
    only = range(len(PROBLEMS)) if args.only is None else [int(i) for i in args.only.split(",")]
    saved = tiles.gluon_forward_tiling()
    rows = []
    for index in only:
        name, problem, inputs, ref = bf16_problem(PROBLEMS[index], index)
        tiles.set_gluon_forward_tiling(*saved)
        default = tiles.normalise(None, problem)
        triton_config = dict(default, fwd=dict(default["fwd"], gluon=False))
        triton_cost = tiles.forward_cost(problem, default["fwd"]["q"], default["fwd"]["kv"],
                                         tiles.FORWARD_BLOCKS[bool(default["fwd"]["tma"])]
                                         .get((math.prod(default["fwd"]["q"]), math.prod(default["fwd"]["kv"])),
                                              (None, None, 1.0))[2])
        fast_launch.clear_plans()
        triton_ms, triton_err = time_forward(problem, inputs, triton_config, ref)
        attended = attended_pairs(problem) * problem.heads
        chosen = tiles.gluon_forward_boxes(problem) if default["fwd"]["gluon"] else None
        walk = "" if chosen is None else f", {'split' if chosen.split_walk else 'whole'} walk"
        print(f"# {name}: triton {default['fwd']['q']}x{default['fwd']['kv']} {triton_ms:.3f} ms, "
              f"rel error {triton_err:.1e} (default forward: {'gluon' if default['fwd']['gluon'] else 'triton'}"
              f"{walk})", flush=True)
        row = dict(problem=name, triton_ms=triton_ms, triton_error=triton_err, default_gluon=default["fwd"]["gluon"],
                   tilings={})
        for label in tilings:
            tiles.use_gluon_tiling(label)
            fast_launch.clear_plans()
            tiling = tiles.gluon_forward_boxes(problem)
            if tiling is None:
                continue
            config = dict(triton_config, fwd=dict(triton_config["fwd"], gluon=True))
            ms, err = time_forward(problem, inputs, config, ref)
            if all(plan is launch.TRITON_FORWARD for plan in launch._GLUON_PLANS.values()):
                print(f"  {label}: the Gluon kernel did not run (the Triton forward took the call)", flush=True)
                continue
            # per head of the problem, as tiles.gluon_forward_chosen weighs them: forward_cost counts
            # dilation group 0's walks, the regrouping's cost every group but the heads' ones
            predicted = triton_cost * dilation_groups(problem) / (tiling.cost * regrouped(problem).heads_factor)
            ratio = computed_pairs(problem, tiling) / attended
            row["tilings"][label] = dict(q=tiling.q, kv=tiling.kv, split=tiling.split, slots=tiles.GLUON_TILINGS[label][1],
                                         ms=ms, error=err, speedup=triton_ms / ms, predicted=predicted, pairs_ratio=ratio)
            whole = row["tilings"].get("whole", {}).get("ms", ms)
            print(f"  {label} {list(tiling.q)} x {list(tiling.kv)} cut {tiling.split}: {ms:.3f} ms, "
                  f"{triton_ms / ms:.2f}x triton (predicted {predicted:.2f}x at 1.40), {whole / ms:.2f}x whole, "
                  f"{ratio:.2f} computed / attended pairs, rel error {err:.1e}", flush=True)
        rows.append(row)
    tiles.set_gluon_forward_tiling(*saved)
    print_fitted_speeds(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
