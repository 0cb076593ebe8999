"""Registers the Triton neighbourhood backend (`triton`) with haloattn's plugin manager.

Fused forward, deterministic backward and forward-mode AD (jvp_kernel) for patterns
"neighborhood" and "window" on ranks 1-3, every per-axis window / stride / dilation / causal /
shift, GQA/MQA, D_v != D, head dims up to 256, float16 / bfloat16 / float32 (tf32 when
``torch.backends.cuda.matmul.allow_tf32``), scale, softcap, rpb, additional tokens and the LSE;
score_mod and mask_mod compiled into the kernels (mod_codegen) where their operators allow.
Rank-1 problems with a key-query convolution (kq_conv) run fused kernels of their own, forward
and deterministic backward (kq_conv_kernel, kq_conv_backward, kq_conv_launch).
On CPU tensors it runs only under ``TRITON_INTERPRET=1`` (Triton's interpreter, for tests), so
ordinary CPU users keep the reference.
"""

from __future__ import annotations

import os
from typing import List

import torch
from torch.torch_version import TorchVersion  # PEP 440 comparisons, for any package's version

from haloattn.backend import Backend, cuda_capability
from haloattn.hookspecs import hookimpl

MAX_HEAD_DIM = 256
INTERPRET_ENV = "TRITON_INTERPRET"


def interpreting() -> bool:
    return os.environ.get(INTERPRET_ENV, "") not in ("", "0")


# The oldest Triton these kernels are built and tested with (every GPU figure and test in
# benchmarks/RESULTS.md). Older releases are untested; 3.1 (torch 2.5's) lacks
# tl.make_tensor_descriptor, which the kernels call (they would fail inside its compiler).
MIN_TRITON = (3, 6)


def _triton_import_error():
    try:
        import triton
    except Exception as exc:  # ImportError, or a broken install raising something else
        return f"{type(exc).__name__}: {exc}"
    if TorchVersion(triton.__version__) < MIN_TRITON:
        wanted = ".".join(map(str, MIN_TRITON))
        return (f"Triton {triton.__version__} is older than {wanted}, the oldest these kernels are tested with; "
                f"pip install 'triton>={wanted}' (with a torch that allows it)")
    return None


def triton_available() -> List[str]:
    """Why no Triton kernel can run in this process (empty: they can). Shared by every Triton
    backend, so their verdicts read the same."""
    error = _triton_import_error()
    if error:
        return [f"Triton cannot be imported ({error})"]
    if not torch.cuda.is_available() and not interpreting():
        return [
            "no CUDA device: Triton runs on CUDA devices (set TRITON_INTERPRET=1 to run its kernels "
            "in the interpreter, for tests)"
        ]
    return []


def device_and_dtype_reasons(problem) -> List[str]:
    """Why a problem's device or dtype rules out every Triton backend (empty: neither does)."""
    reasons = []
    device = problem.device
    if device.type == "cpu":
        if not interpreting():
            reasons.append(
                "device cpu: Triton runs on CUDA devices (set TRITON_INTERPRET=1 to run its kernels "
                "in the interpreter, for tests)"
            )
    elif device.type != "cuda":
        reasons.append(f"device {device.type}: Triton runs on CUDA devices")
    elif torch.version.hip is not None:
        # A ROCm build of torch names AMD GPUs "cuda" and reports their gfx version as the
        # capability (gfx942: 9.4), which would pass for a Hopper and select the TMA copies.
        reasons.append(
            f"device {device} is an AMD GPU (torch built for ROCm {torch.version.hip}): these kernels "
            "are written, tuned and tested for NVIDIA GPUs (compute capability 8.0 and above)"
        )
    else:
        capability = cuda_capability(device)
        if capability is not None and capability < (8, 0):
            reasons.append(
                f"CUDA capability {capability[0]}.{capability[1]} is below 8.0 (Ampere), which these kernels need"
            )
    if problem.dtype == torch.float64:
        reasons.append("float64 runs on the reference backend")
    return reasons


class TritonBackend(Backend):
    name = "triton"
    priority = 100
    description = "fused Triton kernels for neighbourhood and window attention, forward and deterministic backward"

    def available(self) -> List[str]:
        return triton_available()

    def not_supported_reasons(self, problem) -> List[str]:
        reasons = device_and_dtype_reasons(problem)
        for value, what in ((problem.head_dim, "head_dim"), (problem.value_dim, "value head_dim (D_v)")):
            if value > MAX_HEAD_DIM:
                reasons.append(f"{what} {value} exceeds {MAX_HEAD_DIM}")
        has_mods = problem.score_mod is not None or problem.mask_mod is not None
        if has_mods and problem.kq_conv_shape is not None:
            reasons.append("score_mod / mask_mod with kq_conv: the fused key-query convolution takes no mods "
                           "(the reference backend runs them)")
        if problem.kq_conv_shape is not None and not reasons:
            from . import kq_conv_launch

            reasons.extend(kq_conv_launch.not_supported_reasons(problem))
        if has_mods and not reasons:
            # Last: it traces the mods (once per problem), which is only worth it for a problem
            # the kernels otherwise run.
            from . import mod_codegen

            reasons.extend(mod_codegen.not_fusable_reasons(problem))
        return reasons

    def configs(self, problem):
        if problem.kq_conv_shape is not None:
            from . import kq_conv_launch

            return kq_conv_launch.candidate_configs(problem)
        from . import tiles

        return tiles.candidate_configs(problem)

    def forward(self, problem, inputs, config=None):
        if problem.kq_conv_shape is not None:
            from . import kq_conv_launch

            return kq_conv_launch.forward(problem, inputs, config)
        from . import launch

        return launch.forward(problem, inputs, config)

    def backward(self, problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config=None):
        if problem.kq_conv_shape is not None:
            from . import kq_conv_launch

            return kq_conv_launch.backward(problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config)
        from . import launch

        return launch.backward(problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config)

    def jvp_not_supported_reasons(self, problem) -> List[str]:
        if problem.kq_conv_shape is not None:
            return ["kq_conv: no forward-mode rule in the fused kernel (the reference backend has one)"]
        return []  # every problem the forward runs (jvp_kernel has the forward's features, mods included)

    def jvp(self, problem, inputs, tangents, out, lse, config=None):
        from . import jvp_launch

        return jvp_launch.jvp(problem, inputs, tangents, out, lse, config)


@hookimpl
def haloattn_register_backends(registry):
    registry.add(TritonBackend())
