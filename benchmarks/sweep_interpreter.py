"""Tiny random problems (tests/tiny_random.py: every feature, drawn per seed) through a Triton
backend against the float64 oracle, under Triton's interpreter (CPU, no GPU) or, with ``--gpu``,
compiled on the current CUDA device (the oracles stay on the CPU; float32 products are then what
the backend picks: TF32 off, three TF32 products). Forward, LSE and every gradient, one seed per
problem; tolerances in tiny_random's docstring.

    python benchmarks/sweep_interpreter.py 6000 6150 [--backend triton] [--head-dims 72,80,144,160] [--gpu]
        [--dtype bfloat16] [--kq-conv] [--mods]

``--head-dims`` draws head and value dims from that list instead of 8, 16, 32 (72-160: around the
kernels' block-and-tail split of head dims, tiles.head_split; slower). ``--dtype`` draws the
inputs in float16 or bfloat16 instead of float32. ``--kq-conv`` draws rank-1 problems with a
key-query convolution (its gradient checked too). ``--mods`` adds a score_mod and / or mask_mod
(tiny_random.SCORE_MODS / MASK_MODS), which backend triton compiles into its kernels.

Prints one line per seed (``OK``, ``FAIL`` with the errors and the problem, or ``REFUSED`` with
the backend's reason; any other error is raised) and the number of failures. Slow: a few seconds
per problem.
"""

import argparse
import os
import pathlib
import sys

ON_GPU = "--gpu" in sys.argv  # decided before Triton is imported
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from tiny_random import DTYPES, HEAD_DIMS, check  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=int)
    parser.add_argument("end", type=int, help="one past the last seed")
    parser.add_argument("--backend", default="triton")
    parser.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)))
    parser.add_argument("--gpu", action="store_true", help="compiled kernels on the CUDA device, not the interpreter")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="the inputs' dtype")
    parser.add_argument("--kq-conv", action="store_true", help="rank-1 problems with a key-query convolution")
    parser.add_argument("--mods", action="store_true", help="problems with a score_mod and / or mask_mod")
    args = parser.parse_args()
    head_dims = tuple(int(d) for d in args.head_dims.split(","))
    failures = 0
    for seed in range(args.first, args.end):
        verdict = check(seed, args.backend, head_dims, "cuda" if args.gpu else "cpu", DTYPES[args.dtype],
                        args.kq_conv, args.mods)
        failures += verdict.startswith("FAIL")
        print(seed, verdict, flush=True)
    print("failures", failures)


if __name__ == "__main__":
    main()
