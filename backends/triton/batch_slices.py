"""Batches larger than one launch can hold.

A CUDA grid takes at most 65535 programs on its second and third axes, and the neighbourhood
kernels put the batch on the third (query or key tiles on the first, which holds 2^31 - 1). A
larger batch (short sequences folded into the batch, say) runs as one launch per slice of at most
that many batch entries: the slices are views, the kernels are the same compiled ones (the batch
is a grid size, not a compile-time constant), outputs are joined and the bias gradient summed.
score_mod and mask_mod see the caller's batch index: each slice's mods add its first entry.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, List

import torch

from haloattn.backend import AttentionInputs
from haloattn.problem import Problem, mods_on_indices

MAX_GRID_BATCH = 65535
# Inputs without a batch axis: the bias table and the key-query convolution weights.
_SHARED = ("rpb", "kq_conv")


def needs_slices(problem: Problem) -> bool:
    return problem.batch > MAX_GRID_BATCH


def batch_slices(batch: int) -> List[slice]:
    return [slice(start, min(start + MAX_GRID_BATCH, batch)) for start in range(0, batch, MAX_GRID_BATCH)]


@functools.lru_cache(maxsize=64)
def _mods_from(score_mod, mask_mod, first: int):
    """The mods of a slice that starts at batch entry ``first`` (the same functions for the same
    slice on every call, so a compiled mod is compiled once)."""
    return mods_on_indices(score_mod, mask_mod, lambda b, h: (b + first, h))


def _part(problem: Problem, inputs: AttentionInputs, part: slice):
    sliced = AttentionInputs(*(
        t if t is None or name in _SHARED else t[part] for name, t in zip(AttentionInputs._fields, inputs)
    ))
    changes = dict(batch=part.stop - part.start)
    if part.start and (problem.score_mod is not None or problem.mask_mod is not None):
        changes["score_mod"], changes["mask_mod"] = _mods_from(problem.score_mod, problem.mask_mod, part.start)
    return dataclasses.replace(problem, **changes), sliced


def forward_in_slices(forward: Callable, problem: Problem, inputs: AttentionInputs, config):
    outs, lses = [], []
    for part in batch_slices(problem.batch):
        out, lse = forward(*_part(problem, inputs, part), config)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def backward_in_slices(backward: Callable, problem: Problem, inputs: AttentionInputs, out, lse, grad_out,
                       grad_lse, needs_grad, config):
    grads = []
    for part in batch_slices(problem.batch):
        grads.append(backward(*_part(problem, inputs, part), out[part], lse[part], grad_out[part],
                              None if grad_lse is None else grad_lse[part], needs_grad, config))
    joined = []
    for name, per_slice in zip(AttentionInputs._fields, zip(*grads)):
        if per_slice[0] is None:
            joined.append(None)
        elif name in _SHARED:
            joined.append(torch.stack([g.float() for g in per_slice]).sum(0).to(per_slice[0].dtype))
        else:
            joined.append(torch.cat(per_slice))
    return tuple(joined)


def jvp_in_slices(jvp: Callable, problem: Problem, inputs: AttentionInputs, tangents: AttentionInputs, out, lse,
                  config):
    outs, lses = [], []
    for part in batch_slices(problem.batch):
        sliced, directions = _part(problem, inputs, part), _part(problem, tangents, part)[1]
        t_out, t_lse = jvp(*sliced, directions, out[part], lse[part], config)
        outs.append(t_out)
        lses.append(t_lse)
    return torch.cat(outs), torch.cat(lses)
