"""GPU check of the forward holding its live-step lists in registers (launch.LIST_IN_REGISTERS, off
by default): its output against the default's (each list entry loaded at its step) on the two
mask_mod problems of bench_flex_mods.py, and against the reference backend on the 2-D one.

    python3 benchmarks/check_list_registers.py
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_flex_mods import MASK_VARIANTS, checker, packed_documents  # noqa: E402

import haloattn  # noqa: E402


def forward(q, k, v, window, mask, in_registers: bool):
    variant = {label: context for label, _, context in MASK_VARIANTS}["triton_list_in_registers"]
    with variant() if in_registers else contextlib.nullcontext():
        return haloattn.attention(q, k, v, window, backend="triton", mask_mod=mask).float()


def main() -> None:
    torch.manual_seed(0)
    for spatial, window, mask in (((128, 128), 31, checker), ((32768,), 2047, packed_documents(32768, "cuda"))):
        q, k, v = (torch.randn(1, *spatial, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        registers, loads = (forward(q, k, v, window, mask, flag) for flag in (True, False))
        line = f"{spatial}: registers against loads, max |difference| {(registers - loads).abs().max().item():.2e}"
        if len(spatial) == 2:
            ref = haloattn.attention(q.float(), k.float(), v.float(), window, backend="reference", mask_mod=mask)
            line += f"; against the reference, relative error {((registers - ref).norm() / ref.norm()).item():.2e}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
