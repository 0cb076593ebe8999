"""Shared memory a block of the triton_window kernels needs, per tile class, dtype size and head
dim, compiled for one GPU target without a GPU: the numbers of window_launch's SHARED_MEMORY
table (the plugin compares them with the device's per-block limit to decide whether the window
kernels can launch there).

For each key (padded window tile: 64 slots or fewer, 128, or the long-window kernels beyond;
bytes per element; padded head dim) the launcher runs on meta tensors under the target's device
limits (sm90_compile.captured_launches), every captured kernel is built for the target with
Triton's bundled ptxas, and the largest forward and backward footprints are kept. Windows per
class: 8x8 (64 tokens), 11x11 (121: the 128-slot tile), 12x12 and 16x16 (long windows); every
problem with shifted windows and a Swin relative-position bias, as in bench_window.

    python benchmarks/window_shared_memory.py --capability 89 [--dims 32,64,128] [--classes 64,128,256]
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90_compile import GPUS, captured_launches, compile_captured  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import window_launch  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

# Tile class -> the square windows measured for it (the class's footprint is the largest).
WINDOWS = {64: (8,), 128: (11,), 256: (12, 16)}
DTYPES = {2: torch.bfloat16, 4: torch.float32}
FORWARD_KERNELS = ("window_forward_kernel", "window_long_forward_kernel")


def footprints(capability: int, tile: int, item: int, dim: int) -> tuple:
    """(forward, backward) shared memory in bytes, the largest over the class's windows."""
    gpu = GPUS[capability]
    forward = backward = 0
    for window in WINDOWS[tile]:
        q, k, v = torch.empty(2, 2 * window, 2 * window, 3, 2, dim, device="meta", dtype=DTYPES[item]).unbind(-3)
        rpb = torch.empty(2, 2 * window - 1, 2 * window - 1, device="meta")
        problem = build_problem(q, k, v, window, pattern="window", shift=window // 2, rpb=rpb)
        inputs = AttentionInputs(q, k, v, rpb)
        with captured_launches(window_launch, gpu) as sink:
            out, lse = window_launch.forward(problem, inputs)
            needs = (True, True, True, True, False, False, False)
            window_launch.backward(problem, inputs, out, lse, torch.empty_like(out), None, needs)
        for fn, _, args, kwargs in sink:
            label = f"sm{capability}-{window}x{window}-{item}B-d{dim}-{fn.__name__}"
            shared = compile_captured(fn, args, kwargs, label, capability=capability)["shared"]
            if fn.__name__ in FORWARD_KERNELS:
                forward = max(forward, shared)
            else:
                backward = max(backward, shared)
    return forward, backward


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capability", type=int, required=True, choices=sorted(GPUS))
    parser.add_argument("--dims", default="32,64,128")
    parser.add_argument("--classes", default="64,128,256")
    args = parser.parse_args()
    table = {}
    for tile in (int(t) for t in args.classes.split(",")):
        for item in DTYPES:
            for dim in (int(d) for d in args.dims.split(",")):
                table[(tile, item, dim)] = footprints(args.capability, tile, item, dim)
    print(f"# sm_{args.capability} ({GPUS[args.capability].name}): (tile, bytes per element, head dim): "
          "(forward, backward) bytes")
    print("{")
    for key, value in table.items():
        print(f"    {key}: {value},")
    print("}")


if __name__ == "__main__":
    main()
