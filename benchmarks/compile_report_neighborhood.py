"""Compile the triton neighbourhood kernels for sm_90 without a GPU and report what the compiler made.

No device time: the launch code of ``haloattn.backends.triton.launch`` runs on meta tensors with its
kernel launch captured, the captured arguments are specialised the way Triton's JIT would
(16-divisible ints and pointers get the divisibility hint, ints equal to 1 become constants), and
``triton.compile`` builds for ``cuda:90`` with the bundled ptxas. Printed per kernel: registers,
spills (local-memory bytes), shared memory, and counts of the SASS instructions that matter here
(HGMMA = wgmma, LDGSTS = cp.async, UTMALDG = TMA, LDG = plain global loads, MUFU.EX2).

    python benchmarks/compile_report_neighborhood.py [--only 1,5] [--extra] [--backward] [--sass DIR]

``--extra`` adds bench_kernel_variants.EXTRA_PROBLEMS as problems 10 and up.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_neighborhood import BATCH, HEADS, PROBLEMS  # noqa: E402
from sm90_compile import captured_launches, compile_captured  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import launch, tiles  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

def problem_tensors(index, device="meta"):
    name, spatial, window, options, D = PROBLEMS[index]
    q, k, v = (torch.empty(BATCH, *spatial, HEADS, D, device=device, dtype=torch.bfloat16) for _ in range(3))
    return name, q, k, v, build_problem(q, k, v, window, **options)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="1")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--extra", action="store_true", help="also problems 10 and up: EXTRA_PROBLEMS")
    parser.add_argument("--sass", help="folder to keep the SASS of each kernel in")
    parser.add_argument("--config", help="JSON config (as tiles.normalise takes) instead of the default")
    args = parser.parse_args()
    import json

    os.environ.pop("TRITON_INTERPRET", None)
    if args.extra:
        from bench_kernel_variants import EXTRA_PROBLEMS
        PROBLEMS.extend(EXTRA_PROBLEMS)
    for index in [int(i) for i in args.only.split(",")]:
        name, q, k, v, problem = problem_tensors(index)
        config = json.loads(args.config) if args.config else None
        print(f"# {name}: {tiles.normalise(config, problem)}")
        with captured_launches(launch) as sink:
            inputs = AttentionInputs(q, k, v)
            out, lse = launch.forward(problem, inputs, config)
            if args.backward:
                needs = (True, True, True, False, False, False, False)
                launch.backward(problem, inputs, out, lse, torch.empty_like(out), None, needs, config)
        for fn, _, a, kw in sink:
            compile_captured(fn, a, kw, f"{index}-{fn.__name__}", args.sass)


if __name__ == "__main__":
    main()
