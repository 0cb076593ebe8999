"""Compile the triton_window kernels for sm_90 without a GPU and report what the compiler made.

No device time: ``window_launch.forward``/``backward`` run on meta tensors with the kernel launch
captured; the captured arguments are specialised the way Triton's JIT would (pointers and
16-divisible ints get the divisibility hint, ints equal to 1 become constants unless the kernel
excludes them from specialisation) and ``triton.compile`` builds for ``cuda:90`` with the bundled
ptxas. Printed per kernel: registers, spills, shared memory, and counts of the SASS instructions that
matter (HGMMA = wgmma, HMMA = mma.sync, LDGSTS = cp.async, UTMALDG = TMA, LDG = plain global loads).

Shapes are bench_window.SHAPES (q/k/v strided views of a [B, *grid, 3, heads, D] projection, with
Swin's rpb); ``--config`` takes a window_launch config dict (``forward_num_stages``, ...).

    python benchmarks/compile_report_window.py [--dtypes float16,float32] [--shapes 0,1,2]
        [--backward] [--config '{"forward_num_stages": 3}'] [--sass DIR] [--ttgir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90_compile import captured_launches, compile_captured  # noqa: E402

import haloattn.nn  # noqa: E402
from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import window_launch  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

# name: (batch, grid, window, heads, head_dim), as benchmarks/bench_window.py SHAPES
SHAPES = [
    ("Swin-T stage 1", (128, (56, 56), 7, 3, 32)),
    ("Swin-B 384 stage 1", (32, (96, 96), 12, 4, 32)),
    ("SwinIR 8x8, head_dim 30", (16, (64, 64), 8, 6, 30)),
    ("Swin V2 16x16", (32, (64, 64), 16, 4, 32)),
]


def shape_inputs(batch, grid, window, heads, head_dim, dtype):
    q, k, v = torch.empty(batch, *grid, 3, heads, head_dim, device="meta", dtype=dtype).unbind(-3)
    table = torch.empty((2 * window - 1) ** 2, heads, device="meta")
    rpb = haloattn.nn.swin_table_to_rpb(table, (window, window)).contiguous()
    problem = build_problem(q, k, v, window, pattern="window", shift=0, scale=head_dim ** -0.5, rpb=rpb)
    return problem, AttentionInputs(q, k, v, rpb)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="0,1,2")
    parser.add_argument("--dtypes", default="float16,float32")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--config", help="JSON window_launch config")
    parser.add_argument("--sass")
    parser.add_argument("--ttgir")
    args = parser.parse_args()
    config = json.loads(args.config) if args.config else None
    rows = []
    for index in [int(i) for i in args.shapes.split(",")]:
        name, (batch, grid, window, heads, head_dim) = SHAPES[index]
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            problem, inputs = shape_inputs(batch, grid, window, heads, head_dim, dtype)
            with captured_launches(window_launch) as sink:
                out, lse = window_launch.forward(problem, inputs, config)
                if args.backward:
                    needs = (True, True, True, True, False, False, False)
                    window_launch.backward(problem, inputs, out, lse, torch.empty_like(out), None, needs, config)
            for fn, grid_, a, kw in sink:
                label = f"{index}-{dtype_name}-{fn.__name__.replace('window_', '').replace('_kernel', '')}"
                print(f"# {name} {dtype_name}: grid {grid_}", flush=True)
                rows.append(compile_captured(fn, a, kw, label, args.sass, args.ttgir))
    return rows


if __name__ == "__main__":
    main()
