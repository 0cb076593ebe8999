"""Registers ``triton_window``: Swin-style window attention (pattern "window") for windows of at
most 256 tokens, whole score tile on chip, forward and backward (see window_kernels.py)."""

from __future__ import annotations

import os
from typing import List

import torch

from haloattn.backend import Backend
from haloattn.hookspecs import hookimpl

INTERPRET_ENV = "TRITON_INTERPRET"


def _triton_import_error():
    try:
        import triton  # noqa: F401
    except Exception as exc:  # any import failure means the backend cannot run here
        return f"triton is not importable ({type(exc).__name__}: {exc})"
    return None


class TritonWindowBackend(Backend):
    """Short windows (Swin W-MSA / SW-MSA, MaxViT grid attention, Video Swin). Ranks ahead of
    ``triton`` so window problems it can run never reach the general neighbourhood kernel."""

    name = "triton_window"
    priority = 110
    description = "Triton, pattern 'window' up to 256 tokens per window: whole score tile on chip"

    def available(self) -> List[str]:
        error = _triton_import_error()
        return [error] if error else []

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
            if os.environ.get(INTERPRET_ENV) != "1":
                reasons.append(
                    "device cpu: Triton runs on CUDA devices (set TRITON_INTERPRET=1 to run its "
                    "interpreter on CPU tensors, slowly)"
                )
        elif device.type != "cuda":
            reasons.append(f"device {device.type}: Triton runs on CUDA devices")
        if problem.dtype == torch.float64:
            reasons.append("float64 runs on the reference backend")
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
