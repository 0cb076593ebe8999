"""The reference computation of SEMANTICS.md in plain PyTorch, one chunk of query rows at a time.

Each query sees at most ``prod(window)`` grid keys, listed per axis by ``geometry.key_range``; the
chunk gathers exactly those keys (plus the additional tokens), so memory grows with
``rows * window`` and never with ``N * N``. Works on any device and dtype; 16-bit inputs are
computed in float32, float64 in float64.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional, Tuple

import torch

from haloattn.backend import AttentionInputs, recording_autograd
from haloattn.problem import Problem

from . import conv_tiles, tiled
from .blocks import TilePlan

# Bytes one block's gathered keys/values and scores may take; bounds peak memory.
CHUNK_BYTES = 256 * 2**20
# ...on CUDA devices, where a block's operators are launched from the host one by one and small
# blocks leave the GPU waiting: at 256 MiB blocks the key-query convolution of a 1-D 8192-token
# call (window 1023, 16 heads of 128) spent 99 ms of host time on 18 ms of device work (H200,
# torch.profiler, 2026-12-05; RESULTS.md "The key-query convolution on a GPU"). Up to this many
# bytes there, and at most a GPU_MEMORY_SHARE-th of the device's memory: 2.0-2.6x faster on those
# calls, forward and backward, which are then about device-bound.
GPU_CHUNK_BYTES = 2**30
GPU_MEMORY_SHARE = 32


def chunk_bytes(device) -> int:
    """The block bound on ``device`` (CHUNK_BYTES, larger on CUDA devices: see GPU_CHUNK_BYTES)."""
    device = torch.device(device)
    if device.type != "cuda":
        return CHUNK_BYTES
    total = torch.cuda.get_device_properties(device).total_memory
    return max(CHUNK_BYTES, min(GPU_CHUNK_BYTES, total // GPU_MEMORY_SHARE))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _bytes_per_row(problem: Problem, keys: int, keys_shared_by: int) -> int:
    """Memory one query row costs: scores and their softmax intermediates per head, plus its
    share of gathered keys/values (shared by ``keys_shared_by`` rows in a tile)."""
    itemsize = 8 if problem.dtype == torch.float64 else 4
    scores = 6 * problem.heads * (keys + problem.extra_tokens) + 2 * keys
    gathered = keys * problem.kv_heads * (problem.head_dim + problem.value_dim) / keys_shared_by
    return int(problem.batch * itemsize * (scores + gathered)) + 16 * keys * (problem.rank + 2)


def blocks(problem: Problem, device):
    """The blocks of query rows that together cover the grid, each within chunk_bytes(device) (a
    key-query convolution's in conv_tiles' own blocks)."""
    bound = chunk_bytes(device)
    if problem.kq_conv_shape is not None:
        yield from conv_tiles.blocks(problem, device, bound)
        return
    plan = TilePlan(problem, device)
    per_tile = plan.rows_per_tile * _bytes_per_row(problem, plan.keys_per_tile, plan.rows_per_tile)
    step = max(1, bound // per_tile)
    for start in range(0, plan.tiles, step):
        yield plan.block(start, min(start + step, plan.tiles))


def _mod_indices(problem: Problem, device, rows: torch.Tensor):
    b = torch.arange(problem.batch, device=device).view(-1, 1, 1, 1)
    h = torch.arange(problem.heads, device=device).view(1, 1, -1, 1)
    q_idx = rows.view(1, -1, 1, 1)
    return b, h, q_idx


def _apply_mask_mod(problem: Problem, keep: torch.Tensor, b, h, q_idx, kv_idx) -> torch.Tensor:
    if problem.mask_mod is None:
        return keep.expand(problem.batch, -1, problem.heads, -1)
    allowed = problem.apply_mask_mod(b, h, q_idx, kv_idx)
    return (keep & allowed).expand(problem.batch, -1, problem.heads, -1)


def attend_block(problem: Problem, inputs: AttentionInputs, block):
    """Output [B, n, H, D_v] and LSE [B, n, H] (compute dtype) of a block's query rows.

    ``inputs`` are flattened to ``[B, N, heads, dim]`` and already in the compute dtype.
    """
    q = inputs.query
    device = q.device
    b, h, q_idx = _mod_indices(problem, device, block.rows)
    needs_kv_index = problem.has_mods
    kv_idx = block.kv_index[None, :, None, :] if needs_kv_index else None
    keep = _apply_mask_mod(problem, block.keep[None, :, None, :], b, h, q_idx, kv_idx)
    if problem.kq_conv_shape is not None:
        scores = conv_tiles.convolved_scores(problem, inputs, block, b, h)
    else:
        scores = block.scores(q, inputs.key, problem.kv_heads) * problem.scale
    if inputs.rpb is not None:
        bias = inputs.rpb.to(scores.dtype)[(slice(None), *block.relative)]  # [H, n, P]
        scores = scores + bias.permute(1, 0, 2).unsqueeze(0)
    if problem.score_mod is not None:
        scores = problem.apply_score_mod(scores, b, h, q_idx, kv_idx)
    grid_keys = scores.shape[-1]

    if problem.extra_tokens:
        ak = inputs.additional_keys
        q_rows = q.index_select(1, block.rows)
        extra = torch.einsum(
            "bnkgd,bekd->bnkge", q_rows.view(*q_rows.shape[:2], problem.kv_heads, -1, q.shape[-1]), ak
        )
        extra = extra.reshape(*q_rows.shape[:3], -1) * problem.scale
        extra_idx = (problem.tokens + torch.arange(problem.extra_tokens, device=device)).view(1, 1, 1, -1)
        if problem.score_mod is not None:
            extra = problem.apply_score_mod(extra, b, h, q_idx, extra_idx)
        extra_keep = _apply_mask_mod(
            problem, torch.ones(1, 1, 1, problem.extra_tokens, dtype=torch.bool, device=device), b, h, q_idx, extra_idx
        )
        scores = torch.cat([scores.expand(problem.batch, -1, -1, -1), extra], dim=-1)
        keep = torch.cat([keep, extra_keep.expand(-1, keep.shape[1], -1, -1)], dim=-1)
    if problem.softcap is not None:
        scores = problem.softcap * torch.tanh(scores / problem.softcap)

    masked = torch.where(keep, scores, torch.full((), -math.inf, dtype=scores.dtype, device=device))
    row_max = masked.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(masked - row_max)
    total = weights.sum(dim=-1)
    out = block.mix(weights[..., :grid_keys], inputs.value, problem.kv_heads)
    if problem.extra_tokens:
        B, n, H = weights.shape[:3]
        extra_w = weights[..., grid_keys:].reshape(B, n, problem.kv_heads, H // problem.kv_heads, -1)
        out = out + torch.einsum("bnkge,bekd->bnkgd", extra_w, inputs.additional_values).reshape(B, n, H, -1)
    empty = total == 0
    out = out / torch.where(empty, torch.ones_like(total), total).unsqueeze(-1)
    lse = torch.where(empty, torch.full_like(total, -math.inf), row_max.squeeze(-1) + torch.log(total))
    return out, lse


def _written_rows(block):
    """Positions within the block, and grid rows, of the block's real queries (tiles at the end
    of an axis are ragged: their padding rows are computed but never written)."""
    if block.row_valid is None:
        return None, block.rows
    positions = block.row_valid.nonzero().squeeze(1)
    return positions, block.rows.index_select(0, positions)


def flatten(problem: Problem, inputs: AttentionInputs, dtype: torch.dtype) -> AttentionInputs:
    """[B, *spatial, heads, dim] -> [B, N, heads, dim] in ``dtype`` (extras unchanged but cast)."""
    def flat(t: Optional[torch.Tensor], spatial: bool) -> Optional[torch.Tensor]:
        if t is None:
            return None
        t = t.to(dtype)
        return t.reshape(t.shape[0], problem.tokens, *t.shape[-2:]) if spatial else t

    return AttentionInputs(
        flat(inputs.query, True),
        flat(inputs.key, True),
        flat(inputs.value, True),
        flat(inputs.rpb, False),
        flat(inputs.kq_conv, False),
        flat(inputs.additional_keys, False),
        flat(inputs.additional_values, False),
    )


def lse_dtype(problem: Problem) -> torch.dtype:
    return torch.float64 if problem.dtype == torch.float64 else torch.float32


def _no_autocast(device):
    """The compute dtype is ours to choose (16-bit inputs compute in float32), autocast or not."""
    device_type = torch.device(device).type
    if not torch.amp.is_autocast_available(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


def forward(problem: Problem, inputs: AttentionInputs) -> Tuple[torch.Tensor, torch.Tensor]:
    work = flatten(problem, inputs, compute_dtype(problem.dtype))
    B, N, H = problem.batch, problem.tokens, problem.heads
    if problem.kq_conv_shape is None:
        with torch.no_grad(), _no_autocast(problem.device):
            out, lse = tiled.forward(
                problem, tiled.Work(problem, work), blocks(problem, problem.device), problem.dtype, lse_dtype(problem)
            )
        return out.view(B, *problem.spatial, H, -1), lse.view(B, *problem.spatial, H)
    out = torch.empty(B, N, H, problem.value_dim, dtype=problem.dtype, device=problem.device)
    lse = torch.empty(B, N, H, dtype=lse_dtype(problem), device=problem.device)
    with torch.no_grad():
        for block in blocks(problem, problem.device):
            o, l = attend_block(problem, work, block)
            positions, rows = _written_rows(block)
            if positions is not None:
                o, l = o.index_select(1, positions), l.index_select(1, positions)
            out.index_copy_(1, rows, o.to(out.dtype))
            lse.index_copy_(1, rows, l.to(lse.dtype))
    return out.view(B, *problem.spatial, H, -1), lse.view(B, *problem.spatial, H)


def forward_out_of_place(problem: Problem, inputs: AttentionInputs, row_blocks) -> Tuple[torch.Tensor, torch.Tensor]:
    """The forward without in-place writes: blocks of consecutive query rows (``row_blocks``, in
    order), each computed by ``attend_block`` and concatenated. What a trace records
    (haloattn.tracing): buffers filled in place export to ONNX as the constants they were created
    as, these operations as the computation."""
    work = flatten(problem, inputs, compute_dtype(problem.dtype))
    with _no_autocast(problem.device):
        parts = [attend_block(problem, work, block) for block in row_blocks]
    out = torch.cat([o for o, _ in parts], dim=1).to(problem.dtype)
    lse = torch.cat([l for _, l in parts], dim=1).to(lse_dtype(problem))
    B, H = problem.batch, problem.heads
    return out.view(B, *problem.spatial, H, -1), lse.view(B, *problem.spatial, H)


def backward(problem: Problem, inputs: AttentionInputs, grad_out, grad_lse, needs_grad, out=None, lse=None):
    """Gradients, block by block: memory stays bounded by one block. Tiles (every problem without
    kq_conv) run the explicit backward of tiled.py, which needs the forward's ``out`` and ``lse``
    (recomputed when not given); kq_conv recomputes each block under autograd."""
    work = flatten(problem, inputs, compute_dtype(problem.dtype))
    if problem.kq_conv_shape is None:
        if out is None or lse is None:
            out, lse = forward(problem, inputs)
        with torch.no_grad(), _no_autocast(problem.device):
            grads = tiled.backward(
                problem, tiled.Work(problem, work), blocks(problem, problem.device), out, lse, grad_out, grad_lse, needs_grad
            )
        return tuple(
            g.to(original.dtype).reshape(original.shape) if g is not None and ng else None
            for g, original, ng in zip(grads, inputs, needs_grad)
        )
    leaves = [
        t.detach().requires_grad_(bool(ng)) if t is not None else None for t, ng in zip(work, needs_grad)
    ]
    leaves = AttentionInputs(*leaves)
    targets = [i for i, t in enumerate(leaves) if t is not None and t.requires_grad]
    grads = [None] * len(leaves)
    go = grad_out.reshape(problem.batch, problem.tokens, problem.heads, -1)
    gl = grad_lse.reshape(problem.batch, problem.tokens, problem.heads) if grad_lse is not None else None
    for block in blocks(problem, problem.device):
        with recording_autograd():  # backward runs with grad mode off: build every output inside
            outputs, seeds = block_outputs_and_seeds(problem, leaves, block, go, gl)
        partial = torch.autograd.grad(outputs, [leaves[i] for i in targets], seeds, allow_unused=True)
        for i, g in zip(targets, partial):
            if g is not None:
                grads[i] = g if grads[i] is None else grads[i] + g
    result = []
    for i, original in enumerate(inputs):
        if i in targets:
            g = grads[i] if grads[i] is not None else torch.zeros_like(leaves[i])
            result.append(g.to(original.dtype).reshape(original.shape))
        else:
            result.append(None)
    return tuple(result)


def block_outputs_and_seeds(problem: Problem, work: AttentionInputs, block, grad_out, grad_lse):
    """A block's outputs under autograd (out, and the LSE where ``grad_lse`` is given) and their
    seeds, the block's rows of dO and dLSE (``[B, N, H, ...]``). Padding rows of ragged tiles are
    recomputed too; a zero seed keeps them out of the sums. Rows that saw no key keep an LSE of
    -inf, a constant: a finite stand-in keeps inf - inf out of the products."""
    real = None if block.row_valid is None else block.row_valid.view(1, -1, 1)
    o, l = attend_block(problem, work, block)
    seed = grad_out.index_select(1, block.rows).to(o.dtype)
    outputs, seeds = [o], [seed if real is None else seed * real.unsqueeze(-1)]
    if grad_lse is not None:
        outputs.append(torch.where(torch.isfinite(l), l, torch.zeros_like(l)))
        seed = grad_lse.index_select(1, block.rows).to(l.dtype)
        seeds.append(seed if real is None else seed * real)
    return outputs, seeds
