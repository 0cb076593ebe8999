"""The `triton` backward with one knob of one kernel changed at a time, on small-head problems.

NAT- and DiNAT-style layers (7x7 windows, heads of 16-32 channels, batch 32-64) spend most of a
training step in the backward, and most of the backward in the key-major dK/dV kernel (on NAT-T,
H100: dK/dV 208 us, dQ 107 us, forward 89 us a call). This script times, per problem (bf16 unless
named; CUDA-graph replays, device time), the backward alone (dq, dk, dv from a fixed forward) with
the heuristic default and with each variant: warps, stages, descriptor loads, tile sizes per
kernel; every variant's gradients are compared with the default's.

    python benchmarks/bench_backward_variants.py [--only 0,3] [--json FILE]
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

# (name, dtype, batch, spatial, heads, head dim, window, options)
PROBLEMS = [
    ("NAT-T 56x56, 7x7, 2x32, batch 64", torch.bfloat16, 64, (56, 56), 2, 32, 7, {}),
    ("NAT-S 56x56, 7x7, 3x32, batch 32", torch.bfloat16, 32, (56, 56), 3, 32, 7, {}),
    ("NAT-B 28x28, 7x7, 8x32, batch 64", torch.bfloat16, 64, (28, 28), 8, 32, 7, {}),
    ("NAT-B 28x28 float16", torch.float16, 64, (28, 28), 8, 32, 7, {}),
    ("DiNAT-T 56x56, 7x7 dilation 8, 2x32, batch 64", torch.bfloat16, 64, (56, 56), 2, 32, 7, {"dilation": 8}),
    ("2-D 56x56, 7x7, 4x16, batch 64", torch.bfloat16, 64, (56, 56), 4, 16, 7, {}),
    ("2-D 64x64, 31x31, 8x32, batch 4", torch.bfloat16, 4, (64, 64), 8, 32, 31, {}),
    ("1-D 4096, causal window 255, 8x32, batch 4", torch.bfloat16, 4, (4096,), 8, 32, 255, {"causal": True}),
    ("3-D 8x32x32, 5x9x9, 8x32, batch 2", torch.bfloat16, 2, (8, 32, 32), 8, 32, (5, 9, 9), {}),
    ("DiT 64x64, 17x17, 16x64, batch 4", torch.bfloat16, 4, (64, 64), 16, 64, 17, {}),
]
NEEDS = (True, True, True, False, False, False, False)


def variants(problem, base):
    """Label -> config: the default and one change of one kernel's knob each."""
    ext = tiles.group_extents(problem)
    out = {"default": base}
    for part in ("dq", "dkdv"):
        knobs = base[part]
        for warps in (2, 4, 8):
            if warps != knobs["warps"]:
                out[f"{part} {warps} warps"] = dict(base, **{part: dict(knobs, warps=warps)})
        out[f"{part} 3 stages"] = dict(base, **{part: dict(knobs, stages=3)})
        out[f"{part} tma {not knobs['tma']}"] = dict(base, **{part: dict(knobs, tma=not knobs["tma"])})
    key_major = base["dkdv"]
    out["dkdv streamed 32"] = dict(base, dkdv=dict(key_major, q=tiles.fit(key_major["q"], ext, 32)))
    out["dkdv resident 32, 2 warps"] = dict(base, dkdv=dict(key_major, kv=tiles.fit(key_major["kv"], ext, 32),
                                                             q=tiles.fit(key_major["q"], ext, 32), warps=2))
    out["dkdv resident 128, 8 warps"] = dict(base, dkdv=dict(key_major, kv=tiles.fit(key_major["kv"], ext, 128),
                                                              warps=8))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma list of PROBLEMS indices")
    parser.add_argument("--json")
    args = parser.parse_args()
    chosen = [PROBLEMS[int(i)] for i in args.only.split(",")] if args.only else PROBLEMS
    torch.manual_seed(0)
    rows = []
    for name, dtype, batch, spatial, heads, dim, window, options in chosen:
        q, k, v, grad = (torch.randn(batch, *spatial, heads, dim, device="cuda", dtype=dtype) for _ in range(4))
        problem = build_problem(q, k, v, window, **options)
        inputs = AttentionInputs(q, k, v)
        base = tiles.default_config(problem)
        out, lse = launch.forward(problem, inputs, base)
        reference = launch.backward(problem, inputs, out, lse, grad, None, NEEDS, base)[:3]
        row = {"problem": name, "dq": base["dq"], "dkdv": base["dkdv"], "ms": {}, "max_abs_diff": {}}
        for label, config in variants(problem, base).items():
            grads = launch.backward(problem, inputs, out, lse, grad, None, NEEDS, config)[:3]
            row["max_abs_diff"][label] = max((g.float() - r.float()).abs().max().item()
                                             for g, r in zip(grads, reference))
            bench_graph(row["ms"], label, lambda: launch.backward(problem, inputs, out, lse, grad, None, NEEDS, config))
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
