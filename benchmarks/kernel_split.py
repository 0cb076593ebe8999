"""Where a call's device time goes: per-kernel times of the `triton` (or `cuda`) forward and backward.

For each benchmark problem (``--extra`` adds the model-shaped ones), the forward and backward
of the default config run under ``torch.profiler`` a few times; the device time of every
kernel is averaged per call and printed with its share of the backward, so work on the
backward can aim at the kernel that costs most. One process, one GPU, no compile of Flex.

With ``--models`` the problems are bench_model_shapes.py's instead (NAT, DiT, video and LLM
layers at their own batch, heads and head dims; a problem the backend does not take, such as
the Swin windows for ``cuda``, is named with the reasons and skipped),
and each pass's time is set against its memory floor: the bytes it must move at least (the
forward reads q, k, v and writes o and the LSE; the backward reads those and dO and writes dQ,
dK, dV) in GB/s, since at those shapes the tensors are large and the windows small.

    python benchmarks/kernel_split.py [--only 1,5] [--extra | --models] [--calls 20] [--backend cuda] [--json FILE]
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

import haloattn  # noqa: E402
from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

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


def model_inputs(index):
    """bench_model_shapes.PROBLEMS[index] as (name, q, k, v, window, options)."""
    from bench_model_shapes import PROBLEMS as MODEL_PROBLEMS

    name, batch, spatial, heads, kv_heads, D, window, options = MODEL_PROBLEMS[index]
    torch.manual_seed(index)
    q = torch.randn(batch, *spatial, heads, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, *spatial, kv_heads, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return name, q, k, v, window, options


def split(index, calls, backend, launch, models=False):
    """One problem's row, or None (with the reasons printed) where ``backend`` does not take it."""
    if models:
        name, q, k, v, window, options = model_inputs(index)
    else:
        q, k, v, _ = make_inputs(index)
        name, _, window, options, _ = PROBLEMS[index]
    verdict = next(v for v in haloattn.explain(q, k, v, window, verbose=False, **options).verdicts if v.name == backend)
    if not verdict.can_run:
        print(f"{name}: not run by {backend}: {'; '.join(verdict.reasons)}", flush=True)
        return None
    problem = build_problem(q, k, v, window, **options)
    inputs = AttentionInputs(q, k, v)
    out, lse = launch.forward(problem, inputs)
    go = torch.randn_like(out)
    forward = kernel_ms(lambda: launch.forward(problem, inputs), calls)
    backward = kernel_ms(lambda: launch.backward(problem, inputs, out, lse, go, None, NEEDS), calls)
    # The least each pass must move through memory: its inputs read once, its outputs written once.
    qkvo = sum(t.numel() * t.element_size() for t in (q, k, v, out)) + lse.numel() * lse.element_size()
    floor = {"forward": qkvo, "backward": qkvo + 2 * (q.numel() * q.element_size()) + k.numel() * k.element_size()
             + v.numel() * v.element_size()}
    return {"problem": name, "forward": forward, "backward": backward, "floor bytes": floor}


def report(row):
    fwd = sum(row["forward"].values())
    bwd = sum(row["backward"].values())
    parts = ", ".join(f"{name} {ms:.3f} ({ms / bwd:.0%})" for name, ms in
                      sorted(row["backward"].items(), key=lambda kv: -kv[1]))
    rates = ""
    if "floor bytes" in row:  # GB/s over each pass's least traffic
        rates = " | floor rate GB/s: forward {:.0f}, backward {:.0f}".format(
            row["floor bytes"]["forward"] / fwd / 1e6, row["floor bytes"]["backward"] / bwd / 1e6)
    print(f"{row['problem']}: forward {fwd:.3f} ms | backward {bwd:.3f} ms: {parts}{rates}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=None, help="problem indices, comma-separated (default: all)")
    parser.add_argument("--extra", action="store_true", help="also the problems of EXTRA_PROBLEMS")
    parser.add_argument("--models", action="store_true", help="bench_model_shapes.py's problems instead")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--backend", default="triton", choices=("triton", "cuda"))
    parser.add_argument("--json")
    args = parser.parse_args()
    # Both backends' launch modules take (problem, inputs) and return / take the same tensors.
    launch = importlib.import_module(f"haloattn.backends.{args.backend}.launch")
    if args.extra:
        PROBLEMS.extend(EXTRA_PROBLEMS)  # make_inputs reads this same list
    if args.models:
        from bench_model_shapes import PROBLEMS as MODEL_PROBLEMS
        count = len(MODEL_PROBLEMS)
    else:
        count = len(PROBLEMS)
    indices = [int(i) for i in args.only.split(",")] if args.only else range(count)
    print(f"# {torch.cuda.get_device_name()}, backend {args.backend}: device ms per call, default configs", flush=True)
    rows = []
    for index in indices:
        row = split(index, args.calls, args.backend, launch, args.models)
        if row is None:
            continue
        rows.append(row)
        report(row)
        write_json(args.json, rows)


if __name__ == "__main__":
    main()
