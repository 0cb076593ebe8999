"""Build the triton backend's Gluon dK/dV pass (gluon_dkdv_kernel.py) for sm_90 on any machine, on
the Gluon forward's report problems (compile_report_gluon_forward.py) at 128 and 64 channels, with
the tiles the default config gives the dK/dV pass, and report what ptxas made of each (registers,
spills, shared memory, instruction mix). tests/test_gluon_probes.py runs it in CI.

    python benchmarks/compile_report_gluon_dkdv.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_report_gluon_forward import PROBLEMS  # noqa: E402
from gluon_compile import build_sm90, report  # noqa: E402

from haloattn.backends.triton import tiles  # noqa: E402
from haloattn.backends.triton.gluon_dkdv_kernel import gluon_dkdv_kernel  # noqa: E402
from haloattn.backends.triton.gluon_dkdv_launch import GluonKeyMajor  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

HEAD_DIMS = (128, 64)


def build(spec, head_dim: int):
    """(label, build_sm90's row) of the Gluon dK/dV launch for one problem (meta tensors), or None
    where the default's dK/dV tiles are not the Gluon kernel's."""
    name, spatial, window, options, heads, kv_heads, dtype = spec
    q, do = (torch.empty(1, *spatial, heads, head_dim, device="meta", dtype=dtype) for _ in range(2))
    k, v, dk, dv = (torch.empty(1, *spatial, kv_heads, head_dim, device="meta", dtype=dtype) for _ in range(4))
    stats = torch.empty(1, *spatial, heads, 4, device="meta", dtype=torch.float32)
    problem = build_problem(q, k, v, window, **options)
    cfg = tiles.default_config(problem)["dkdv"]
    if not tiles.gluon_dkdv_tiles(problem, cfg):
        return None
    plan = GluonKeyMajor(problem, cfg, q, k, v, do, stats, dk, dv)
    label = f"{name}, D={head_dim} | boxes {cfg['q']} x {cfg['kv']}"
    return label, build_sm90(gluon_dkdv_kernel, (*plan.descriptors, *plan.scalars), plan.meta)


def main():
    for head_dim in HEAD_DIMS:
        for spec in PROBLEMS:
            built = build(spec, head_dim)
            if built is not None:
                report(*built)


if __name__ == "__main__":
    main()
