"""Where the key-query convolution's time goes on a GPU: torch.profiler over a forward and a
forward + backward of one bench_kq_conv.py problem (after a warm-up), the CUDA kernels and the
operators ranked by their device time. The dispatcher's choice (triton's fused kernels on NVIDIA
GPUs), or ``--backend reference`` for the unfused path.

    python benchmarks/profile_kq_conv.py [--problem 0] [--rows 18] [--backend reference]
"""

from __future__ import annotations

import argparse
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

import haloattn
from bench_kq_conv import PROBLEMS


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", type=int, default=0)
    parser.add_argument("--rows", type=int, default=18)
    parser.add_argument("--backend", default=None)
    args = parser.parse_args(argv)
    name, tokens, window, causal, heads, head_dim, c_q, c_k = PROBLEMS[args.problem]
    warnings.simplefilter("ignore", haloattn.SlowPathWarning)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, tokens, heads, head_dim, generator=gen).cuda().bfloat16().requires_grad_()
               for _ in range(3))
    weight = (0.1 * torch.randn(heads, c_q, c_k, generator=gen)).cuda().requires_grad_()
    grad = torch.randn(1, tokens, heads, head_dim, generator=gen).cuda().bfloat16()

    def forward_and_backward():
        haloattn.attention(q, k, v, window, kq_conv=weight, causal=causal, backend=args.backend).backward(grad)

    def forward():
        with torch.no_grad():
            haloattn.attention(q, k, v, window, kq_conv=weight, causal=causal, backend=args.backend)

    for _ in range(2):
        forward_and_backward()
    torch.cuda.synchronize()
    for label, call in (("forward", forward), ("forward + backward", forward_and_backward)):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        print(f"## {name}: {label}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
