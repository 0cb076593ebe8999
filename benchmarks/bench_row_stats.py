"""The backward's statistics kernel (row_stats_kernel) alone: rows per program and warps against
the bytes it must move, so its launch shape can be chosen from a measurement.

    python benchmarks/bench_row_stats.py [--tokens 16384] [--heads 16] [--dv 128]

Prints, per (rows per program, warps), the kernel's median CUDA-graph time (device time: a
launch through Triton's binder takes longer on the host than this kernel on the device) and its read bandwidth
(O and dO, 2 bytes an element), and the same for torch's ``(o * do).sum(-1)`` in float32 as a
yardstick of what a plain reduction over these bytes reaches on this device.
"""

from __future__ import annotations

import argparse

import torch
import triton
from triton.testing import do_bench_cudagraph

from haloattn.backends.triton.backward_kernels import row_stats_kernel


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dv", type=int, default=128)
    args = parser.parse_args()
    rows, dv = args.tokens * args.heads, args.dv
    o, do = (torch.randn(rows, dv, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(rows, device="cuda")
    stats = torch.empty(rows, 4, device="cuda")
    read = 2 * rows * dv * 2
    print(f"# {torch.cuda.get_device_name()}: {rows} rows of {dv}, {read / 2**20:.1f} MiB read")
    ms = do_bench_cudagraph(lambda: (o.float() * do.float()).sum(-1), rep=100, return_mode="median")
    print(f"torch (o * do).sum(-1): {ms * 1000:.1f} us, {read / ms / 1e6:.0f} GB/s")
    for block_r in (8, 16, 32, 64, 128):
        for warps in (1, 2, 4, 8):
            grid = (triton.cdiv(rows, block_r),)

            def run():
                row_stats_kernel[grid](o, do, lse, lse, stats, rows, o.stride(0), do.stride(0), dv,
                                       BLOCK_R=block_r, BLOCK_DV=triton.next_power_of_2(dv), HAS_DLSE=False,
                                       num_warps=warps)

            run()  # compile outside the graph
            ms = do_bench_cudagraph(run, rep=100, return_mode="median")
            print(f"rows {block_r:4d} warps {warps}: {ms * 1000:7.1f} us, {read / ms / 1e6:5.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
