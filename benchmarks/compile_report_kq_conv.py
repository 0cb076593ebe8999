"""Compile the key-query convolution kernels (kq_conv_kernel, kq_conv_backward) for a GPU target
without a GPU, and report what the compiler made (registers, spills, shared memory, SASS counts;
sm90_compile.py says how).

Problems: MTA's kernel (6 x 11) on causal 1-D windows, as benchmarks/bench_kq_conv.py times them,
in every dtype the kernels take, plus a kernel with no reach along the keys (no halos).

    python benchmarks/compile_report_kq_conv.py [--dtypes bfloat16,float16,float32] [--capability 90]
        [--config JSON] [--sass DIR] [--ttgir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90_compile import GPUS, captured_launches, compile_captured  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import kq_conv_launch  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

# name: (tokens, window, causal, heads, head_dim, (c_q, c_k), with rpb (and its gradient), softcap and
# 8 additional tokens)
PROBLEMS = [
    ("1-D 8192, window 1023 causal, 16 x 128, MTA 6x11", (8192, 1023, True, 16, 128, (6, 11), False)),
    ("1-D 16384, window 511, 16 x 64, MTA 6x11", (16384, 511, False, 16, 64, (6, 11), False)),
    ("1-D 4096, window 255 causal, 8 x 64, 2x1 (no halos)", (4096, 255, True, 8, 64, (2, 1), False)),
    ("1-D 4096, window 511, 8 x 256, 4x7", (4096, 511, False, 8, 256, (4, 7), False)),
    ("1-D 2048, window 255, 8 x 64, 3x5, rpb, softcap, additional tokens", (2048, 255, False, 8, 64, (3, 5), True)),
]


def problem_inputs(tokens, window, causal, heads, head_dim, kernel, biased, dtype):
    def meta(*shape, dt=dtype):
        return torch.empty(*shape, device="meta", dtype=dt)

    q, k, v = (meta(1, tokens, heads, head_dim) for _ in range(3))
    weight = meta(heads, *kernel, dt=torch.float32)
    rpb = meta(heads, 2 * window - 1, dt=torch.float32) if biased else None
    ak, av = (meta(1, 8, heads, head_dim) for _ in range(2)) if biased else (None, None)
    problem = build_problem(q, k, v, window, causal=causal, kq_conv=weight, rpb=rpb, softcap=30.0 if biased else None,
                            additional_keys=ak, additional_values=av)
    return problem, AttentionInputs(q, k, v, rpb, weight, ak, av)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="bfloat16,float16,float32")
    parser.add_argument("--problems", default=",".join(str(i) for i in range(len(PROBLEMS))))
    parser.add_argument("--capability", type=int, default=90, choices=sorted(GPUS))
    parser.add_argument("--config", help='JSON config, e.g. \'{"kq": {"warps": 8}, "kq_bwd": {"block_n": 64}}\'')
    parser.add_argument("--sass")
    parser.add_argument("--ttgir")
    args = parser.parse_args()
    config = json.loads(args.config) if args.config else None
    rows = []
    for index in [int(i) for i in args.problems.split(",")]:
        name, shape = PROBLEMS[index]
        for dtype_name in args.dtypes.split(","):
            problem, inputs = problem_inputs(*shape, getattr(torch, dtype_name))
            with captured_launches(kq_conv_launch, GPUS[args.capability]) as sink:
                out, lse = kq_conv_launch.forward(problem, inputs, config)
                extra = problem.extra_tokens > 0
                needs = (True, True, True, problem.has_rpb, True, extra, extra)
                kq_conv_launch.backward(problem, inputs, out, lse, torch.empty_like(out), None, needs, config)
            for fn, grid, a, kw in sink:
                label = f"{index}-{dtype_name}-{fn.__name__.replace('_kernel', '')}"
                print(f"# {name} {dtype_name}: grid {grid}", flush=True)
                rows.append(compile_captured(fn, a, kw, label, args.sass, args.ttgir, args.capability))
    return rows


if __name__ == "__main__":
    main()
