"""The backward's tiles above head dim 128 (8 warps): resident / streamed tokens 64 / 64 (the
default before 2026-11-29, when the shared-memory estimate counted 160-channel heads as 256),
128 / 64 and 128 / 32, as CUDA-graph medians of the backward (dQ, dK, dV), bf16.

    python benchmarks/bench_wide_backward_tiles.py
"""

import torch
from triton.testing import do_bench_cudagraph

from haloattn.backend import AttentionInputs
from haloattn.backends.triton import launch, tiles
from haloattn.problem import build_problem

PROBLEMS = [("3-D 16x32x32, 5x9x9, D=160, batch 2", 2, (16, 32, 32), (5, 9, 9), 160),
            ("2-D 96x96, 13x13, D=256, batch 2", 2, (96, 96), 13, 256)]
NEEDS = (True, True, True, False, False, False, False)

for name, batch, spatial, window, D in PROBLEMS:
    q, k, v = (torch.randn(batch, *spatial, 8, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    go = torch.randn_like(q)
    problem = build_problem(q, k, v, window)
    inputs = AttentionInputs(q, k, v)
    base = tiles.default_config(problem)
    out, lse = launch.forward(problem, inputs, base)
    ext = tiles.group_extents(problem)
    times = {}
    for resident, streamed in ((64, 64), (128, 64), (128, 32)):
        r, s = tiles.fit(base["fwd"]["q"], ext, resident), tiles.fit(base["fwd"]["kv"], ext, streamed)
        cfg = dict(base, dq=dict(base["dq"], q=r, kv=s), dkdv=dict(base["dkdv"], q=s, kv=r))
        times[f"{resident}/{streamed}"] = do_bench_cudagraph(
            lambda: launch.backward(problem, inputs, out, lse, go, None, NEEDS, cfg), rep=50, return_mode="median")
        print(name, f"{resident}/{streamed}", f"{times[f'{resident}/{streamed}']:.3f} ms", flush=True)
    print(name, "default", base["dq"]["q"], base["dq"]["kv"], flush=True)
