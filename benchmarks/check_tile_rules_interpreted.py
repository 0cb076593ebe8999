"""The problems of tests/test_triton_gpu.py::test_1d_forward_tile_rules (forward and every
gradient against the float64 oracle, bias and additional tokens included) on the CPU, under
Triton's interpreter: the tiles of tiles.WIDE_1D_FORWARD_TILES and tiles.NARROW_128_BLOCK_RULE
checked for what they compute where no GPU is lent (the interpreter picks the configs a Hopper
GPU would). About a minute or two a problem.

    python benchmarks/check_tile_rules_interpreted.py
"""

import math
import os
import pathlib
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))

import torch  # noqa: E402

from haloattn.backends.triton import interpreter_compat, tiles  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402
from test_triton_gpu import check_against_oracle  # noqa: E402

# (dtype, head_dim, value_dim, spatial, window, options, forward tiles: queries, keys, warps)
CASES = [
    (torch.bfloat16, 256, 256, (2000,), 1023, dict(causal=True, extra=3), (128, 64, 8)),
    (torch.float16, 192, 160, (1800,), 901, dict(softcap=30.0), (128, 64, 8)),
    (torch.bfloat16, 64, 64, (3000,), 1023, dict(causal=True), (64, 64, 4)),
    (torch.float16, 32, 48, (2600,), 1501, dict(extra=2), (64, 64, 4)),
]


def main():
    interpreter_compat.install()
    for dtype, head_dim, value_dim, spatial, window, options, expected in CASES:
        options = dict(options)
        extra = options.pop("extra", 0)
        q = torch.empty(1, *spatial, 2, head_dim, dtype=dtype)
        k = torch.empty(1, *spatial, 1, head_dim, dtype=dtype)
        v = torch.empty(1, *spatial, 1, value_dim, dtype=dtype)
        fwd = tiles.normalise(None, build_problem(q, k, v, window, **options))["fwd"]
        assert (math.prod(fwd["q"]), math.prod(fwd["kv"]), fwd["warps"]) == expected, fwd
        start = time.time()
        check_against_oracle(spatial, window, dtype=dtype, device="cpu", head_dim=head_dim, value_dim=value_dim,
                             batch=1, heads=2, kv_heads=1, rpb=True, extra=extra, **options)
        print(f"OK {dtype} D={head_dim}/{value_dim} {spatial} window {window} {options} extra {extra}: "
              f"tiles {expected}, {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
