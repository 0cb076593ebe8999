"""Forward-mode AD (JVP) of the reference backend, for every feature the reference runs.

Problems without a ``score_mod`` or key-query convolution run tiled_jvp.py's explicit rule; the
rest take the general one here: the tangent of a block's outputs by transposing reverse mode
twice. For the block's outputs ``y = f(x)`` and a cotangent ``u``, autograd gives ``g(u) = J^T u``
as a graph linear in ``u``; then ``d<g(u), v>/du = J v``, the tangent for the inputs' tangents
``v``. Forward-mode AD itself cannot run here: a backend's JVP rule is called inside torch's own
forward-AD level, and torch has no nested levels. This way every op of the reference's block
computation (score and mask mods included, as long as autograd can differentiate them twice) gets
its tangent without a second hand-written formula to keep in step with SEMANTICS.md. Memory stays
bounded by blocks of query rows, as in the forward.
"""

from __future__ import annotations

from typing import Tuple

import torch

from haloattn.backend import AttentionInputs, recording_autograd
from haloattn.problem import Problem

from . import conv_tiles, tiled, tiled_jvp
from .attend import (_bytes_per_row, _no_autocast, attend_block, blocks, chunk_bytes, compute_dtype, flatten,
                     lse_dtype)
from .blocks import GatheredRows

# Two graphs of a block (the block's own and its vector-Jacobian product's) are alive at once,
# each a few times the forward's intermediates.
GRAPH_FACTOR = 4


def row_blocks(problem: Problem, device):
    """Blocks of consecutive query rows, in order, each with its own keys gathered (GatheredRows;
    with a key-query convolution, conv_tiles' blocks)."""
    bound = chunk_bytes(device)
    if problem.kq_conv_shape is not None:
        yield from conv_tiles.blocks(problem, device, bound // GRAPH_FACTOR)
        return
    per_row = GRAPH_FACTOR * _bytes_per_row(problem, problem.window_tokens, 1)
    step = max(1, min(problem.tokens, bound // per_row))
    for start in range(0, problem.tokens, step):
        stop = min(start + step, problem.tokens)
        yield GatheredRows(problem, torch.arange(start, stop, device=device))


def jvp(problem: Problem, inputs: AttentionInputs, tangents: AttentionInputs,
        lse: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(tangent of out, tangent of lse), shaped like out and lse (``lse``: the forward's)."""
    dtype = compute_dtype(problem.dtype)
    work = flatten(problem, inputs, dtype)
    directions = flatten(problem, tangents, dtype)
    if tiled_jvp.covers(problem):
        with torch.no_grad(), _no_autocast(problem.device):
            t_out, t_lse = tiled_jvp.jvp(problem, tiled.Work(problem, work), directions,
                                         blocks(problem, problem.device), lse, problem.dtype, lse_dtype(problem))
        B, H = problem.batch, problem.heads
        return t_out.view(B, *problem.spatial, H, -1), t_lse.view(B, *problem.spatial, H)
    followed = [i for i, t in enumerate(directions) if t is not None and work[i] is not None]
    B, N, H = problem.batch, problem.tokens, problem.heads
    device = problem.device
    t_out = torch.zeros(B, N, H, problem.value_dim, dtype=problem.dtype, device=device)
    t_lse = torch.zeros(B, N, H, dtype=lse_dtype(problem), device=device)
    if followed:
        for block in row_blocks(problem, device):
            t_o, t_l = _block_tangents(problem, work, directions, followed, block)
            t_out.index_copy_(1, block.rows, t_o.to(t_out.dtype))
            t_lse.index_copy_(1, block.rows, t_l.to(t_lse.dtype))
    return t_out.view(B, *problem.spatial, H, -1), t_lse.view(B, *problem.spatial, H)


def _block_tangents(problem: Problem, work: AttentionInputs, directions: AttentionInputs, followed, block):
    """The block's (out, lse) tangents by the double vector-Jacobian product."""
    leaves = list(work)
    for i in followed:
        leaves[i] = work[i].detach().requires_grad_(True)
    with recording_autograd(), _no_autocast(problem.device):
        out, lse = attend_block(problem, AttentionInputs(*leaves), block)
        # Rows that saw no key keep lse = -inf, a constant (tangent 0); the finite stand-in keeps
        # inf - inf out of the products.
        lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        # Only outputs that depend on a moving input enter the products (with only the values
        # moving, the LSE depends on none of them: its tangent is 0).
        moved = [(y, torch.zeros_like(y, requires_grad=True)) for y in (out, lse) if y.requires_grad]
        if not moved:
            return torch.zeros_like(out), torch.zeros_like(lse)
        outputs, seeds = zip(*moved)
        pulled = torch.autograd.grad(outputs, [leaves[i] for i in followed], seeds, create_graph=True,
                                     allow_unused=True)
        pairing = sum((g * directions[i]).sum() for g, i in zip(pulled, followed) if g is not None)
    if not torch.is_tensor(pairing) or not pairing.requires_grad:
        return torch.zeros_like(out), torch.zeros_like(lse)  # no input with a tangent reaches these rows
    pushed = dict(zip((id(y) for y in outputs), torch.autograd.grad(pairing, seeds, allow_unused=True)))
    tangents = []
    for y in (out, lse):
        t = pushed.get(id(y))
        tangents.append(torch.zeros_like(y) if t is None else t.detach())
    return tuple(tangents)
