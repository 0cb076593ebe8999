"""Forward and backward of the flex backend: gather into the token order, one FlexAttention call,
scatter back.

Per problem a plan (token order, lookup tables, BlockMask) is built once and kept; a call then
costs two gathers, Flex's kernels and one scatter. Gradients come from autograd through that
forward: Flex's own backward kernel runs on Flex's own saved tensors, and the gathers/scatters and
the bias lookup get theirs (rpb included). Eager calls record the forward and keep it for the
backward (``forward_with_state``); torch.compile's custom ops recompute it (``backward``).
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Optional

import torch

from haloattn.backend import AttentionInputs, recording_autograd
from haloattn.problem import Problem

from . import masks, mods
from .token_order import TokenOrder

COMPILE_ENV = "HALOATTN_FLEX_COMPILE"
PLAN_CACHE_SIZE = 64
# Every problem shape is its own compiled Flex graph; torch's default limit (8 per function) would
# make the ninth problem silently run Flex's unfused N x N fallback. Raise it, and fail loudly
# beyond it rather than fall back.
# Each setting by its current name, then by the name torch 2.5 and 2.6 know (2.5 has no switch to fail).
RECOMPILE_LIMITS = {
    ("recompile_limit", "cache_size_limit"): 1024,
    ("accumulated_recompile_limit", "accumulated_cache_size_limit"): 4096,
    ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"): True,
}

# Flex's default tiles can exceed a GPU's shared memory once a mod loads several lookup tables per
# score (a 3-D rpb: six table loads per pair, pipelined in every stage); Inductor then reports
# "out of resource". These smaller configurations are tried in turn, and the one that compiles is
# kept for the problem. A config of the same fused kernel, never an unfused fallback.
SMALLER_TILES = (
    {"fwd_num_stages": 2, "bwd_num_stages": 1},
    {"fwd_BLOCK_M": 64, "fwd_BLOCK_N": 64, "fwd_num_stages": 1, "bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 64,
     "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 32, "bwd_num_stages": 1},
)

_lock = threading.Lock()
_plans: "collections.OrderedDict[Problem, Plan]" = collections.OrderedDict()
_compiled = None


def compiling() -> bool:
    """``HALOATTN_FLEX_COMPILE=0`` runs Flex uncompiled: its unfused reference, which holds the
    full N x N scores per head. Only for debugging mods on small problems."""
    return os.environ.get(COMPILE_ENV, "1") != "0"


class Plan:
    """Everything about a problem that does not depend on the tensors' values."""

    def __init__(self, problem: Problem):
        device = problem.device
        self.order = TokenOrder(problem)
        self.tables = masks.axis_tables(problem, self.order, device)
        needs_flat = problem.has_mods
        self.flat = mods.FlatIndices(self.order, device) if needs_flat else None
        self.source = self.order.source.to(device)
        self.place = self.order.place.to(device)
        mask_mod = mods.mask_mod(problem, self.order, self.tables, self.flat)
        self.block_mask = masks.block_mask(problem, self.order, mask_mod, device, allow_full=problem.mask_mod is None)
        self.kernel_options = None  # Flex's own choice until it fails to fit (SMALLER_TILES)
        # a 0-dim tensor, not a Python float: torch's unfused Flex traces mods with dynamic shapes,
        # where a captured float becomes a symbol it cannot return (torch 2.13)
        self.softcap = None if problem.softcap is None else torch.tensor(problem.softcap, device=device)


def plan_for(problem: Problem) -> Plan:
    with _lock:
        plan = _plans.get(problem)
        if plan is not None:
            _plans.move_to_end(problem)
            return plan
    plan = Plan(problem)
    with _lock:
        _plans[problem] = plan
        while len(_plans) > PLAN_CACHE_SIZE:
            _plans.popitem(last=False)
    return plan


def clear_plans() -> None:
    with _lock:
        _plans.clear()


def _flex_function():
    global _compiled
    from torch.nn.attention.flex_attention import flex_attention

    if not compiling():
        return flex_attention
    if _compiled is None:
        _compiled = torch.compile(flex_attention, dynamic=False, fullgraph=True)
    return _compiled


