"""A few forced-Hopper calls of the cuda backend against the reference, run under a short timeout
before the GPU tests and timings of the one-call scripts (gpu_run_cuda.sh, gpu_ab_interleaved.sh):
a kernel that hangs (a barrier never completing) then costs a minute, not every test's timeout.

    python benchmarks/cuda_smoke.py      # exit status 1 on an error above the bounds below
"""

import os
import sys

import torch

import haloattn

os.environ["HALOATTN_CUDA_FORWARD"] = "hopper"
os.environ["HALOATTN_CUDA_BACKWARD"] = "hopper"

# Small grids of every rank at both head dims the Hopper kernels build for (each ring depth).
SMALL = [((70,), 9, {}), ((12, 13), (5, 3), dict(dilation=(2, 1))), ((5, 6, 7), 3, dict(causal=(True, False, False))),
         ((64, 64), 31, {})]
# Benchmark-sized calls too (many pairs per CTA, long walks): a race between a ring's threads may
# show only there.
LARGE = [((128, 128), 31), ((16, 48, 48), (7, 15, 15))]


def main() -> int:
    worst = 0.0
    for head_dim in (128, 64):
        for spatial, window, opts in SMALL:
            q, k, v = (torch.randn(1, *spatial, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            go = torch.randn_like(q)
            out = haloattn.attention(q, k, v, window, backend="cuda", **opts)
            grads = torch.autograd.grad(out, (q, k, v), go)
            ref_in = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
            ref = haloattn.attention(*ref_in, window, backend="reference", **opts)
            ref_grads = torch.autograd.grad(ref, ref_in, go.double())
            torch.cuda.synchronize()
            out_err = ((out.double() - ref).norm() / ref.norm()).item()
            rel = [((g.double() - r).norm() / r.norm()).item() for g, r in zip(grads, ref_grads)]
            worst = max([worst, out_err, *rel])
            print(spatial, window, opts, f"D={head_dim}", "out rel error", out_err, "grad rel errors", rel)
    for spatial, window in LARGE:
        q, k, v = (torch.randn(1, *spatial, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        for _ in range(3):
            haloattn.attention(q, k, v, window, backend="cuda").sum().backward()
        torch.cuda.synchronize()
        print(spatial, window, "three forward and backward calls finished")
    # bf16 inputs and outputs: relative errors of a few 1e-3 are rounding; 2e-2 is a wrong answer.
    if worst > 2e-2:
        print(f"smoke: worst relative error {worst:.3g} exceeds 2e-2")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
