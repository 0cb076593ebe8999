"""Random problems with a window of 1 on some axes (axial, per-frame and time-only attention) and
one long axis, so that the default tiles are one token deep on the window-1 axes
(tiles._shapes), through backend ``triton`` under Triton's interpreter against the float64
oracle: forward, LSE and every gradient (tests/test_triton_gpu.check_against_oracle). Strides,
causal axes, dilation of the long axis, rpb and GQA are drawn too. A few seconds a problem.

    python benchmarks/sweep_window_one.py SEED COUNT [--anisotropic]

``--anisotropic`` draws windows of 2-3 on the short axes instead of 1: the boxes shaped like
such windows (16-64x longer than deep) that window-relative thinness (tiles.THIN_RELATIVE_TO_WINDOW,
the default) admits, checked the same way.

Prints one line per problem (``OK`` or ``FAIL`` with the problem) and the number of failures.
"""

import argparse
import os
import pathlib
import random
import sys

os.environ["TRITON_INTERPRET"] = "1"  # decided before Triton is imported
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
import torch  # noqa: E402
from test_triton_gpu import check_against_oracle  # noqa: E402


def draw(rng: random.Random, anisotropic: bool = False):
    """(spatial, window, options) of one problem: short axes of window 1 (at times wider; 2-3 if
    ``anisotropic``), one long axis of window 2-17 (at times 1)."""
    rank = rng.choice((2, 3))
    spatial = [rng.choice((3, 4, 6) if anisotropic else (1, 2, 3, 5)) for _ in range(rank)]
    long_axis = rng.randrange(rank)
    spatial[long_axis] = rng.choice((40, 64, 70, 96))
    window = [1 if a != long_axis or rng.random() < 0.2 else rng.randint(2, min(17, spatial[a])) for a in range(rank)]
    for a in range(rank):
        if a != long_axis and anisotropic:
            window[a] = rng.randint(2, 3)
        elif a != long_axis and spatial[a] > 1 and rng.random() < 0.3:
            window[a] = rng.randint(1, spatial[a])
    options = {}
    if rng.random() < 0.4:
        options["causal"] = tuple(rng.random() < 0.5 for _ in range(rank))
    if rng.random() < 0.3:
        options["stride"] = tuple(rng.randint(1, w) for w in window)
    if rng.random() < 0.3 and spatial[long_axis] // 2 >= window[long_axis]:
        options["dilation"] = tuple(2 if a == long_axis else 1 for a in range(rank))
    if rng.random() < 0.3:
        options["rpb"] = True
    if rng.random() < 0.3:
        options["heads"], options["kv_heads"] = 4, 2
    return tuple(spatial), tuple(window), options


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seed", type=int)
    parser.add_argument("count", type=int)
    parser.add_argument("--anisotropic", action="store_true", help="windows of 2-3 on the short axes")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    failures = 0
    for index in range(args.count):
        spatial, window, options = draw(rng, args.anisotropic)
        try:
            check_against_oracle(spatial, window, dtype=torch.float32, seed=index, **options)
            print(index, "OK", spatial, window, options, flush=True)
        except AssertionError as error:
            failures += 1
            print(index, "FAIL", spatial, window, options, str(error)[:300], flush=True)
    print("failures", failures)


if __name__ == "__main__":
    main()
