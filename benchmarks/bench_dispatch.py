"""Dispatch overhead: a cached haloattn.attention() call versus running the chosen backend
directly (its forward; with --grad, its differentiable run, the autograd Function around it), on
a backend that does no work, so only the cost of haloattn's own Python remains.

    python benchmarks/bench_dispatch.py [--device cpu|cuda] [--calls 20000] [--grad]

Both loops run interleaved in rounds and the medians of the per-round means are compared, so
machine noise hits both alike. Prints the overhead per call in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import haloattn
from haloattn.backend import AttentionInputs
from haloattn.ops import AttentionFunction
from haloattn.problem import build_problem


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


class NullBackend(haloattn.Backend):
    """Returns preallocated outputs: isolates dispatch cost from any kernel's cost."""

    name = "bench_null"
    priority = -1000

    def __init__(self, out, lse):
        self.out, self.lse = out, lse

    def not_supported_reasons(self, problem):
        return []

    def forward(self, problem, inputs, config=None):
        return self.out, self.lse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--grad", action="store_true", help="inputs require grad (autograd path)")
    args = parser.parse_args()
    device = torch.device(args.device)
    q = torch.randn(1, 16, 1, 8, device=device)
    k = torch.randn(1, 16, 1, 8, device=device)
    v = torch.randn(1, 16, 1, 8, device=device, requires_grad=args.grad)
    problem = build_problem(q, k, v, 3)
    null = NullBackend(torch.empty_like(q), torch.empty(1, 16, 1, device=device))
    haloattn.register_backend(null)
    inputs = AttentionInputs(q, k, v)

    def through_api():
        return haloattn.attention(q, k, v, 3, backend="bench_null")

    if args.grad:
        def direct():
            return AttentionFunction.apply(problem, null, None, *inputs)
    else:
        def direct():
            return null.forward(problem, inputs, None)

    through_api()
    api_us, direct_us = [], []
    for _ in range(args.rounds):
        api_us.append(per_call_us(through_api, args.calls))
        direct_us.append(per_call_us(direct, args.calls))
    api, base = statistics.median(api_us), statistics.median(direct_us)
    mode = "autograd" if args.grad else "inference"
    print(f"device {device}, {mode}: attention() {api:.2f} us/call, backend run directly {base:.2f} us/call")
    print(f"dispatch overhead per cached call: {api - base:.2f} us (limit 20 us)")


if __name__ == "__main__":
    main()
