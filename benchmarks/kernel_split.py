"""Where a call's device time goes: per-kernel times of the `triton` (or `cuda`) forward and backward.

For each benchmark problem (``--extra`` adds the model-shaped ones), the forward and backward
of the default config run under ``torch.profiler`` a few times; the device time of every
kernel is averaged per call and printed with its share of the backward, so work on the
backward can aim at the kernel that costs most. One process, one GPU, no compile of Flex.

    python benchmarks/kernel_split.py [--only 1,5] [--extra] [--calls 20] [--backend cuda] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernel_variants import EXTRA_PROBLEMS, write_json  # noqa: E402
from bench_neighborhood import PROBLEMS, make_inputs  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402

NEEDS = (True, True, True, False, False, False, False)


def kernel_ms(fn, calls):
    """Mean device milliseconds per call of each kernel ``fn`` launches."""
    fn()  # compile and warm up outside the trace
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals = {}
    for entry in prof.key_averages():
        # Kernels carry device time of their own; host-side entries (aten ops, launches) none.
        us = getattr(entry, "self_device_time_total", None)
        if us is None:
            us = entry.self_cuda_time_total
        if us > 0:
            totals[entry.key] = us
    return {name: us / calls / 1000 for name, us in totals.items()}


def split(index, calls, launch):
    q, k, v, problem = make_inputs(index)
    inputs = AttentionInputs(q, k, v)
    out, lse = launch.forward(problem, inputs)
    go = torch.randn_like(out)
    forward = kernel_ms(lambda: launch.forward(problem, inputs), calls)
    backward = kernel_ms(lambda: launch.backward(problem, inputs, out, lse, go, None, NEEDS), calls)
    return {"problem": PROBLEMS[index][0], "forward": forward, "backward": backward}


def report(row):
    fwd = sum(row["forward"].values())
    bwd = sum(row["backward"].values())
    parts = ", ".join(f"{name} {ms:.3f} ({ms / bwd:.0%})" for name, ms in
                      sorted(row["backward"].items(), key=lambda kv: -kv[1]))
    print(f"{row['problem']}: forward {fwd:.3f} ms | backward {bwd:.3f} ms: {parts}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=None, help="problem indices, comma-separated (default: all)")
    parser.add_argument("--extra", action="store_true", help="also the problems of EXTRA_PROBLEMS")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--backend", default="triton", choices=("triton", "cuda"))
    parser.add_argument("--json")
    args = parser.parse_args()
    # Both backends' launch modules take (problem, inputs) and return / take the same tensors.
    launch = importlib.import_module(f"haloattn.backends.{args.backend}.launch")
    if args.extra:
        PROBLEMS.extend(EXTRA_PROBLEMS)  # make_inputs reads this same list
    indices = [int(i) for i in args.only.split(",")] if args.only else range(len(PROBLEMS))
    print(f"# {torch.cuda.get_device_name()}, backend {args.backend}: device ms per call, default configs", flush=True)
    rows = []
    for index in indices:
        rows.append(split(index, args.calls, launch))
        report(rows[-1])
        write_json(args.json, rows)


if __name__ == "__main__":
    main()
