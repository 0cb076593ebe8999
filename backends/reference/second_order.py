"""The reference backend's backward recorded on autograd, for second derivatives (see
haloattn.second_order): each block of query rows is recomputed from the inputs themselves (not
detached copies), and its vector-Jacobian product taken with ``create_graph=True``, so the
gradients carry a graph back to the inputs and to dO / dLSE. Everything the block computation
does (gathers, products, the softmax, bias, softcap, additional tokens, score and mask mods,
kq_conv) is differentiated by autograd, twice. Unlike the first-order backward, the graphs of
all blocks stay alive until the second backward: memory grows with tokens x window, as for any
unfused attention."""

from __future__ import annotations

from typing import Sequence

import torch

from haloattn.backend import AttentionInputs, recording_autograd
from haloattn.problem import Problem

from .attend import _no_autocast, block_outputs_and_seeds, compute_dtype, flatten
from .jvp import row_blocks


def differentiable_backward(problem: Problem, inputs: AttentionInputs, grad_out: torch.Tensor, grad_lse,
                            needs_grad: Sequence[bool]):
    """One gradient per entry of ``inputs`` (None where not needed), differentiable again."""
    targets = [i for i, (t, n) in enumerate(zip(inputs, needs_grad)) if n and t is not None]
    grads = [None] * len(inputs)
    if not targets:
        return tuple(grads)
    B, N, H = problem.batch, problem.tokens, problem.heads
    with recording_autograd(), _no_autocast(problem.device):
        # One alias per argument: a tensor passed as query, key and value alike must get three
        # gradients, one per role, not three copies of its total.
        roles = AttentionInputs(*(t.view_as(t) if t is not None else None for t in inputs))
        work = flatten(problem, roles, compute_dtype(problem.dtype))
        go = grad_out.reshape(B, N, H, -1)
        gl = grad_lse.reshape(B, N, H) if grad_lse is not None else None
        for block in row_blocks(problem, problem.device):
            outputs, seeds = block_outputs_and_seeds(problem, work, block, go, gl)
            partial = torch.autograd.grad(outputs, [roles[i] for i in targets], seeds, create_graph=True,
                                          allow_unused=True)
            for i, g in zip(targets, partial):
                if g is not None:
                    grads[i] = g if grads[i] is None else grads[i] + g
    return tuple(g if g is not None or i not in targets else torch.zeros_like(inputs[i])
                 for i, g in enumerate(grads))
