"""Build the triton backend's Gluon forward (gluon_forward_kernel.py) for sm_90 on any machine, on
the problems its launch plans would run, and report what ptxas made of each: registers, spills,
shared memory and the instruction mix (HGMMA = wgmma, UTMALDG = TMA loads). Gluon has no CPU
interpreter; tests/test_gluon_probes.py runs this in CI so that a kernel change that no longer
builds, spills or loses its structure fails there, not on the GPU.

    python benchmarks/compile_report_gluon_forward.py [--head-dim 64] [--exp2-split 4] [--tiling whole|whole3|split128|split128x3|split64]

``--tiling`` builds the launches of one of the kernel's tilings (gluon_split_walk.py) instead of
the cost model's default: both consumers on the whole walk, or the split walk on 128- or 64-key
tiles (whole3, split128x3: three slots of 128-key tiles instead of two).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_compile import build_sm90, report  # noqa: E402

from haloattn.backends.triton import tiles  # noqa: E402
from haloattn.backends.triton.gluon_forward_launch import GluonForward  # noqa: E402
from haloattn.backends.triton.gluon_regroup import regrouped  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

# (name, spatial, window, options, heads, kv heads, dtype): every rank, causal and strided axes,
# the window pattern with a shift, GQA and float16, odd lengths
PROBLEMS = [
    ("1-D 32768, 2047", (32768,), 2047, {}, 16, 16, torch.bfloat16),
    ("1-D 5000, 601 causal", (5000,), 601, {"causal": True}, 4, 4, torch.float16),
    ("2-D 128x128, 31x31", (128, 128), 31, {}, 16, 16, torch.bfloat16),
    ("2-D 128x128, 31x31 causal axis 0", (128, 128), 31, {"causal": (True, False)}, 16, 16, torch.bfloat16),
    ("2-D 128x128, 16x16 stride 16", (128, 128), 16, {"stride": 16}, 16, 16, torch.bfloat16),
    ("2-D 90x75, 33x21, GQA 8/2", (90, 75), (33, 21), {}, 8, 2, torch.bfloat16),
    ("2-D 64x64 windows 16x16 shifted 8", (64, 64), 16, {"pattern": "window", "shift": 8}, 4, 4, torch.float16),
    ("3-D 16x48x48, 7x15x15", (16, 48, 48), (7, 15, 15), {}, 16, 16, torch.bfloat16),
    ("3-D 12x40x36, 5x17x15 causal time, stride 1x2x1", (12, 40, 36), (5, 17, 15),
     {"causal": (True, False, False), "stride": (1, 2, 1)}, 8, 8, torch.bfloat16),
]
# built with --tiling (which lets the Gluon forward take dilated problems: gluon_regroup.py)
DILATED_PROBLEMS = [("2-D 128x128, 31x31 dilation 2", (128, 128), 31, {"dilation": 2}, 16, 16, torch.bfloat16)]


def build(spec, head_dim: int = tiles.GLUON_FORWARD_HEAD_DIM, exp2_every: int = 0):
    """(label, build_sm90's row) of the Gluon forward's launch for one problem (meta tensors)."""
    name, spatial, window, options, heads, kv_heads, dtype = spec
    q, out = (torch.empty(1, *spatial, heads, head_dim, device="meta", dtype=dtype) for _ in range(2))
    k = torch.empty(1, *spatial, kv_heads, head_dim, device="meta", dtype=dtype)
    lse = torch.empty(1, *spatial, heads, device="meta", dtype=torch.float32)
    problem = build_problem(q, k, k, window, **options)
    regrouping = regrouped(problem)
    views = [regrouping.view(t) for t in (q, k, k, out)] + [regrouping.view_rows(lse)]
    plan = GluonForward(regrouping.problem, *views, exp2_every=exp2_every)
    tiling = tiles.gluon_forward_boxes(problem)
    label = (f"{name} | boxes {list(tiling.q)} x {list(tiling.kv)}, cut on axis {tiling.split}"
             f"{', split walk' if tiling.split_walk else ''}")
    return label, build_sm90(plan.kernel, plan.arguments(plan.descriptors, lse), plan.meta)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiling", choices=sorted(tiles.GLUON_TILINGS))
    parser.add_argument("--head-dim", type=int, default=tiles.GLUON_FORWARD_HEAD_DIM,
                        choices=(64, 128))
    parser.add_argument("--exp2-split", type=int, default=0, choices=tiles.EXP2_SPLIT_CHOICES)
    args = parser.parse_args()
    if args.tiling:
        tiles.use_gluon_tiling(args.tiling)
    for spec in PROBLEMS + (DILATED_PROBLEMS if args.tiling else []):
        label, row = build(spec, args.head_dim, args.exp2_split)
        report(f"{label}, D={args.head_dim}{f', exp2 split {args.exp2_split}' if args.exp2_split else ''}", row)


if __name__ == "__main__":
    main()
