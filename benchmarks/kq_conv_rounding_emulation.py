"""How far the key-query convolution's TF32 products put its gradients from the float64 oracle, in a
float64 emulation on the CPU (no GPU needed): the scores S0 and the kernel weights W rounded to TF32
before the convolution (as the tensor cores take float32 operands), by truncation (what they do
with a raw float32 register) or to nearest (kq_conv_launch.tf32_nearest), and, apart, the share
of delta = rowsum(dO O) taken from the output rounded to the input dtype (every fused backward's
form). The problem is one of tests/test_triton_kq_conv_gpu.py::test_random_problems.

    python benchmarks/kq_conv_rounding_emulation.py [--seed 2] [--dtype float16]

The emulation runs tests/oracle.py with its convolution's two operands passed through a rounding
hook (the oracle's source, two lines patched in memory; the file is not changed).
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import torch

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
sys.path.insert(0, TESTS)
import oracle  # noqa: E402
from kq_conv_check import LEAVES, kq_conv_inputs  # noqa: E402
from test_triton_kq_conv_gpu import random_kq_problem  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
SEED_OFFSET = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}  # as test_random_problems draws


def _tf32_bits(x: torch.Tensor, nearest: bool) -> torch.Tensor:
    bits = x.detach().float().view(torch.int32)
    if nearest:
        bits = bits + 0x1000
    return (bits & ~0x1FFF).view(torch.float32).double()


def _straight_through(round_fn):
    """x with its value rounded and its gradient passed through (d round(x)/dx taken as 1)."""
    return lambda x: x + (round_fn(x) - x.detach())


def _oracle_with_rounded_convolution():
    """tests/oracle.py's namespace with ROUND applied to W and S0 before the convolution."""
    path = os.path.join(TESTS, "oracle.py")
    source = open(path).read()
    patches = {"W = kq_conv.to(compute_dtype)": "W = ROUND(kq_conv.to(compute_dtype))",
               "S0 = torch.where(keep4, raw, torch.zeros((), dtype=raw.dtype))":
               "S0 = ROUND(torch.where(keep4, raw, torch.zeros((), dtype=raw.dtype)))"}
    for old, new in patches.items():
        if source.count(old) != 1:
            raise RuntimeError(f"tests/oracle.py changed: {old!r} not found once; update this script")
        source = source.replace(old, new)
    namespace = {"__name__": "oracle_rounded", "__file__": path}
    exec(compile(source, path, "exec"), namespace)
    return namespace


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    args = parser.parse_args(argv)
    dtype = DTYPES[args.dtype]
    options = random_kq_problem(random.Random(args.seed * 3 + SEED_OFFSET[dtype]))
    length, window = options.pop("length"), options.pop("window")
    frozen = options.pop("frozen", ())
    shape_keys = ("batch", "heads", "kv_heads", "head_dim", "value_dim", "kernel", "rpb", "extra")
    shapes = {key: options.pop(key) for key in shape_keys if key in options}
    print(f"problem: length {length}, window {window}, {options}, {shapes}, {args.dtype}")

    leaves, gen = kq_conv_inputs(length, window, dtype=dtype, seed=args.seed, **shapes)
    for name in frozen:
        leaves[name].requires_grad_(False)
    q = leaves["query"]
    grad_out = torch.randn(*q.shape[:-1], leaves["value"].shape[-1], generator=gen).to(dtype).double()
    grad_lse = torch.randn(q.shape[:-1], generator=gen).double()

    def run(attention):
        ref = {n: t.detach().double().requires_grad_(t.requires_grad) for n, t in leaves.items()}
        out, lse = attention(ref["query"], ref["key"], ref["value"], window,
                             **{n: ref[n] for n in LEAVES[3:] if n in ref}, **options)
        loss = (out * grad_out).sum() + (lse * grad_lse).sum()
        (dw,) = torch.autograd.grad(loss, [ref["kq_conv"]], retain_graph=True)
        return out.detach(), lse, dw, ref["kq_conv"]

    out, lse, exact_dw, weight = run(oracle.attention)
    rounded = _oracle_with_rounded_convolution()
    tolerance = oracle.TOLERANCE[dtype]
    print(f"kq_conv gradient, relative error (tolerance {tolerance:g}):")
    for label, nearest in (("TF32 truncated", False), ("TF32 to nearest", True)):
        rounded["ROUND"] = _straight_through(lambda x, nearest=nearest: _tf32_bits(x, nearest))
        emulated_out, _, dw, _ = run(rounded["attention"])
        print(f"  S0 and W {label}: {oracle.rel_error(dw, exact_dw):.2e} "
              f"(output {oracle.rel_error(emulated_out, out):.2e})")
    # delta from the output rounded to the input dtype: dC gains -e_i P_ij, e_i = sum_d dO (O' - O),
    # which is -e_i times the LSE's gradient through the convolution
    e = (grad_out * (out.to(dtype).double() - out)).sum(-1)
    (delta_dw,) = torch.autograd.grad((e * lse).sum(), [weight])
    print(f"  delta from the {args.dtype} output alone: {oracle.rel_error(delta_dw + exact_dw, exact_dw):.2e}")


if __name__ == "__main__":
    main()
