"""The reference computation of SEMANTICS.md in plain PyTorch, one chunk of query rows at a time.

Each query sees at most ``prod(window)`` grid keys, listed per axis by ``geometry.key_range``; the
chunk gathers exactly those keys (plus the additional tokens), so memory grows with
``rows * window`` and never with ``N * N``. Works on any device and dtype; 16-bit inputs are
computed in float32, float64 in float64.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from haloattn.backend import AttentionInputs, recording_autograd
from haloattn.geometry import key_range, ravel, unravel
from haloattn.problem import Problem

# Bytes one chunk's gathered keys/values and scores may take; bounds peak memory.
CHUNK_BYTES = 256 * 2**20


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def rows_per_chunk(problem: Problem) -> int:
    itemsize = 8 if problem.dtype == torch.float64 else 4
    conv_rows = problem.kq_conv_shape[0] * problem.kq_conv_shape[1] if problem.kq_conv_shape else 1
    per_row = problem.batch * itemsize * (
        problem.window_tokens * problem.kv_heads * (problem.head_dim + problem.value_dim)
        + 6 * problem.heads * (problem.window_tokens * conv_rows + problem.extra_tokens)
    )
    return max(1, min(problem.tokens, CHUNK_BYTES // per_row))


def chunks(problem: Problem):
    step = rows_per_chunk(problem)
    for start in range(0, problem.tokens, step):
        yield start, min(start + step, problem.tokens)


class Candidates:
    """The grid keys a block of query rows may see: flat indices, validity, rpb indices."""

    def __init__(self, problem: Problem, rows: torch.Tensor):
        n = rows.numel()
        coords = unravel(rows, problem.spatial)
        key_coords, valid, rel, self.ranges = [], [], [], []
        for a, axis in enumerate(problem.axes):
            group, lo, hi = key_range(axis, problem.pattern, coords[a])
            self.ranges.append((group, lo, hi))
            y = lo[:, None] + torch.arange(axis.window, device=rows.device)[None, :]
            ok = y < hi[:, None]
            j = (y * axis.dilation + group[:, None]).clamp(max=axis.length - 1)
            r = (y - (coords[a] // axis.dilation)[:, None] + axis.window - 1).clamp(0, 2 * axis.window - 2)
            shape = [n] + [1] * problem.rank
            shape[1 + a] = axis.window
            key_coords.append(j.view(shape))
            valid.append(ok.view(shape))
            rel.append(r.view(shape))
        full = [n] + list(problem.window)
        self.index = ravel(key_coords, problem.spatial).expand(full).reshape(n, -1)
        mask = valid[0]
        for v in valid[1:]:
            mask = mask & v
        self.valid = mask.expand(full).reshape(n, -1)
        self.relative = [r.expand(full).reshape(n, -1) for r in rel]


def _gather(tokens: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """tokens [B, N, Hkv, D], index [n, P] -> [B, n, P, Hkv, D]."""
    picked = tokens.index_select(1, index.reshape(-1))
    return picked.view(tokens.shape[0], *index.shape, *tokens.shape[2:])


def _grouped_scores(q: torch.Tensor, k: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """q [B, n, H, D], k [B, n, P, Hkv, D] -> q.k [B, n, H, P] (query head h uses kv head h // G)."""
    B, n, H, D = q.shape
    q5 = q.view(B, n, kv_heads, H // kv_heads, D)
    return torch.einsum("bnkgd,bnpkd->bnkgp", q5, k).reshape(B, n, H, -1)


def _mod_indices(problem: Problem, device, rows: torch.Tensor):
    b = torch.arange(problem.batch, device=device).view(-1, 1, 1, 1)
    h = torch.arange(problem.heads, device=device).view(1, 1, -1, 1)
    q_idx = rows.view(1, -1, 1, 1)
    return b, h, q_idx


def _apply_mask_mod(problem: Problem, keep: torch.Tensor, b, h, q_idx, kv_idx) -> torch.Tensor:
    if problem.mask_mod is None:
        return keep.expand(problem.batch, -1, problem.heads, -1)
    allowed = problem.mask_mod(b, h, q_idx, kv_idx)
    if not torch.is_tensor(allowed):
        allowed = torch.tensor(bool(allowed), device=keep.device)
    return (keep & allowed.bool()).expand(problem.batch, -1, problem.heads, -1)


def _key_query_conv(problem: Problem, s0: torch.Tensor, cand: Candidates, ext_rows, weight, pad: int):
    """Section 6: convolve the (masked, scaled) scores over (query, key) offsets, rank 1.

    ``s0`` holds the scores of the extended rows ``ext_rows`` (``pad`` rows before the chunk) over
    their own candidate keys; a source pair (i', j') outside i''s candidates has S0 = 0.
    """
    axis = problem.axes[0]
    c_q, c_k = problem.kq_conv_shape
    half = (c_k - 1) // 2
    n = ext_rows.numel() - pad
    group, lo, hi = cand.ranges[0]
    target_keys = cand.index[pad:]  # [n, K] flat = coordinate on a rank-1 grid
    out = torch.zeros_like(s0[:, pad:])
    for a in range(c_q):
        src = slice(a, a + n)
        src_group, src_lo, src_hi = group[src, None], lo[src, None], hi[src, None]
        src_in_grid = (ext_rows[src] >= 0)[:, None]
        for t in range(c_k):
            j = target_keys + (t - half)
            pos = j // axis.dilation - src_lo
            ok = (
                src_in_grid
                & (j >= 0)
                & (j < axis.length)
                & (j % axis.dilation == src_group)
                & (pos >= 0)
                & (pos < src_hi - src_lo)
            )
            index = pos.clamp(0, axis.window - 1)[None, :, None, :].expand_as(out)
            picked = s0[:, src].gather(-1, index) * ok[None, :, None, :]
            out = out + weight[:, a, t].view(1, 1, -1, 1) * picked
    return out


def attend_rows(problem: Problem, inputs: AttentionInputs, start: int, stop: int):
    """Output [B, n, H, D_v] and LSE [B, n, H] (compute dtype) of query rows ``[start, stop)``.

    ``inputs`` are flattened to ``[B, N, heads, dim]`` and already in the compute dtype.
    """
    q, k, v = inputs.query, inputs.key, inputs.value
    device = q.device
    pad = problem.kq_conv_shape[0] - 1 if problem.kq_conv_shape else 0
    ext_rows = torch.arange(start - pad, stop, device=device)
    cand = Candidates(problem, ext_rows.clamp(min=0))
    q_rows = q.index_select(1, ext_rows.clamp(min=0))
    b, h, q_idx = _mod_indices(problem, device, ext_rows.clamp(min=0))
    kv_idx = cand.index[None, :, None, :]
    keep = _apply_mask_mod(problem, cand.valid[None, :, None, :], b, h, q_idx, kv_idx)

    scores = _grouped_scores(q_rows, _gather(k, cand.index), problem.kv_heads) * problem.scale
    if inputs.kq_conv is not None:
        s0 = torch.where(keep, scores, torch.zeros((), dtype=scores.dtype, device=device))
        scores = _key_query_conv(problem, s0, cand, ext_rows, inputs.kq_conv.to(scores.dtype), pad)
        keep = keep[:, pad:]
        kv_idx = kv_idx[:, pad:]
        q_idx = q_idx[:, pad:]
        cand_index = cand.index[pad:]
        relative = [r[pad:] for r in cand.relative]
    else:
        cand_index, relative = cand.index, cand.relative
    if inputs.rpb is not None:
        bias = inputs.rpb.to(scores.dtype)[(slice(None), *relative)]  # [H, n, P]
        scores = scores + bias.permute(1, 0, 2).unsqueeze(0)
    if problem.score_mod is not None:
        scores = problem.score_mod(scores, b, h, q_idx, kv_idx)
    values = _gather(v, cand_index)

    if problem.extra_tokens:
        ak, av = inputs.additional_keys, inputs.additional_values
        q_target = q_rows[:, pad:]
        extra = torch.einsum("bnkgd,bekd->bnkge", q_target.view(*q_target.shape[:2], problem.kv_heads, -1, q.shape[-1]), ak)
        extra = extra.reshape(*q_target.shape[:3], -1) * problem.scale
        extra_idx = (problem.tokens + torch.arange(problem.extra_tokens, device=device)).view(1, 1, 1, -1)
        if problem.score_mod is not None:
            extra = problem.score_mod(extra, b, h, q_idx, extra_idx)
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
    P = cand_index.shape[1]
    B, n, H = weights.shape[:3]
    G = H // problem.kv_heads
    grid_w = weights[..., :P].reshape(B, n, problem.kv_heads, G, P)
    out = torch.einsum("bnkgp,bnpkd->bnkgd", grid_w, values)
    if problem.extra_tokens:
        extra_w = weights[..., P:].reshape(B, n, problem.kv_heads, G, -1)
        out = out + torch.einsum("bnkge,bekd->bnkgd", extra_w, inputs.additional_values)
    out = out.reshape(B, n, H, -1)
    empty = total == 0
    out = out / torch.where(empty, torch.ones_like(total), total).unsqueeze(-1)
    lse = torch.where(empty, torch.full_like(total, -math.inf), row_max.squeeze(-1) + torch.log(total))
    return out, lse


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


def forward(problem: Problem, inputs: AttentionInputs) -> Tuple[torch.Tensor, torch.Tensor]:
    work = flatten(problem, inputs, compute_dtype(problem.dtype))
    B, N, H = problem.batch, problem.tokens, problem.heads
    out = torch.empty(B, N, H, problem.value_dim, dtype=problem.dtype, device=problem.device)
    lse = torch.empty(B, N, H, dtype=lse_dtype(problem), device=problem.device)
    with torch.no_grad():
        for start, stop in chunks(problem):
            o, l = attend_rows(problem, work, start, stop)
            out[:, start:stop] = o.to(out.dtype)
            lse[:, start:stop] = l.to(lse.dtype)
    return out.view(B, *problem.spatial, H, -1), lse.view(B, *problem.spatial, H)


def backward(problem: Problem, inputs: AttentionInputs, grad_out, grad_lse, needs_grad):
    """Gradients by recomputing each chunk under autograd: memory stays bounded by one chunk."""
    work = flatten(problem, inputs, compute_dtype(problem.dtype))
    leaves = [
        t.detach().requires_grad_(bool(ng)) if t is not None else None for t, ng in zip(work, needs_grad)
    ]
    leaves = AttentionInputs(*leaves)
    targets = [i for i, t in enumerate(leaves) if t is not None and t.requires_grad]
    grads = [None] * len(leaves)
    go = grad_out.reshape(problem.batch, problem.tokens, problem.heads, -1)
    gl = grad_lse.reshape(problem.batch, problem.tokens, problem.heads) if grad_lse is not None else None
    for start, stop in chunks(problem):
        with recording_autograd():  # backward runs with grad mode off: build every output inside
            o, l = attend_rows(problem, leaves, start, stop)
            outputs, seeds = [o], [go[:, start:stop].to(o.dtype)]
            if gl is not None:
                finite = torch.isfinite(l)
                outputs.append(torch.where(finite, l, torch.zeros_like(l)))
                seeds.append(gl[:, start:stop].to(l.dtype))
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
