"""Registers the FlexAttention backend (`flex`) with haloattn's plugin manager.

It exists for the ``score_mod`` / ``mask_mod`` Python functions the fused kernels cannot take
(backend ``triton`` compiles most of them itself: mod_codegen; the rest, an operator without a
translation say, come here). torch's FlexAttention compiles them into fused Triton kernels; this backend gives it
haloattn's pattern (lookup-table mask, exact BlockMask over 128-token grid tiles), rpb, softcap,
additional tokens, GQA and the LSE, so such problems run fused on the GPU instead of on the
reference. Below every fused haloattn kernel in priority: without mods they are faster.
"""

from __future__ import annotations

import functools
import inspect
from typing import List, Optional

import torch

from haloattn.backend import Backend
from haloattn.hookspecs import hookimpl

from .run import COMPILE_ENV, compiling

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Probed on an H100, torch 2.11 (benchmarks/probe_flex_head_dims.py, 2026-11-25): head dims 24-512
# (D_v 64-512) compile and match the reference in bfloat16, 24-256 in float32; 8 is refused by
# Flex itself ("NYI: embedding dimension ... must be at least 16").
MIN_HEAD_DIM = 16
MAX_FLOAT32_HEAD_DIM = 256


def flex_unavailable_reason() -> Optional[str]:
    """Why this torch's FlexAttention cannot carry the backend, or None."""
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except Exception as exc:
        return f"torch {torch.__version__} has no usable FlexAttention ({type(exc).__name__}: {exc})"
    # Block masks are built for the logical sequence lengths (masks.py); torch 2.5's Flex lacks them.
    if "seq_lengths" not in inspect.signature(BlockMask.from_kv_blocks).parameters:
        return (f"torch {torch.__version__}'s FlexAttention has no BlockMask.from_kv_blocks(seq_lengths=...), "
                "which the flex backend builds its block masks with: it needs a newer torch")
    return None


def head_dim_rule():
    """torch 2.6's FlexAttention takes only the head dims of a fixed list (powers of two from 2 to
    1024), which its ``_supported_head_dim`` checks; later releases dropped both. The rule (a
    predicate), or None."""
    import torch.nn.attention.flex_attention as flex_module

    return getattr(flex_module, "_supported_head_dim", None)


@functools.lru_cache(maxsize=256)
def mod_vmap_error(mod, kind: str, device: str) -> Optional[str]:
    """Why ``mod`` cannot run the way Flex calls it (vmapped over scalars), or None.

    The reference calls mods once on broadcast tensors, where Python control flow on values and
    shape arithmetic work; Flex cannot trace those. Probing once per function (indices 0, always
    in range) sends such mods to the reference instead of failing inside Flex's compile."""
    from .mods import mod_result_tensor

    index = torch.zeros(2, dtype=torch.int32, device=device)
    try:
        if kind == "score_mod":
            torch.func.vmap(lambda s, *i: mod_result_tensor(mod(s, *i), s, s.dtype))(
                torch.zeros(2, device=device), index, index, index, index)
        else:
            torch.func.vmap(lambda *i: mod_result_tensor(mod(*i), i[0], torch.bool))(index, index, index, index)
    except Exception as exc:  # any failure is the verdict; the message goes to explain()
        return " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
    return None


class FlexBackend(Backend):
    name = "flex"
    priority = 50
    description = "torch FlexAttention (compiled) with haloattn's pattern tables: runs score_mod/mask_mod fused on CUDA"

    def available(self) -> List[str]:
        error = flex_unavailable_reason()
        if error:
            return [error]
        if compiling() and not torch.cuda.is_available():
            return [
                "no CUDA device: compiled FlexAttention runs fused on CUDA GPUs (on CPUs torch's Flex has no "
                f"backward and its forward measured no faster than the reference; {COMPILE_ENV}=0 runs it unfused)"
            ]
        return []

    def not_supported_reasons(self, problem) -> List[str]:
        reasons = self.available()
        if compiling() and problem.device.type != "cuda":
            reasons.append(
                f"device {problem.device.type}: compiled FlexAttention runs fused on CUDA devices "
                f"({COMPILE_ENV}=0 runs it unfused, for debugging)"
            )
        if problem.dtype not in DTYPES:
            reasons.append(
                f"dtype {str(problem.dtype).replace('torch.', '')}: FlexAttention's kernels take float16, "
                "bfloat16 and float32 (the reference backend runs float64)"
            )
        dims = ((problem.head_dim, "head_dim"), (problem.value_dim, "value head_dim (D_v)"))
        supported = head_dim_rule() if not reasons else None
        if supported is not None:
            taken = ", ".join(str(1 << i) for i in range(11) if supported(1 << i))
            reasons += [f"{what} {value}: torch {torch.__version__}'s FlexAttention takes only {taken}"
                        for value, what in dims if not supported(value)]
        for value, what in dims:
            if not compiling():
                break  # limits of the compiled kernels; unfused Flex takes any size
            if value < MIN_HEAD_DIM:
                reasons.append(f"{what} {value} is below {MIN_HEAD_DIM}, FlexAttention's smallest")
            if problem.dtype == torch.float32 and value > MAX_FLOAT32_HEAD_DIM:
                reasons.append(
                    f"{what} {value} in float32: above {MAX_FLOAT32_HEAD_DIM} Flex's kernels did not compile "
                    "within minutes on an H100 (2026-11-25); 16-bit inputs run up to 512"
                )
        for mod, kind in ((problem.score_mod, "score_mod"), (problem.mask_mod, "mask_mod")):
            error = mod_vmap_error(mod, kind, str(problem.device)) if mod is not None and not reasons else None
            if error:
                reasons.append(f"{kind} cannot run per score as Flex calls it (vmapped over scalars): {error}")
        if problem.kq_conv_shape is not None:
            reasons.append("kq_conv mixes the scores of neighbouring pairs, which a per-score Flex mod cannot see")
        return reasons

    def forward(self, problem, inputs, config=None):
        from . import run

        return run.forward(problem, inputs)

    def backward(self, problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config=None):
        from . import run

        return run.backward(problem, inputs, grad_out, grad_lse, needs_grad)

    # Eager calls keep Flex's forward graph for the backward instead of recomputing it.
    keeps_state = True

    def forward_with_state(self, problem, inputs, needs_grad, config=None):
        from . import run

        return run.forward_with_state(problem, inputs, needs_grad)

    def backward_from_state(self, state, grad_out, grad_lse):
        from . import run

        return run.backward_from_state(state, grad_out, grad_lse)


@hookimpl
def haloattn_register_backends(registry):
    registry.add(FlexBackend())
