"""Where the host time of a training call's backward goes, layer by layer.

A training call's ``backward()`` runs on the host while the device may already have finished the
forward's kernels: where the backward's host side outlasts the forward's device time, the device
idles (``bench_launch_overhead.py --split`` measures that gap). This splits the backward's host
time into its layers, on problems whose kernels take a few microseconds (so the host, not a full
launch queue, sets every figure):

* ``backward()``: the whole of ``out.backward(grad)`` (autograd's engine, haloattn's Function,
  the backend, the launches);
* ``in the engine``: the time ``AttentionFunction.backward`` itself takes when autograd's engine
  calls it (on its device thread), the rest of ``backward()`` being the engine's;
* ``Function.backward``: the same function called directly, in the calling thread, on a context
  as the forward left it;
* ``backend.backward``: the backend's own call (argument checks, buffers, plan lookup, launches);
* ``launches``: the kernels alone, started from their plans;
* ``engine baseline``: ``backward()`` through an autograd Function of q, k, v whose backward
  returns preallocated gradients: what autograd's engine costs any custom op;
* ``engine, attention's signature``: the same with AttentionFunction's signature (three
  non-tensor and seven tensor inputs, four of them None; two outputs; five tensors saved).

    python benchmarks/bench_backward_host.py [--calls 300]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_launch_overhead import host_ms  # noqa: E402

import haloattn  # noqa: E402
from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import launch as triton_launch  # noqa: E402
from haloattn.dispatch import DISPATCHER  # noqa: E402
from haloattn.ops import AttentionFunction  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

PROBLEMS = [
    # name, shape [B, *spatial, H, D], window, options: one window's worth of the rows
    ("2-D 16x16, window 16 stride 16, H 16, D 128", (1, 16, 16, 16, 128), 16, {"stride": 16}),
    ("2-D 16x16, window 7, H 4, D 64", (1, 16, 16, 4, 64), 7, {}),
    ("1-D 256, window 65, H 8, D 64", (1, 256, 8, 64), 65, {}),
]


def host_us(fn, calls):
    """Mean host microseconds of ``fn`` over ``calls`` calls, the device synchronised around."""
    return host_ms(fn, calls) * 1e3


class PreparedGradients(torch.autograd.Function):
    """An op of q, k, v whose backward hands back gradients made in advance."""

    @staticmethod
    def forward(ctx, grads, q, k, v):
        ctx.grads = grads
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, grad):
        return (None, *ctx.grads)


def _engine_call_us(training, calls):
    """Mean microseconds that AttentionFunction.backward takes when the engine calls it."""
    original, spent = AttentionFunction.backward, []

    def timed(ctx, *grads):
        began = time.perf_counter()
        try:
            return original(ctx, *grads)
        finally:
            spent.append(time.perf_counter() - began)

    AttentionFunction.backward = staticmethod(timed)
    try:
        host_us(training, calls)
    finally:
        AttentionFunction.backward = staticmethod(original)
    return sum(spent[1:]) / len(spent[1:]) * 1e6  # host_ms's first call warms up


class PreparedGradientsLikeAttention(torch.autograd.Function):
    """PreparedGradients with AttentionFunction's inputs, outputs and saved tensors."""

    @staticmethod
    def forward(ctx, problem, backend, grads, *tensors):
        out, lse = torch.empty_like(tensors[0]), torch.empty(tensors[0].shape[:-1], device=tensors[0].device)
        ctx.grads = grads
        ctx.save_for_backward(*tensors, out, lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        ctx.saved_tensors  # unpacked, as AttentionFunction.backward unpacks its own
        return (None, None, None, *ctx.grads, None, None, None, None)


def layers(name, shape, window, options, calls):
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    problem = build_problem(q, k, v, window, **options)
    backend, config = DISPATCHER.select(problem, None)
    row = {"problem": name, "backend": backend.name}

    def no_grads():  # each backward's gradients are taken over, not added to the last ones
        for t in (q, k, v):
            t.grad = None

    def training():
        no_grads()
        haloattn.attention(q, k, v, window, **options).backward(grad)

    def forward_only():
        no_grads()
        haloattn.attention(q, k, v, window, **options)

    row["forward (graph built)"] = host_us(forward_only, calls)
    row["backward()"] = host_us(training, calls) - row["forward (graph built)"]
    row["in the engine"] = _engine_call_us(training, calls)

    out = haloattn.attention(q, k, v, window, **options)
    node = out.grad_fn  # a custom Function's backward node is its ctx, as the forward left it
    assert type(node).__name__ == "AttentionFunctionBackward", type(node).__name__

    def function_backward():
        with torch.no_grad():  # as the engine runs a first-order backward
            AttentionFunction.backward(node, grad, None)

    row["Function.backward"] = host_us(function_backward, calls)

    inputs = AttentionInputs(q.detach(), k.detach(), v.detach())
    out_, lse = backend.forward(problem, inputs, config)
    needs = (True, True, True, False, False, False, False)
    row["backend.backward"] = host_us(
        lambda: backend.backward(problem, inputs, out_, lse, grad, None, needs, config), calls)

    if backend.name == "triton":
        started = []
        original = triton_launch._start

        def recording(launch, *tensors):
            started.append((launch, tensors))
            original(launch, *tensors)

        triton_launch._start = recording
        try:
            backend.backward(problem, inputs, out_, lse, grad, None, needs, config)
        finally:
            triton_launch._start = original
        row["launches"] = host_us(lambda: [launch(*tensors) for launch, tensors in started], calls)
        row["kernels"] = len(started)

    grads = [torch.empty_like(t) for t in (q, k, v)]

    def baseline():
        no_grads()
        PreparedGradients.apply(grads, q, k, v).backward(grad)

    def baseline_forward():
        no_grads()
        PreparedGradients.apply(grads, q, k, v)

    row["engine baseline"] = host_us(baseline, calls) - host_us(baseline_forward, calls)

    def like_attention(backward=True):
        no_grads()
        out, _ = PreparedGradientsLikeAttention.apply(problem, backend, grads, q, k, v, None, None, None, None)
        if backward:
            out.backward(grad)

    row["engine, attention's signature"] = (host_us(like_attention, calls)
                                            - host_us(lambda: like_attention(False), calls))
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    columns = ("forward (graph built)", "backward()", "in the engine", "Function.backward", "backend.backward", "launches",
               "engine baseline", "engine, attention's signature")
    print(f"# {torch.cuda.get_device_name()}: host us per call")
    print("| problem | backend | " + " | ".join(columns) + " | kernels |")
    print("|---|---|" + "---|" * (len(columns) + 1))
    for name, shape, window, options in PROBLEMS:
        row = layers(name, shape, window, options, args.calls)
        cells = [f"{row[c]:.0f}" if c in row else "-" for c in columns]
        print(f"| {name} | {row['backend']} | {' | '.join(cells)} | {row.get('kernels', '-')} |", flush=True)


if __name__ == "__main__":
    main()