def _recompile_limits():
    import torch._dynamo

    config = torch._dynamo.config
    present = {}
    for names, value in RECOMPILE_LIMITS.items():
        name = next((n for n in names if hasattr(config, n)), None)
        if name:  # a setting this torch does not have is left out
            present[name] = value
    return config.patch(**present)


def _out_of_shared_memory(exc: Exception) -> bool:
    # Inductor: "No valid triton configs. OutOfMemoryError: out of resource: <kernel> Required: N
    # Hardware limit: M" (shared memory is the resource a config can exceed at compile time)
    return "out of resource" in str(exc)


def _smaller_tiles(options):
    """The config after ``options`` in (Flex's own, *SMALLER_TILES), or None after the last."""
    sequence = [None, *SMALLER_TILES]
    i = sequence.index(options)
    return sequence[i + 1] if i + 1 < len(sequence) else None


def _shrink_tiles(plan: Plan, exc: Exception) -> bool:
    """After ``exc``: when it is a shared-memory overflow and smaller tiles are left, move the
    plan to them (kept for the problem) and say so; else False (the caller re-raises)."""
    smaller = _smaller_tiles(plan.kernel_options)
    if not _out_of_shared_memory(exc) or smaller is None:
        return False
    plan.kernel_options = smaller
    return True


def _fitting_shared_memory(plan: Plan, attempt):
    """``attempt()``, retried with smaller tiles while it overflows shared memory."""
    while True:
        try:
            return attempt()
        except Exception as exc:
            if not _shrink_tiles(plan, exc):
                raise


def _call_flex(plan: Plan, q, k, v, score_mod, scale):
    """Flex's output and LSE with the plan's kernel options (smaller ones on an overflow)."""
    return _fitting_shared_memory(
        plan, lambda: _call_flex_once(q, k, v, score_mod, plan.block_mask, scale, plan.kernel_options))


def _call_flex_once(q, k, v, score_mod, block_mask, scale, kernel_options):
    """Flex with the LSE, through whichever interface this torch has (``return_aux`` since 2.9,
    ``return_lse`` before)."""
    from torch.nn.attention import flex_attention as flex_module

    fn = _flex_function()
    kwargs = dict(score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
                  kernel_options=kernel_options)
    with _recompile_limits():
        if hasattr(flex_module, "AuxRequest"):
            out, aux = fn(q, k, v, return_aux=flex_module.AuxRequest(lse=True), **kwargs)
            return out, aux.lse
        return fn(q, k, v, return_lse=True, **kwargs)


def _grid_sequence(t: torch.Tensor, problem: Problem, plan: Plan) -> torch.Tensor:
    """[B, *spatial, heads, dim] -> [B, positions, heads, dim] in the token order."""
    return t.reshape(t.shape[0], problem.tokens, *t.shape[-2:]).index_select(1, plan.source)


def _key_sequence(t, extra, problem: Problem, plan: Plan) -> torch.Tensor:
    """Keys or values: the grid in token order, the additional tokens, zero padding; [B, H, P, D]."""
    parts = [_grid_sequence(t, problem, plan)]
    if extra is not None:
        parts.append(extra.to(t.dtype))
    tail = plan.order.kv_positions - plan.order.positions - problem.extra_tokens
    if tail:
        parts.append(t.new_zeros(t.shape[0], tail, *t.shape[-2:]))
    seq = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    return seq.transpose(1, 2)


def _attend(problem: Problem, plan: Plan, inputs: AttentionInputs):
    q = _grid_sequence(inputs.query, problem, plan).transpose(1, 2)
    k = _key_sequence(inputs.key, inputs.additional_keys, problem, plan)
    v = _key_sequence(inputs.value, inputs.additional_values, problem, plan)
    score_mod = mods.score_mod(problem, plan.order, plan.tables, plan.flat, inputs.rpb, plan.softcap)
    out, lse = _call_flex(plan, q, k, v, score_mod, problem.scale)
    B, H = problem.batch, problem.heads
    out = out.transpose(1, 2).index_select(1, plan.place).reshape(B, *problem.spatial, H, -1)
    lse = lse.transpose(1, 2).index_select(1, plan.place).reshape(B, *problem.spatial, H)
    return out, lse


