#!/usr/bin/env bash
# One device call: the forward kernels that read their query tile through a host-descriptor box
# (launch.HOST_QUERY_BOXES["query"]), built by the GPU's own Triton at D=64 (wrong on the H100,
# 2026-12-06) and D=128 (right), with their outputs against pointers; Triton's cache (TTGIR,
# PTX, cubin) comes back as $OUT/query_box_kernels.tgz for reading off the machine.
#   bash benchmarks/gpu_dump_query_box_kernels.sh
source "$(dirname "$0")/gpu_preamble.sh"
export TRITON_CACHE_DIR=/tmp/query_box_cache
rm -rf $TRITON_CACHE_DIR
python3 - <<'PY' 2>&1 | grep -v Warning
import torch
from haloattn.backend import AttentionInputs
from haloattn.backends.triton import fast_launch, launch, tiles
from haloattn.problem import build_problem
for head_dim in (64, 128):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 64, 64, 4, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    problem = build_problem(q, k, v, 31)
    outs = {}
    for box in (False, True):
        launch.HOST_QUERY_BOXES.update(query=box, output=False)
        fast_launch.clear_plans()
        outs[box] = launch.forward(problem, AttentionInputs(q, k, v), tiles.default_config(problem))[0]
    print(f"D={head_dim}: query box against pointers {(outs[True].float() - outs[False].float()).abs().max().item():.3g}")
PY
(cd $TRITON_CACHE_DIR && tar czf $OUT/query_box_kernels.tgz .)
ls -la $OUT; cat $OUT/device.txt
