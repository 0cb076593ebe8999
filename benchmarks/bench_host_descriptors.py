"""Tile descriptors built on the host (host_descriptors.HOST_DESCRIPTORS) against descriptors each
program builds on the device (with the descriptor rules each implies, tiles.HOST_DESCRIPTOR_*),
on the neighbourhood benchmark's problems and the extra model-shaped ones: device time of each kernel pass side by side (CUDA-graph medians, the variants in turn,
round after round), each output checked bit for bit against the device descriptors', and the host
time of a small eager call (the host variant builds its descriptors on every call). Where the
default reads some tiles by pointer (short walks, narrow heads), a third variant reads them
through host descriptors too.

    python3 benchmarks/bench_host_descriptors.py [--only 1,5] [--rounds 3] [--passes forward] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernel_variants import EXTRA_PROBLEMS, graph_bench  # noqa: E402
from bench_neighborhood import BATCH, HEADS, PROBLEMS  # noqa: E402

import haloattn  # noqa: E402
from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import fast_launch, host_descriptors, launch, tiles  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

# (host descriptors on, config: None = the default, "tma" = the default with every part's K/V or
# Q/dO tiles through descriptors)
VARIANTS = {"device descriptors": (False, None), "host descriptors": (True, None),
            "host descriptors in every kernel": (True, "tma")}


def variant_config(problem, which):
    config = tiles.default_config(problem)
    return config if which is None else {name: dict(part, tma=True) for name, part in config.items()}


def with_variant(host: bool, fn):
    """``fn`` run with the variant's flag; plans are keyed without it, so they are rebuilt."""
    def run():
        if host_descriptors.HOST_DESCRIPTORS != host:
            host_descriptors.HOST_DESCRIPTORS = host
            fast_launch.clear_plans()
            tiles.default_config.cache_clear()  # its descriptor rules follow the flag
        return fn()
    return run


def passes(problem, inputs, names, config):
    """(name, thunk) per timed pass of ``names``: the forward, the backward on the forward's outputs."""
    out, lse = launch.forward(problem, inputs, config)
    go = torch.randn_like(out)
    needs = (True, True, True, False, False, False, False)
    thunks = {"forward": lambda: launch.forward(problem, inputs, config),
              "backward": lambda: launch.backward(problem, inputs, out, lse, go, None, needs, config)}
    return [(name, thunks[name]) for name in names]


def time_problem(name, spatial, window, options, D, rounds, pass_names):
    torch.manual_seed(0)
    q, k, v = (torch.randn(BATCH, *spatial, HEADS, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    problem = build_problem(q, k, v, window, **options)
    inputs = AttentionInputs(q, k, v)
    default = tiles.default_config(problem)
    # The third variant only where the default reads some tiles by pointer.
    variants = {label: v for label, v in VARIANTS.items()
                if v[1] is None or not all(part.get("tma") for part in default.values())}
    rows = []
    for index, pass_name in enumerate(pass_names):
        thunks = {}
        for label, (host, which) in variants.items():
            torch.manual_seed(1)  # the same dO for every variant
            config = with_variant(host, lambda: variant_config(problem, which))()  # the rules follow the flag
            thunks[label] = with_variant(host, passes(problem, inputs, pass_names, config)[index][1])
        results = {label: fn() for label, fn in thunks.items()}
        first = results["device descriptors"]
        equal = {label: all((a is None and b is None) or torch.equal(a, b) for a, b in zip(first, r))
                 for label, r in results.items()}
        times = {label: [] for label in variants}
        for _ in range(rounds):
            for label, fn in thunks.items():
                times[label].append(graph_bench(fn))
        ms = {label: statistics.median(t) for label, t in times.items()}
        row = {"problem": name, "pass": pass_name, "equal_to_device_descriptors": equal, "ms": ms, "rounds": times,
               "speed_up": {label: ms["device descriptors"] / t for label, t in ms.items()}}
        every = ms.get("host descriptors in every kernel")
        print(f"| {name} | {pass_name} | {ms['device descriptors']:.4f} | {ms['host descriptors']:.4f} | "
              f"{row['speed_up']['host descriptors']:.3f}x | "
              + (f"{every:.4f} ({row['speed_up']['host descriptors in every kernel']:.3f}x) | " if every else "| ")
              + ("equal" if all(v for label, v in equal.items() if label != "host descriptors in every kernel")
                 else "DIFFERENT") + " |", flush=True)
        rows.append(row)
    return rows


def host_time_per_call(calls: int = 300) -> dict:
    """Host microseconds per eager call, forward and forward + backward (torch.autograd.grad), on
    a problem too small for the GPU to be the bound."""
    q, k, v = (torch.randn(1, 16, 16, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    go = torch.randn_like(q)
    calls_of = {"forward": lambda: haloattn.attention(q, k, v, 7, backend="triton"),
                "forward + backward": lambda: torch.autograd.grad(haloattn.attention(q, k, v, 7, backend="triton"),
                                                                  (q, k, v), go)}
    out = {}
    for label, (host, _) in list(VARIANTS.items())[:2]:
        for name, fn in calls_of.items():
            call = with_variant(host, fn)
            for _ in range(20):
                call()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            torch.cuda.synchronize()
            out[f"{label}, {name}"] = (time.perf_counter() - start) / calls * 1e6
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated indices into the problems (the issue's ten, then the extra)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passes", default="forward,backward", help="forward, backward or both")
    parser.add_argument("--json")
    args = parser.parse_args()
    problems = PROBLEMS + EXTRA_PROBLEMS
    chosen = [int(i) for i in args.only.split(",")] if args.only else range(len(problems))
    print(f"device: {torch.cuda.get_device_name()}")
    print("| problem | pass | device descriptors ms | host descriptors ms | speed-up | every kernel through host "
          "descriptors ms (speed-up) | outputs |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for i in chosen:
        rows += time_problem(*problems[i], args.rounds, args.passes.split(","))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": rows}, f, indent=1)
    host = host_time_per_call()
    print("host us per eager call (16x16, window 7, 2 heads of 128): "
          + ", ".join(f"{label} {us:.1f}" for label, us in host.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "host_us_per_call": host}, f, indent=1)


if __name__ == "__main__":
    main()
