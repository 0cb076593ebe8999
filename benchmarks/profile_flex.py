"""Where a forward+backward through the flex backend (and, for comparison, the triton backend on
the same pattern without the mod) spends its GPU time: torch.profiler's CUDA kernel table for a
few steps of one bench_flex_mods.py problem.

    python benchmarks/profile_flex.py [--problem 0] [--backend flex|triton] [--rows 12]
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import haloattn
from bench_flex_mods import PROBLEMS, make


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--problem", type=int, default=0)
    parser.add_argument("--backend", default="flex")
    parser.add_argument("--rows", type=int, default=12)
    args = parser.parse_args()
    name, spatial, window, options, heads, head_dim = PROBLEMS[args.problem]
    q, k, v, kw = make(spatial, window, options, heads, head_dim, requires_grad=True)
    if args.backend != "flex":
        kw = {n: x for n, x in kw.items() if n not in ("score_mod", "mask_mod")}

    def step():
        haloattn.attention(q, k, v, window, backend=args.backend, **kw).sum().backward()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    print(f"## {name}, backend {args.backend}, 3 steps of forward+backward")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70))


if __name__ == "__main__":
    main()
