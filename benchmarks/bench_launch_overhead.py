"""Host time per call against device time per call, on problems small enough for the host to matter.

A call whose host side (argument checks, dispatch, Triton's launcher) takes longer than its kernels
leaves the GPU idle between calls: then the host time, not the kernel, sets the speed. For each
problem this prints the host time per call (many calls queued without synchronising), the device
time (median of CUDA-graph replays: do_bench would time the host on exactly these problems) and, for scale, the same for the backend's launch function
called directly (no haloattn dispatch).

    python benchmarks/bench_launch_overhead.py [--profile]

``--profile`` also prints where the host time of ``attention()`` goes (cProfile, 300 calls of the
first problem: the forward's 25 most expensive functions by their own time, the forward+backward's
by cumulative time).

``--split`` prints, per problem, the host time of a training call's forward and of its
``backward()`` apart, and the device's idle time between the forward's last kernel and the
backward's first (torch.profiler): where the backward's host side outlasts the forward's kernels,
the device waits for it, and un-graphed timings (do_bench, eager training) pay that gap.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from triton.testing import do_bench_cudagraph

import haloattn
from haloattn.backend import AttentionInputs
from haloattn.dispatch import DISPATCHER
from haloattn.problem import build_problem

PROBLEMS = [
    # name, shape [B, *spatial, H, D], window, options
    ("2-D 128x128 16x16 stride 16, H 16, D 128", (1, 128, 128, 16, 128), 16, {"stride": 16}),
    ("2-D 32x32 7x7, H 4, D 64", (1, 32, 32, 4, 64), 7, {}),
    ("Swin-T stage 1 windows (B 128, 56x56, 7x7, H 3, D 32)", (128, 56, 56, 3, 32), 7, {"pattern": "window"}),
    ("Swin 7x7 windows, B 1, 56x56, H 3, D 32", (1, 56, 56, 3, 32), 7, {"pattern": "window", "shift": 3}),
]


def host_ms(fn, calls=200):
    fn()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - began) / calls * 1e3
    torch.cuda.synchronize()
    return host


def profile_host(fn, calls=300, sort="tottime"):
    fn()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats(sort).print_stats(25)


BACKWARD_KERNELS = ("dq_kernel", "row_stats", "dkdv", "backward")


def split_host_ms(leaves, grad, call, calls=200):
    """(forward host ms, backward() host ms) of a training call, calls queued without syncing."""
    call(*leaves).backward(grad)
    torch.cuda.synchronize()
    forward = backward = 0.0
    for _ in range(calls):
        began = time.perf_counter()
        out = call(*leaves)
        middle = time.perf_counter()
        out.backward(grad)
        backward += time.perf_counter() - middle
        forward += middle - began
    torch.cuda.synchronize()
    return forward / calls * 1e3, backward / calls * 1e3


def idle_before_backward_us(leaves, grad, call, calls=20):
    """Median device idle (us) between the end of a call's forward kernels and the start of its
    backward's first kernel, from a torch.profiler trace of ``calls`` training calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call(*leaves).backward(grad)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call(*leaves).backward(grad)
            torch.cuda.synchronize()  # each call alone on the device: gaps are its own
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    gaps, previous_end = [], None
    for event in kernels:
        # The backward's first kernel: the dQ pass, the statistics pass or the window backward.
        if previous_end is not None and any(part in event.name for part in BACKWARD_KERNELS):
            gaps.append(event.time_range.start - previous_end)
            previous_end = None
        elif not any(part in event.name for part in BACKWARD_KERNELS):
            previous_end = event.time_range.end
    gaps.sort()
    return gaps[len(gaps) // 2] if gaps else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--split", action="store_true")
    args = parser.parse_args()
    if args.split:
        return print_split()
    print("| problem | backend | attention(): host ms / device ms | backend.forward direct: host ms / device ms "
          "| attention() forward+backward: host ms / device ms |")
    print("|---|---|---|---|---|")
    for name, shape, window, options in PROBLEMS:
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        problem = build_problem(q, k, v, window, **options)
        backend, config = DISPATCHER.select(problem, None)
        inputs = AttentionInputs(q, k, v)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        grad = torch.randn_like(q)

        def api():
            return haloattn.attention(q, k, v, window, **options)

        def direct():
            return backend.forward(problem, inputs, config)

        def train():
            haloattn.attention(*leaves, window, **options).backward(grad)

        cells = [f"{host_ms(f):.3f} / {do_bench_cudagraph(f, rep=50, return_mode='median'):.3f}"
                 for f in (api, direct, train)]
        print(f"| {name} | {backend.name} | {' | '.join(cells)} |", flush=True)
        if args.profile and name == PROBLEMS[0][0]:
            profile_host(api)
            profile_host(train, sort="cumulative")


def print_split():
    print("| problem | backend | forward host ms | backward() host ms | forward device ms | device idle before "
          "the backward, us |")
    print("|---|---|---|---|---|---|")
    first = None
    for name, shape, window, options in PROBLEMS:
        q = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        backend, _ = DISPATCHER.select(build_problem(q, q, q, window, **options), None)
        leaves = [torch.randn_like(q).requires_grad_(True) for _ in range(3)]
        grad = torch.randn_like(q)

        def call(*tensors, window=window, options=options):
            return haloattn.attention(*tensors, window, **options)

        forward, backward = split_host_ms(leaves, grad, call)
        device = do_bench_cudagraph(lambda: call(q, q, q), rep=50, return_mode="median")
        idle = idle_before_backward_us(leaves, grad, call)
        print(f"| {name} | {backend.name} | {forward:.3f} | {backward:.3f} | {device:.3f} | {idle:.0f} |", flush=True)
        first = first or (lambda call=call, leaves=leaves, grad=grad: call(*leaves).backward(grad))
    print(f"\nWhere the host time of a training call of {PROBLEMS[0][0]} goes:")
    profile_host(first, sort="tottime")


if __name__ == "__main__":
    main()