def forward(problem: Problem, inputs: AttentionInputs):
    plan = plan_for(problem)
    rpb = inputs.rpb.detach() if inputs.rpb is not None else None  # a Parameter would pin Flex's graph to it
    # Inside torch.compile's custom op the autograd keys are excluded; Flex's own call path goes
    # through an autograd.Function and needs them (recording_autograd re-includes them).
    with recording_autograd(), torch.no_grad():
        out, lse = _attend(problem, plan, inputs._replace(rpb=rpb))
    return out, lse.float()


class GraphState:
    """The forward's own autograd graph, kept for the backward (eager calls): the recomputation
    a backward would otherwise start with is one more Flex forward kernel per step."""

    def __init__(self, problem, inputs, needs_grad, leaves: AttentionInputs, outputs):
        self.problem, self.inputs, self.needs_grad = problem, inputs, needs_grad
        self.leaves, self.outputs = leaves, outputs


def _leaves(inputs: AttentionInputs, needs_grad) -> AttentionInputs:
    return AttentionInputs(
        *(t.detach().requires_grad_(bool(n)) if t is not None else None for t, n in zip(inputs, needs_grad))
    )


def _recorded(problem: Problem, plan: Plan, leaves: AttentionInputs):
    """(out, lse, lse with -inf rows zeroed, finite rows): rows with no key receive no gradient
    (SEMANTICS.md)."""
    with recording_autograd():
        out, lse = _attend(problem, plan, leaves)
        finite = torch.isfinite(lse)
        return out, lse, torch.where(finite, lse, torch.zeros_like(lse)), finite


def forward_with_state(problem: Problem, inputs: AttentionInputs, needs_grad):
    leaves = _leaves(inputs, needs_grad)
    out, lse, lse_for_grad, finite = _recorded(problem, plan_for(problem), leaves)
    state = GraphState(problem, inputs, needs_grad, leaves, (out, lse_for_grad, finite))
    return out.detach(), lse.detach().float(), state


def backward_from_state(state: GraphState, grad_out, grad_lse: Optional[torch.Tensor]):
    out, lse, finite = state.outputs
    try:
        # retain: a caller's backward(retain_graph=True) may call this again with the same state
        return _gradients(state.inputs, state.leaves, out, lse, finite, grad_out, grad_lse, retain=True)
    except Exception as exc:
        # Flex compiles its backward kernel on first use; if that config overflows shared memory,
        # recompute with the next smaller tiles (the forward's fitted, the backward's did not)
        if not _shrink_tiles(plan_for(state.problem), exc):
            raise
        return backward(state.problem, state.inputs, grad_out, grad_lse, state.needs_grad)


def _gradients(inputs, leaves, out, lse, finite, grad_out, grad_lse, retain: bool):
    outputs, seeds = [out], [grad_out.to(out.dtype)]
    if grad_lse is not None:
        outputs.append(lse)
        seeds.append(torch.where(finite, grad_lse.to(lse.dtype), torch.zeros_like(lse)))
    wanted = [i for i, t in enumerate(leaves) if t is not None and t.requires_grad]
    grads = torch.autograd.grad(outputs, [leaves[i] for i in wanted], seeds, allow_unused=True, retain_graph=retain)
    result = [None] * len(leaves)
    for i, g in zip(wanted, grads):
        result[i] = (g if g is not None else torch.zeros_like(leaves[i])).to(inputs[i].dtype)
    return tuple(result)


def backward(problem: Problem, inputs: AttentionInputs, grad_out, grad_lse: Optional[torch.Tensor], needs_grad):
    """Recompute the forward under autograd and differentiate it (torch.compile's custom ops,
    which cannot keep the forward's graph), moving to smaller tiles if a backward config
    overflows shared memory."""
    plan = plan_for(problem)

    def attempt():
        leaves = _leaves(inputs, needs_grad)
        out, _, lse, finite = _recorded(problem, plan, leaves)
        return _gradients(inputs, leaves, out, lse, finite, grad_out, grad_lse, retain=False)

    return _fitting_shared_memory(plan, attempt)
