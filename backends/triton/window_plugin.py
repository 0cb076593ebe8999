"""Registers ``triton_window``: Swin-style window attention (pattern "window") for windows of at
most 256 tokens, whole score tile on chip, forward and backward (see window_kernels.py)."""

from __future__ import annotations

import math
from typing import List

import torch

from haloattn.backend import Backend, cuda_capability
from haloattn.hookspecs import hookimpl

from .plugin import _triton_import_error, interpreting

INT32_LIMIT = 2**31 - 1


class TritonWindowBackend(Backend):
    """Short windows (Swin W-MSA / SW-MSA, MaxViT grid attention, Video Swin). Ranks ahead of
    ``triton`` so window problems it can run never reach the general neighbourhood kernel."""

    name = "triton_window"
    priority = 110
    description = "Triton, pattern 'window' up to 256 tokens per window: whole score tile on chip"

    def available(self) -> List[str]:
        # The same verdicts, worded the same, as backend 'triton'.
        error = _triton_import_error()
        if error:
            return [f"Triton cannot be imported ({error})"]
        if not torch.cuda.is_available() and not interpreting():
            return [
                "no CUDA device: Triton runs on CUDA devices (set TRITON_INTERPRET=1 to run its kernels "
                "in the interpreter, for tests)"
            ]
        return []

    def not_supported_reasons(self, problem) -> List[str]:
        from .window_launch import MAX_HEAD_DIM, MAX_WINDOW_TOKENS

        reasons = []
        if problem.pattern != "window":
            reasons.append(f"pattern {problem.pattern!r} runs on backend 'triton'")
        elif problem.window_tokens > MAX_WINDOW_TOKENS:
            window = "x".join(map(str, problem.window))
            reasons.append(
                f"window {window} has {problem.window_tokens} tokens > {MAX_WINDOW_TOKENS}: "
                "the neighbourhood kernel (backend 'triton') runs it"
            )
        device = problem.device
        if device.type == "cpu":
            if not interpreting():
                reasons.append(
                    "device cpu: Triton runs on CUDA devices (set TRITON_INTERPRET=1 to run its kernels "
                    "in the interpreter, for tests)"
                )
        elif device.type != "cuda":
            reasons.append(f"device {device.type}: Triton runs on CUDA devices")
        else:
            capability = cuda_capability(device)
            if capability is not None and capability < (8, 0):
                reasons.append(
                    f"CUDA capability {capability[0]}.{capability[1]} is below 8.0 (Ampere), which these kernels need"
                )
        if problem.dtype == torch.float64:
            reasons.append("float64 runs on the reference backend")
        # Offsets inside one batch element are int32; allow q/k/v to be views of a projection up
        # to 4x wider than themselves (Swin's packed qkv is 3x). window_launch checks the real span.
        per_element = math.prod(problem.spatial) * problem.heads * max(problem.head_dim, problem.value_dim)
        if 4 * per_element > INT32_LIMIT:
            reasons.append(
                f"one batch element holds {per_element} elements per tensor: more than int32 offsets "
                f"cover for projection views (limit {INT32_LIMIT // 4}); backend 'triton' runs it"
            )
        for name, dim in (("head_dim", problem.head_dim), ("value head_dim", problem.value_dim)):
            if dim > MAX_HEAD_DIM:
                reasons.append(f"{name} {dim} > {MAX_HEAD_DIM}")
        if problem.extra_tokens:
            reasons.append("additional_keys/additional_values are not supported (the reference backend runs them)")
        for flag, name in (
            (problem.score_mod is not None, "score_mod"),
            (problem.mask_mod is not None, "mask_mod"),
            (problem.kq_conv_shape is not None, "kq_conv"),
        ):
            if flag:
                reasons.append(f"{name} is not supported (the reference backend runs it)")
        return reasons

    def forward(self, problem, inputs, config=None):
        from . import window_launch

        return window_launch.forward(problem, inputs, config)

    def backward(self, problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config=None):
        from . import window_launch

        return window_launch.backward(problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config)


@hookimpl
def haloattn_register_backends(registry):
    registry.add(TritonWindowBackend())
