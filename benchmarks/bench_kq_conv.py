"""The key-query convolution (Multi-Token Attention) against the same call without it.

kq_conv runs on the reference backend (backends/reference/conv_tiles.py: tiles of query rows, one
grouped conv2d a block) on every device; the yardstick is the same problem without the
convolution on the best backend the dispatcher has (triton on NVIDIA GPUs, the reference on
CPUs). Times forward and forward + backward (the four calls in turn, --repeat rounds after a
warm-up, medians, the device synchronised), reports both and their ratio, and the output's
distance from a float64 run of the same call.

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

    def forward(kq):
        with torch.no_grad():
            haloattn.attention(q, k, v, window, kq_conv=weight if kq else None, **options)

    def both(kq):
        out = haloattn.attention(q, k, v, window, kq_conv=weight if kq else None, **options)
        out.backward(grad)

    row = dict(problem=name, dtype=str(dtype).replace("torch.", ""), device=str(device),
               yardstick=haloattn.explain(q, k, v, window, verbose=False, **options).chosen)
    # The four calls in turn, round after round (the machine's state drifts; ratios of calls
    # timed side by side hold): medians of the rounds.
    calls = {f"{label}_{kind}": (lambda f=f, kq=kq: f(kq))
             for label, kq in (("kq_conv", True), ("plain", False))
             for kind, f in (("fwd_ms", forward), ("fwd_bwd_ms", both))}
    samples = {name: [] for name in calls}
    for call in calls.values():
        call()  # warm-up
    for _ in range(repeat):
        for name, call in calls.items():
            samples[name].append(time_call(call, device, warmup=0, repeat=1))
    row.update({name: statistics.median(times) for name, times in samples.items()})
    row["fwd_ratio"] = row["kq_conv_fwd_ms"] / row["plain_fwd_ms"]
    row["fwd_bwd_ratio"] = row["kq_conv_fwd_bwd_ms"] / row["plain_fwd_bwd_ms"]
    with torch.no_grad():
        out = haloattn.attention(q, k, v, window, kq_conv=weight, **options).double()
        ref = haloattn.attention(q.double(), k.double(), v.double(), window, kq_conv=weight.double(), **options)
    row["rel_err_vs_float64"] = ((out - ref).norm() / ref.norm()).item()
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
    print("| problem | kq_conv fwd ms | plain fwd ms (backend) | ratio | kq_conv fwd+bwd ms | plain fwd+bwd ms | ratio | rel err |")
    print("|" + "---|" * 8)
    for problem in problems:
        r = run(problem, device, dtype, args.repeat)
        rows.append(r)
        print(f"| {r['problem']} | {r['kq_conv_fwd_ms']:.2f} | {r['plain_fwd_ms']:.2f} ({r['yardstick']}) | "
              f"{r['fwd_ratio']:.1f}x | {r['kq_conv_fwd_bwd_ms']:.2f} | {r['plain_fwd_bwd_ms']:.2f} | "
              f"{r['fwd_bwd_ratio']:.1f}x | {r['rel_err_vs_float64']:.1e} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
