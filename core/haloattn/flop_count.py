"""FLOP counts of haloattn's custom ops for ``torch.utils.flop_counter.FlopCounterMode`` and the
tools built on it (Lightning's ``measure_flops``, MFU meters that trace a model on the meta device).

A call counts the matrix products of the pairs it attends, as torch counts dense SDPA: per
(batch, head) and attended (query, key) pair, 2·D for Q K^T and 2·D_v for P V; the backward
recomputes Q K^T and forms dV, dP, dQ and dK, 2·(3·D + 2·D_v), 2.5x the forward where D = D_v
(the convention of FlashAttention and of the benchmarks here). A ``kq_conv`` adds its
convolution's 2·c_q·c_k a score and each pass over it; a ``mask_mod`` is not evaluated, so its
pairs count as attended (an upper bound, like a masked dense SDPA). The work a backend does
beyond that (tile rounding, masked pairs) is its efficiency, not the model's FLOPs.

torch.utils.flop_counter imports Triton (55 ms), so the formulas are registered on the first call
a dispatch mode watches, not on ``import haloattn``; a counter made before then copied torch's
table without them and gets them added then (``count_with_active_counters``).
"""

from __future__ import annotations

import torch

from .geometry import attended_pairs
from .ops import problem_of_spec

_registered = False


def pairs(problem) -> int:
    """Attended (query, key) pairs of the whole call: the pattern's, over every batch and head,
    plus each query's additional tokens."""
    per_head = attended_pairs(problem.axes, problem.pattern) + problem.tokens * problem.extra_tokens
    return problem.batch * problem.heads * per_head


def _convolution_flops(problem) -> int:
    """Matrix-product FLOPs a pair's score costs for one pass of the kq_conv (0 without one)."""
    if problem.kq_conv_shape is None:
        return 0
    c_q, c_k = problem.kq_conv_shape
    return 2 * c_q * c_k


def forward_flops(problem) -> int:
    return pairs(problem) * (2 * problem.head_dim + 2 * problem.value_dim + _convolution_flops(problem))


def backward_flops(problem) -> int:
    # Q K^T again, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q; the convolution forward again
    # and its input gradient.
    return pairs(problem) * (6 * problem.head_dim + 4 * problem.value_dim + 2 * _convolution_flops(problem))


def _attention_formula(query, key, value, rpb, kq_conv, additional_keys, additional_values, spec, *,
                       out_val=None, **_):
    return forward_flops(problem_of_spec(spec, query, key, value, rpb, kq_conv, additional_keys, additional_values))


def _backward_formula(grad_out, grad_lse, query, key, value, rpb, kq_conv, additional_keys, additional_values,
                      out, lse, spec, needs, *, out_val=None, **_):
    return backward_flops(problem_of_spec(spec, query, key, value, rpb, kq_conv, additional_keys, additional_values))


def _formulas() -> dict:
    return {torch.ops.haloattn.attention: _attention_formula,
            torch.ops.haloattn.attention_backward: _backward_formula}


def count_with_active_counters() -> None:
    """Register the formulas in torch's table (once) and add them to every FlopCounterMode active
    now, which copied that table when it was made."""
    global _registered
    from torch.utils import flop_counter
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    formulas = _formulas()
    if not _registered:
        for op, formula in formulas.items():
            if op not in flop_counter.flop_registry:
                flop_counter.register_flop_formula(op, get_raw=True)(formula)
        _registered = True
    for mode in _get_current_dispatch_mode_stack():
        counter = getattr(mode, "counter", None)
        if isinstance(counter, flop_counter.FlopCounterMode):
            for op, formula in formulas.items():
                counter.flop_registry.setdefault(op, formula)
