"""Host-side (Python) profile of forward+backward steps through a backend: cProfile's top
functions by cumulative time, for the bench_flex_mods.py problem given. Finds where a step's CPU
time goes when torch.profiler shows the GPU mostly idle.

    python benchmarks/profile_flex_host.py [--problem 0] [--backend flex] [--steps 10]
"""

import argparse
import cProfile
import pstats

import torch

import haloattn
from bench_flex_mods import PROBLEMS, make


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--problem", type=int, default=0)
    parser.add_argument("--backend", default="flex")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rows", type=int, default=30)
    args = parser.parse_args()
    name, spatial, window, options, heads, head_dim = PROBLEMS[args.problem]
    q, k, v, kw = make(spatial, window, options, heads, head_dim, requires_grad=True)

    def step():
        haloattn.attention(q, k, v, window, backend=args.backend, **kw).sum().backward()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    print(f"## {name}, backend {args.backend}, {args.steps} forward+backward steps")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.rows)


if __name__ == "__main__":
    main()
