"""Registers ``triton_window``: Swin-style window attention (pattern "window") for windows of at
most 256 tokens, whole score tile on chip, forward and backward (see window_kernels.py)."""

from __future__ import annotations

import math
from typing import List

from haloattn.backend import Backend
from haloattn.hookspecs import hookimpl

from .device_limits import shared_memory_limit
from .plugin import device_and_dtype_reasons, triton_available


def shared_memory_reasons(problem, limit: int) -> List[str]:
    """Why the window kernels cannot launch for this problem on a GPU with ``limit`` bytes of shared
    memory per block (empty: they can)."""
    from .window_launch import shared_memory_needed

    needed = shared_memory_needed(problem)
    if needed <= limit:
        return []
    window = "x".join(map(str, problem.window))
    dim = max(problem.head_dim, problem.value_dim)
    return [
        f"window {window} ({problem.window_tokens} tokens) in {str(problem.dtype).replace('torch.', '')} with "
        f"head_dim {dim} needs {needed // 1024} KiB of shared memory per block, more than this GPU's "
        f"{limit // 1024} KiB: the neighbourhood kernel (backend 'triton') runs it"
    ]


class TritonWindowBackend(Backend):
    """Short windows (Swin W-MSA / SW-MSA, MaxViT grid attention, Video Swin). Ranks ahead of
    ``triton`` so window problems it can run never reach the general neighbourhood kernel."""

    name = "triton_window"
    priority = 110
    description = "Triton, pattern 'window' up to 256 tokens per window: whole score tile on chip"

    def available(self) -> List[str]:
        return triton_available()

    def not_supported_reasons(self, problem) -> List[str]:
        from .window_launch import INT32_LIMIT, MAX_HEAD_DIM, MAX_WINDOW_TOKENS

        reasons = []
        if problem.pattern != "window":
            reasons.append(f"pattern {problem.pattern!r} runs on backend 'triton'")
        elif problem.window_tokens > MAX_WINDOW_TOKENS:
            window = "x".join(map(str, problem.window))
            reasons.append(
                f"window {window} has {problem.window_tokens} tokens > {MAX_WINDOW_TOKENS}: "
                "the neighbourhood kernel (backend 'triton') runs it"
            )
        reasons += device_and_dtype_reasons(problem)
        if not reasons and problem.device.type == "cuda":
            reasons += shared_memory_reasons(problem, shared_memory_limit(problem.device))
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
            reasons.append("additional_keys/additional_values are not supported here: backend 'triton' runs them")
        for flag, name in (
            (problem.score_mod is not None, "score_mod"),
            (problem.mask_mod is not None, "mask_mod"),
        ):
            if flag:
                reasons.append(f"{name} is not supported here: backend 'triton' compiles it into its kernels "
                               "where its operators allow (else the flex backend runs it on CUDA, the reference "
                               "backend elsewhere)")
        if problem.kq_conv_shape is not None:
            # not flex's either: a per-score Flex mod cannot see the neighbouring scores it mixes
            reasons.append("kq_conv is not supported here: backend 'triton' runs it (its own kernels), "
                           "the reference backend where triton cannot")
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
