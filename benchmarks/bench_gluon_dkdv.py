"""The Gluon dK/dV pass (gluon_dkdv_kernel.py) against the Triton dK/dV kernel on the same tiles.

Per problem: the backward's median time (every gradient; ``do_bench``) with the default config's
dK/dV part named Gluon and named Triton, their ratio, and the relative difference of the two
passes' dK and dV. The issue's 128-channel rows (but dilation, which the Gluon kernel leaves to
Triton), its 64-channel row, and off-list problems at both widths.

    python benchmarks/bench_gluon_dkdv.py [--only 0,2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_forward_configs import time_backward  # noqa: E402
from bench_wide_forward_tiles import bf16_problem  # noqa: E402

from haloattn.backends.triton import launch, tiles  # noqa: E402

# (name, spatial, window, options, heads, kv_heads, head_dim, batch)
PROBLEMS = [
    ("1-D 32768, window 2047 (issue)", (32768,), 2047, {}, 16, 16, 128, 1),
    ("2-D 128x128, 31x31 (issue)", (128, 128), 31, {}, 16, 16, 128, 1),
    ("2-D 128x128, 63x63 (issue)", (128, 128), 63, {}, 16, 16, 128, 1),
    ("2-D 128x128, 31x31 causal axis 0 (issue)", (128, 128), 31, {"causal": (True, False)}, 16, 16, 128, 1),
    ("3-D 16x48x48, 7x15x15 (issue)", (16, 48, 48), (7, 15, 15), {}, 16, 16, 128, 1),
    ("3-D 16x48x48, 7x15x15 causal time (issue)", (16, 48, 48), (7, 15, 15), {"causal": (True, False, False)},
     16, 16, 128, 1),
    ("2-D 128x128, 32x32 stride 16 (issue)", (128, 128), 32, {"stride": 16}, 16, 16, 128, 1),
    ("2-D 128x128, 16x16 stride 16 (issue)", (128, 128), 16, {"stride": 16}, 16, 16, 128, 1),
    ("2-D 128x128, 31x31, D=64 (issue)", (128, 128), 31, {}, 16, 16, 64, 1),
    ("1-D 16384, causal window 4096, GQA 32/8", (16384,), 4096, {"causal": True}, 32, 8, 128, 1),
    ("2-D 200x200, 41x41", (200, 200), 41, {}, 8, 8, 128, 1),
    ("2-D 96x96, 21x21, B=2", (96, 96), 21, {}, 8, 8, 128, 2),
    ("3-D 12x40x36, 5x17x15 causal time, stride 1x2x1, B=2", (12, 40, 36), (5, 17, 15),
     {"causal": (True, False, False), "stride": (1, 2, 1)}, 8, 8, 128, 2),
    ("2-D 64x64 windows 16x16 shifted 8, B=4", (64, 64), 16, {"pattern": "window", "shift": 8}, 8, 8, 128, 4),
    ("2-D 64x64, 17x17, B=4", (64, 64), 17, {}, 16, 16, 128, 4),
    ("3-D 16x48x48, 7x15x15, D=64", (16, 48, 48), (7, 15, 15), {}, 16, 16, 64, 1),
    ("1-D 32768, window 2047, D=64", (32768,), 2047, {}, 16, 16, 64, 1),
    ("2-D 96x96, 21x21, D=64, B=2", (96, 96), 21, {}, 16, 16, 64, 2),
]


def gradients(problem, inputs, config):
    """(dQ, dK, dV) of ``config``'s backward on fixed random output gradients."""
    out, lse = launch.forward(problem, inputs, config)
    go = torch.randn(out.shape, device=out.device, generator=torch.Generator(device=out.device).manual_seed(3),
                     dtype=out.dtype)
    needs = (True, True, True, False, False, False, False)
    return launch.backward(problem, inputs, out, lse, go, None, needs, config)[:3]


def compare_pass(part: str, suits, description: str):
    """The command line of this bench and bench_gluon_dq.py: per problem the backward with the
    default config's ``part`` ("dkdv" or "dq") named Gluon and named Triton (where ``suits(problem,
    that part)``), their times, ratio and gradients' relative differences."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--only")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    only = range(len(PROBLEMS)) if args.only is None else [int(i) for i in args.only.split(",")]
    for index in only:
        name, problem, inputs, _ = bf16_problem(PROBLEMS[index], index)
        default = tiles.normalise(None, problem)
        configs = {gluon: dict(default, **{part: dict(default[part], gluon=gluon)}) for gluon in (True, False)}
        print(f"# {name}: {part} {default[part]}", flush=True)
        if not suits(problem, default[part]):
            print(f"  (the Gluon {part} pass does not take this problem)", flush=True)
            continue
        ms = {gluon: time_backward(problem, inputs, cfg) for gluon, cfg in configs.items()}
        got, want = gradients(problem, inputs, configs[True]), gradients(problem, inputs, configs[False])
        diff = {grad: ((a.float() - b.float()).norm() / b.float().norm()).item()
                for grad, a, b in zip(("dq", "dk", "dv"), got, want)}
        row = dict(problem=name, config=default[part], gluon_ms=ms[True], triton_ms=ms[False],
                   speedup=ms[False] / ms[True], **{f"{grad}_diff": d for grad, d in diff.items()})
        rows.append(row)
        print(f"  backward: Gluon {part} {ms[True]:.3f} ms, Triton {ms[False]:.3f} ms: {row['speedup']:.2f}x; "
              f"dQ / dK / dV relative difference {diff['dq']:.1e} / {diff['dk']:.1e} / {diff['dv']:.1e}",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    compare_pass("dkdv", tiles.gluon_dkdv_tiles, __doc__.splitlines()[0])
