"""The key-query convolution (Multi-Token Attention) against the same call without it.

On CUDA devices kq_conv runs fused on ``triton`` (kq_conv_kernel, kq_conv_backward) and, for the
comparison, on the reference backend (backends/reference/conv_tiles.py: tiles of query rows, one
grouped conv2d a block), the path every kq_conv call took before the fused kernels; on CPUs on
the reference only. The yardstick is the same problem without the convolution on the best
backend the dispatcher has (triton on NVIDIA GPUs, the reference on CPUs). Times forward and
forward + backward (every call in turn, --repeat rounds after a warm-up, medians, the device
synchronised), reports each against the yardstick, and the outputs' distance from a float64 run.

    python benchmarks/bench_kq_conv.py [--device cuda] [--repeat 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import haloattn
from haloattn.tuning import time_call

# (name, tokens, window, causal, heads, head_dim, c_q, c_k): MTA's kernel is 6 x 11
PROBLEMS = [
    ("1-D 8192, window 1023 causal, MTA 6x11", 8192, 1023, True, 16, 128, 6, 11),
    ("1-D 16384, window 511, MTA 6x11", 16384, 511, False, 16, 64, 6, 11),
    ("1-D 4096, window 255 causal, 2x3", 4096, 255, True, 8, 64, 2, 3),
]
CPU_PROBLEMS = [
    ("1-D 4096, window 127, MTA 6x11", 4096, 127, False, 4, 64, 6, 11),
    ("1-D 2048, window 255 causal, MTA 6x11", 2048, 255, True, 4, 64, 6, 11),
]


def run(problem, device, dtype, repeat):
    name, tokens, window, causal, heads, head_dim, c_q, c_k = problem
    gen = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(device=device, dtype=dtype)

    q, k, v = (randn(1, tokens, heads, head_dim).requires_grad_() for _ in range(3))
    weight = randn(heads, c_q, c_k, scale=0.1).float().requires_grad_()
    grad = randn(1, tokens, heads, head_dim)
    options = dict(causal=causal)

    def forward(backend, kq):
        with torch.no_grad():
            haloattn.attention(q, k, v, window, kq_conv=weight if kq else None, backend=backend, **options)

    def both(backend, kq):
        out = haloattn.attention(q, k, v, window, kq_conv=weight if kq else None, backend=backend, **options)
        out.backward(grad)

    row = dict(problem=name, dtype=str(dtype).replace("torch.", ""), device=str(device),
               yardstick=haloattn.explain(q, k, v, window, verbose=False, **options).chosen)
    variants = [("reference", "reference", True), ("plain", None, False)]
    if device.type == "cuda":
        variants.insert(0, ("fused", "triton", True))
    # Every call in turn, round after round (the machine's state drifts; ratios of calls timed
    # side by side hold): medians of the rounds.
    calls = {f"{label}_{kind}": (lambda f=f, b=backend, kq=kq: f(b, kq))
             for label, backend, kq in variants
             for kind, f in (("fwd_ms", forward), ("fwd_bwd_ms", both))}
    samples = {name: [] for name in calls}
    for call in calls.values():
        call()  # warm-up
    for _ in range(repeat):
        for name, call in calls.items():
            samples[name].append(time_call(call, device, warmup=0, repeat=1))
    row.update({name: statistics.median(times) for name, times in samples.items()})
    with torch.no_grad():
        ref = haloattn.attention(q.double(), k.double(), v.double(), window, kq_conv=weight.double(), **options)
        for label, backend, kq in variants[:-1]:
            for kind in ("fwd", "fwd_bwd"):
                row[f"{label}_{kind}_ratio"] = row[f"{label}_{kind}_ms"] / row[f"plain_{kind}_ms"]
            out = haloattn.attention(q, k, v, window, kq_conv=weight, backend=backend, **options).double()
            row[f"{label}_rel_err"] = ((out - ref).norm() / ref.norm()).item()
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    problems = PROBLEMS if device.type == "cuda" else CPU_PROBLEMS
    rows = []
    labels = ["fused", "reference"] if device.type == "cuda" else ["reference"]
    print("| problem | kq_conv on | fwd ms | plain fwd ms (backend) | ratio | fwd+bwd ms | plain fwd+bwd ms | ratio "
          "| rel err |")
    print("|" + "---|" * 9)
    for problem in problems:
        r = run(problem, device, dtype, args.repeat)
        rows.append(r)
        for label in labels:
            print(f"| {r['problem']} | {label} | {r[label + '_fwd_ms']:.2f} | {r['plain_fwd_ms']:.2f} "
                  f"({r['yardstick']}) | {r[label + '_fwd_ratio']:.1f}x | {r[label + '_fwd_bwd_ms']:.2f} | "
                  f"{r['plain_fwd_bwd_ms']:.2f} | {r[label + '_fwd_bwd_ratio']:.1f}x | {r[label + '_rel_err']:.1e} |",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
