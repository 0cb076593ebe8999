"""The cuda backend's Hopper kernels on the neighbourhood benchmark's problems, without a GPU: for
the query-major walk (forward, dQ) and the key-major one (dK/dV) the pair and partner tile shapes,
the pairs their wgmma computes per attended pair, and the share of visited partner tiles that
need a mask (benchmarks/host/hopper_work.cu, compiled for the host with
nvcc from the kernel's own tiling headers). Efficiency / (computed / attended) is the kernel's rate
on the pairs it computes, as a fraction of dense cuDNN's.

    python benchmarks/hopper_work.py [--extra] [--against REVISION]

``--extra`` adds kernel_split's extra problems and a few more small windows (models' shapes);
``--against REVISION`` also counts with that git revision's csrc/ tiling headers, side by side.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernel_variants import EXTRA_PROBLEMS  # noqa: E402
from bench_neighborhood import PROBLEMS  # noqa: E402

import torch  # noqa: E402

from haloattn.problem import build_problem  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Small windows on larger grids, where a key tile grid anchored at the common window (before
# 2026-11-27) laid an extra tile along most axes.
SMALL_WINDOW_PROBLEMS = [
    ("2-D 200x200, 17x17", (200, 200), 17, {}, 128),
    ("3-D 32x32x32, 9x9x9 causal time", (32, 32, 32), 9, {"causal": (True, False, False)}, 128),
]


def problem_lines(problems):
    lines = []
    for _, spatial, window, options, D in problems:
        q = torch.empty(1, *spatial, 1, D, dtype=torch.bfloat16, device="meta")
        problem = build_problem(q, q, q, window, **options)
        axes = [(1, 1, 1, 1, 0, 0)] * (3 - problem.rank) + [
            (a.length, a.window, a.stride, a.dilation, int(a.causal), getattr(a, "shift", 0)) for a in problem.axes
        ]
        lines.append(f"{int(problem.pattern == 'window')} " + " ".join(" ".join(map(str, a)) for a in axes))
    return lines


def count(csrc: str, lines) -> list[list[str]]:
    """hopper_work.cu compiled against the tiling headers in ``csrc``, one split line per problem."""
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "hopper_work")
        subprocess.run(["nvcc", "-std=c++17", "-x", "cu", "-I", csrc,
                        os.path.join(ROOT, "benchmarks", "host", "hopper_work.cu"), "-o", exe], check=True)
        out = subprocess.run([exe], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True).stdout
    return [line.split() for line in out.splitlines()]


def revision_csrc(revision: str, tmp: str) -> str:
    archive = subprocess.run(["git", "-C", ROOT, "archive", revision, "csrc"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
    return os.path.join(tmp, "csrc")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--extra", action="store_true", help="also kernel_split's extra problems and a few small windows")
    parser.add_argument("--against", metavar="REVISION", help="also count with this git revision's tiling headers")
    args = parser.parse_args()
    problems = PROBLEMS + (EXTRA_PROBLEMS + SMALL_WINDOW_PROBLEMS if args.extra else [])
    lines = problem_lines(problems)
    rows = count(os.path.join(ROOT, "csrc"), lines)
    if args.against:
        with tempfile.TemporaryDirectory() as tmp:
            old_rows = count(revision_csrc(args.against, tmp), lines)
        print(f"| problem | query pair / key tile | computed / attended | {args.against}: pair / tile | computed / attended "
              f"| dK/dV computed / attended | {args.against}: dK/dV |")
        print("|---|---|---|---|---|---|---|")
        for (name, *_), new, old in zip(problems, rows, old_rows):
            print(f"| {name} | {new[1]} / {new[3]} | {new[5]} | {old[1]} / {old[3]} | {old[5]} | {new[15]} | {old[15]} |")
        return
    print("| problem | query pair / key tile | computed / attended | masked tiles | tiles per run "
          "| key pair / query tile (dK/dV) | computed / attended | masked tiles | tiles per run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, *_), parts in zip(problems, rows):
        print(f"| {name} | {parts[1]} / {parts[3]} | {parts[5]} | {parts[7]} | {parts[9]} "
              f"| {parts[11]} / {parts[13]} | {parts[15]} | {parts[17]} | {parts[19]} |")


if __name__ == "__main__":
    main()
