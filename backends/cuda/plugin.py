"""Registers the compiled CUDA backend (`cuda`) with haloattn's plugin manager.

Fused forward and deterministic backward kernels from ``haloattn_cuda._C`` (csrc/), for Hopper
(compute capability 9.0, built as sm_90a): patterns "neighborhood" and "window", ranks 1-3, every
per-axis window / stride / dilation / causal / shift, GQA/MQA, float16 / bfloat16, head_dim 64 and
128 (D_v == D), the LSE. The backend is always registered so that ``haloattn info`` and
``haloattn.explain`` say why it cannot run (module not built, no device, other capability).
"""

from __future__ import annotations

from typing import List

import torch

from haloattn.backend import Backend, cuda_capability
from haloattn.hookspecs import hookimpl

from .module import built_archs, capability_of, load

HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)


class CudaBackend(Backend):
    name = "cuda"
    # Below triton (100): its Hopper kernels (wgmma, TMA) measured 0.77-1.21x triton's forward and
    # 0.78-1.31x its forward+backward on the ten benchmark problems (H100, 2026-11-27 16:03 UTC,
    # benchmarks/RESULTS.md): ahead on 1-D and the aligned strided problems only. The tuning cache
    # (`haloattn tune`) picks cuda where it wins.
    priority = 90
    description = "compiled CUDA/CuTe kernels for Hopper (sm_90a), forward and deterministic backward"

    def available(self) -> List[str]:
        return list(load()[1])

    def not_supported_reasons(self, problem) -> List[str]:
        reasons = []
        device = problem.device
        if device.type != "cuda":
            reasons.append(f"device {device.type}: the cuda backend runs on CUDA devices")
        else:
            capability = cuda_capability(device)
            targets = {capability_of(a): a for a in built_archs()}
            if capability not in targets:
                built = ", ".join(f"sm_{a}" for a in targets.values()) or "nothing"
                reasons.append(
                    f"device {device} has compute capability {capability[0]}.{capability[1]}; "
                    f"haloattn_cuda._C was built for {built} (set HALOATTN_CUDA_ARCHS at install time)"
                )
        if problem.dtype not in DTYPES:
            reasons.append(f"dtype {str(problem.dtype).replace('torch.', '')} is not float16 or bfloat16")
        if problem.head_dim not in HEAD_DIMS:
            reasons.append(f"head_dim {problem.head_dim} not in {HEAD_DIMS}")
        if problem.value_dim != problem.head_dim:
            reasons.append(f"value head_dim (D_v) {problem.value_dim} differs from head_dim {problem.head_dim}")
        for present, what in (
            (problem.has_rpb, "rpb (relative position bias)"),
            (problem.softcap is not None, "softcap"),
            (problem.kq_conv_shape is not None, "kq_conv (key-query convolution)"),
            (problem.extra_tokens > 0, "additional_keys/additional_values"),
            (problem.score_mod is not None, "score_mod"),
            (problem.mask_mod is not None, "mask_mod"),
        ):
            if present:
                reasons.append(f"{what} is not implemented in the cuda backend yet")
        return reasons

    def forward(self, problem, inputs, config=None):
        from . import launch

        return launch.forward(problem, inputs)

    def backward(self, problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config=None):
        from . import launch

        return launch.backward(problem, inputs, out, lse, grad_out, grad_lse, needs_grad)


@hookimpl
def haloattn_register_backends(registry):
    registry.add(CudaBackend())
