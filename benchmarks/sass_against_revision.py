"""Whether a change left a Gluon kernel's machine code as it was: the forward's (or with ``--kernel
dq`` the dQ pass's, at 128 and 64 channels) sm_90 SASS built from the working tree and from another
revision's package (bench_against_revision.py's ``--base``), on the compile report's problems
(compile_report_gluon_forward.py), instruction by instruction, without a GPU. A refactor of the
kernels' device functions that prints "identical" on every problem needs no device time to show it
changed nothing, and a kernel identical to one the GPU tests and timings ran is that kernel.

    git archive <rev> backends/triton | tar -x -C ab_base
    python benchmarks/sass_against_revision.py --base ab_base/backends/triton [--kernel dq] [--only 2,7]
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_against_revision import import_base  # noqa: E402
from compile_report_gluon_forward import PROBLEMS  # noqa: E402
from gluon_compile import compiled_sm90  # noqa: E402
from sm90_compile import sass_of  # noqa: E402

import torch  # noqa: E402

from haloattn.problem import build_problem  # noqa: E402

INSTRUCTION = re.compile(r"\s+/\*[0-9a-f]{4,}\*/")
REGISTER = re.compile(r"\b(U?R|U?P)(\d+)\b")


def renamed(instructions: list) -> list:
    """The instructions with each register renamed by its order of first appearance: two builds
    that differ in register assignment alone read the same."""
    names = {}

    def rename(match):
        return names.setdefault(match.group(0), f"{match.group(1)}#{len(names)}")

    return [REGISTER.sub(rename, line) for line in instructions]


def verdict(base: list, this: list) -> str:
    if base == this:
        return "identical"
    if renamed(base) == renamed(this):
        return "identical but for register names"
    return f"different ({sum(a != b for a, b in zip(base, this))} differ)"


def launch_sass(package: str, kernel: str, spec, head_dim: int) -> list:
    """The SASS instructions (addresses and encodings dropped) of ``kernel``'s launch ("forward"
    or "dq") for one compile-report problem, built from ``package`` (``haloattn.backends.triton``
    or the base)."""
    name, spatial, window, options, heads, kv_heads, dtype = spec
    q, out, do, dq = (torch.empty(1, *spatial, heads, head_dim, device="meta", dtype=dtype) for _ in range(4))
    k = torch.empty(1, *spatial, kv_heads, head_dim, device="meta", dtype=dtype)
    lse = torch.empty(1, *spatial, heads, device="meta", dtype=torch.float32)
    problem = build_problem(q, k, k, window, **options)
    if kernel == "forward":
        regrouping = importlib.import_module(package + ".gluon_regroup").regrouped(problem)
        plan = importlib.import_module(package + ".gluon_forward_launch").GluonForward(
            regrouping.problem, *(regrouping.view(t) for t in (q, k, k, out)), regrouping.view_rows(lse))
        args = plan.arguments(plan.descriptors, lse)
    else:
        stats = torch.empty(1, *spatial, heads, 4, device="meta", dtype=torch.float32)
        plan = importlib.import_module(package + ".gluon_dq_launch").GluonDQ(problem, q, k, k, do, out, lse, None,
                                                                            stats, dq)
        args = plan.arguments(plan.descriptors, out, lse, None, stats)
    compiled = compiled_sm90(plan.kernel, args, plan.meta)
    return [re.sub(r"/\*[0-9a-f]+\*/", "", line).split(";")[0].strip()
            for line in sass_of(compiled.asm["cubin"]).splitlines() if INSTRUCTION.match(line)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True)
    parser.add_argument("--kernel", choices=("forward", "dq"), default="forward")
    parser.add_argument("--only")
    args = parser.parse_args()
    import_base(args.base)
    only = range(len(PROBLEMS)) if args.only is None else [int(i) for i in args.only.split(",")]
    for head_dim in (128, ) if args.kernel == "forward" else (128, 64):
        for index in only:
            base, this = (launch_sass(package, args.kernel, PROBLEMS[index], head_dim)
                          for package in ("haloattn.backends.triton_base", "haloattn.backends.triton"))
            print(f"{PROBLEMS[index][0]}, D={head_dim}: {len(base)} -> {len(this)} instructions, "
                  f"{verdict(base, this)}", flush=True)


if __name__ == "__main__":
    main()
