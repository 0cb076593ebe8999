"""The cuda backend's Hopper kernels on the neighbourhood benchmark's problems, without a GPU: for
the query-major walk (forward, dQ) and the key-major one (dK/dV) the pair and partner tile shapes,
the pairs their wgmma computes per attended pair, and the share of visited partner tiles that
need a mask (benchmarks/host/hopper_work.cu, compiled for the host with
nvcc from the kernel's own tiling headers). Efficiency / (computed / attended) is the kernel's rate
on the pairs it computes, as a fraction of dense cuDNN's.

    python benchmarks/hopper_work.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_neighborhood import PROBLEMS  # noqa: E402

import torch  # noqa: E402

from haloattn.problem import build_problem  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    lines, names = [], []
    for name, spatial, window, options, D in PROBLEMS:
        q = torch.empty(1, *spatial, 1, D, dtype=torch.bfloat16, device="meta")
        problem = build_problem(q, q, q, window, **options)
        axes = [(1, 1, 1, 1, 0, 0)] * (3 - problem.rank) + [
            (a.length, a.window, a.stride, a.dilation, int(a.causal), getattr(a, "shift", 0)) for a in problem.axes
        ]
        lines.append(f"{int(problem.pattern == 'window')} " + " ".join(" ".join(map(str, a)) for a in axes))
        names.append(name)
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "hopper_work")
        subprocess.run(["nvcc", "-std=c++17", "-x", "cu", "-I", os.path.join(ROOT, "csrc"),
                        os.path.join(ROOT, "benchmarks", "host", "hopper_work.cu"), "-o", exe], check=True)
        out = subprocess.run([exe], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True).stdout
    print("| problem | query pair / key tile | computed / attended | masked tiles | tiles per run "
          "| key pair / query tile (dK/dV) | computed / attended | masked tiles | tiles per run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, line in zip(names, out.splitlines()):
        parts = line.split()
        print(f"| {name} | {parts[1]} / {parts[3]} | {parts[5]} | {parts[7]} | {parts[9]} "
              f"| {parts[11]} / {parts[13]} | {parts[15]} | {parts[17]} | {parts[19]} |")

if __name__ == "__main__":
    main()
