"""Whether a change left the Gluon forward's machine code as it was: its sm_90 SASS built from the
working tree and from another revision's package (bench_against_revision.py's ``--base``), on the
compile report's problems (compile_report_gluon_forward.py), instruction by instruction, without a
GPU. A refactor of the kernels' device functions that prints "identical" on every problem needs no
device time to show it changed nothing.

    git archive <rev> backends/triton | tar -x -C ab_base
    python benchmarks/sass_against_revision.py --base ab_base/backends/triton [--only 2,7]
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


def forward_sass(package: str, spec) -> list:
    """The Gluon forward launch's SASS instructions (addresses and encodings dropped) for one
    compile-report problem, built from ``package`` (``haloattn.backends.triton`` or the base)."""
    launch = importlib.import_module(package + ".gluon_forward_launch")
    regroup = importlib.import_module(package + ".gluon_regroup")
    name, spatial, window, options, heads, kv_heads, dtype = spec
    q, out = (torch.empty(1, *spatial, heads, 128, device="meta", dtype=dtype) for _ in range(2))
    k = torch.empty(1, *spatial, kv_heads, 128, device="meta", dtype=dtype)
    lse = torch.empty(1, *spatial, heads, device="meta", dtype=torch.float32)
    regrouping = regroup.regrouped(build_problem(q, k, k, window, **options))
    plan = launch.GluonForward(regrouping.problem, *(regrouping.view(t) for t in (q, k, k, out)),
                               regrouping.view_rows(lse))
    compiled = compiled_sm90(plan.kernel, plan.arguments(plan.descriptors, lse), plan.meta)
    return [re.sub(r"/\*[0-9a-f]+\*/", "", line).split(";")[0].strip()
            for line in sass_of(compiled.asm["cubin"]).splitlines() if INSTRUCTION.match(line)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True)
    parser.add_argument("--only")
    args = parser.parse_args()
    import_base(args.base)
    only = range(len(PROBLEMS)) if args.only is None else [int(i) for i in args.only.split(",")]
    for index in only:
        base = forward_sass("haloattn.backends.triton_base", PROBLEMS[index])
        this = forward_sass("haloattn.backends.triton", PROBLEMS[index])
        verdict = "identical" if base == this else f"different ({sum(a != b for a, b in zip(base, this))} differ)"
        print(f"{PROBLEMS[index][0]}: {len(base)} -> {len(this)} instructions, {verdict}", flush=True)


if __name__ == "__main__":
    main()
