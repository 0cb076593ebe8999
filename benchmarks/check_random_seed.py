"""One problem of tests/test_large_random_gpu.py, its forward through one backend, repeated: for
hunting failures that come and go (run it under compute-sanitizer, or many times).

Every float output allocation is filled with NaN first, so rows a kernel never writes show up as
NaN instead of whatever the memory held. Prints, per repetition, the relative error against the
float64 reference and the rows that are not finite.

    python benchmarks/check_random_seed.py 101 --backend triton_window --reps 3
    CUDA_LAUNCH_BLOCKING=1 python benchmarks/check_random_seed.py 2117 --backend triton_window --backward
    compute-sanitizer --tool racecheck python benchmarks/check_random_seed.py 101 --batch 1
"""

import argparse
import pathlib
import random
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
import test_large_random_gpu as large  # noqa: E402

import haloattn  # noqa: E402


def poison_new_outputs():
    """Make ``Tensor.new_empty`` (how the launchers allocate outputs) return NaN-filled tensors."""
    plain = torch.Tensor.new_empty

    def poisoned(self, *args, **kwargs):
        out = plain(self, *args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    torch.Tensor.new_empty = poisoned


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seed", type=int)
    parser.add_argument("--backend", default="triton")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch", type=int, help="override the problem's batch (smaller: faster under a sanitizer)")
    parser.add_argument("--allow-tf32", action="store_true", help="let float32 problems use one TF32 product")
    parser.add_argument("--backward", action="store_true",
                        help="also the gradients of every input, against the reference's (relative error each)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = args.allow_tf32

    options = large.random_large_problem(random.Random(7919 * args.seed + 1))
    if args.batch:
        options["batch"] = args.batch
    print(options, flush=True)
    leaves, kwargs = large.make_leaves(options, args.seed)
    q, k, v = (leaves.pop(n) for n in ("query", "key", "value"))
    ref = haloattn.attention(q, k, v, backend="reference", **kwargs, **leaves)
    dtype = options["dtype"]
    inputs = {n: t.to(dtype) for n, t in leaves.items()}
    poison_new_outputs()
    for rep in range(args.reps):
        out = haloattn.attention(q.to(dtype), k.to(dtype), v.to(dtype), backend=args.backend, **kwargs, **inputs)
        torch.cuda.synchronize()
        bad_rows = (~torch.isfinite(out)).any(-1).nonzero()
        error = ((out.double() - ref).norm() / ref.norm()).item()
        print(f"{rep}: relative error {error:.2e}, rows not finite {bad_rows.shape[0]}", bad_rows[:8].tolist(), flush=True)
        if args.backward:
            print(f"{rep}: gradients' relative errors", gradient_errors(args, options, kwargs), flush=True)


def gradient_errors(args, options, kwargs):
    """Relative error of each input's gradient through ``args.backend`` against the reference's,
    for the test's random output and LSE gradients."""
    gen = torch.Generator(device="cuda").manual_seed(args.seed + 1)
    full = large.make_leaves(options, args.seed)[0]
    out_shape = (*full["query"].shape[:-1], options["value_dim"])
    grad_out = torch.randn(*out_shape, generator=gen, device="cuda", dtype=torch.float64)
    grad_lse = torch.randn(*out_shape[:-1], generator=gen, device="cuda", dtype=torch.float64)
    _, _, ref = large.run_backend("reference", full, kwargs, torch.float64, grad_out, grad_lse)
    _, _, got = large.run_backend(args.backend, full, kwargs, options["dtype"], grad_out, grad_lse)
    torch.cuda.synchronize()
    return {name: f"{((got[name].double() - g).norm() / g.norm()).item():.2e}" for name, g in ref.items()}


if __name__ == "__main__":
    main()
