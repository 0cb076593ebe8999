"""Build the triton backend's Gluon dQ pass (gluon_dq_kernel.py) for sm_90 on any machine, on the
Gluon forward's report problems (compile_report_gluon_forward.py) at 128 and 64 channels, and
report what ptxas made of each (registers, spills, shared memory, instruction mix).
tests/test_gluon_probes.py runs it in CI.

    python benchmarks/compile_report_gluon_dq.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_report_gluon_forward import PROBLEMS  # noqa: E402
from gluon_compile import build_sm90, report  # noqa: E402

from haloattn.backends.triton import tiles  # noqa: E402
from haloattn.backends.triton.gluon_dq_kernel import gluon_dq_kernel  # noqa: E402
from haloattn.backends.triton.gluon_dq_launch import GluonDQ  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

HEAD_DIMS = (128, 64)


def build(spec, head_dim: int, with_dlse: bool):
    """(label, build_sm90's row) of the Gluon dQ launch for one problem (meta tensors)."""
    name, spatial, window, options, heads, kv_heads, dtype = spec
    q, do, out, dq = (torch.empty(1, *spatial, heads, head_dim, device="meta", dtype=dtype) for _ in range(4))
    k = torch.empty(1, *spatial, kv_heads, head_dim, device="meta", dtype=dtype)
    lse, dlse = (torch.empty(1, *spatial, heads, device="meta", dtype=torch.float32) for _ in range(2))
    stats = torch.empty(1, *spatial, heads, 4, device="meta", dtype=torch.float32)
    problem = build_problem(q, k, k, window, **options)
    plan = GluonDQ(problem, q, k, k, do, out, lse, dlse if with_dlse else None, stats, dq)
    tiling = tiles.gluon_dq_boxes(problem)
    label = (f"{name}, D={head_dim}{', dLSE' if with_dlse else ''} | boxes {list(tiling.q)} x {list(tiling.kv)}, "
             f"cut on axis {tiling.split}")
    return label, build_sm90(gluon_dq_kernel, plan.arguments(plan.descriptors, out, lse, dlse, stats), plan.meta)


def main():
    for head_dim in HEAD_DIMS:
        for index, spec in enumerate(PROBLEMS):
            report(*build(spec, head_dim, with_dlse=index == 1))


if __name__ == "__main__":
    main()
