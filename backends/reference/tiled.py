"""The reference computation on query tiles (:class:`~.blocks.TileBoxes`), in a head-major layout.

Every problem without a key-query convolution runs here, forward and backward. Once per call the
inputs are laid out head-major (query ``[B, Hkv, N, G, D]``, pre-multiplied by the scale, keys and
values ``[B, Hkv, N, D]``), so a tile's rows of one key/value head are one ``[T * G, D]`` matrix
and its scores one ``[T * G, P]`` matrix, computed and softmaxed in place without permute copies.
Scores stay in that layout ``[B, Hkv, tiles, T * G, P]`` end to end; ``score_mod`` and
``mask_mod`` see the usual ``[B, n, H, P]`` layout (views where the heads allow it).

The backward is explicit (FlashAttention's identities, with the forward's LSE): per block it
recomputes ``p = exp(s - lse)``, then ``ds = p * (dp - rowsum(do * o) + dlse)``; only a
``score_mod`` is differentiated by autograd, on its own. Memory per block is a few score-sized
buffers, as in the forward.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from haloattn.backend import AttentionInputs, recording_autograd
from haloattn.problem import Problem


def _heads(t: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[B, N, H, D] -> contiguous [B, Hkv, N, G, D]."""
    B, N, H, D = t.shape
    return t.view(B, N, kv_heads, H // kv_heads, D).permute(0, 2, 1, 3, 4).contiguous()


def _kv_heads(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """[B, N, Hkv, D] -> contiguous [B, Hkv, N, D]."""
    return None if t is None else t.permute(0, 2, 1, 3).contiguous()


def _rows_of(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t [B, Hkv, N, ...] -> [B, Hkv, len(index), ...]; index_select on a 3-D view (several times
    faster on CPUs than on dim 2 of a 4-D or 5-D tensor)."""
    B, Hkv, N = t.shape[:3]
    return t.reshape(B * Hkv, N, -1).index_select(1, index).view(B, Hkv, index.numel(), *t.shape[3:])


def _add_rows(t: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> None:
    """t[:, :, index] += src, t contiguous [B, Hkv, N, ...], src [B, Hkv, ...] holding
    ``len(index)`` rows (repeated indices accumulate); on a 3-D view, as :func:`_rows_of`."""
    B, Hkv, N = t.shape[:3]
    t.view(B * Hkv, N, -1).index_add_(1, index, src.reshape(B * Hkv, index.numel(), -1))


class Work:
    """One call's inputs in the head-major compute layout (``inputs`` already flattened to
    ``[B, N, heads, dim]`` in the compute dtype)."""

    def __init__(self, problem: Problem, inputs: AttentionInputs):
        self.problem = problem
        self.kv_heads = problem.kv_heads
        self.groups = problem.heads // problem.kv_heads
        q = inputs.query
        B, N, H, D = q.shape
        self.q = torch.empty(B, self.kv_heads, N, self.groups, D, dtype=q.dtype, device=q.device)
        torch.mul(q.view(B, N, self.kv_heads, self.groups, D).permute(0, 2, 1, 3, 4), problem.scale, out=self.q)
        self.k = _kv_heads(inputs.key)
        self.v = _kv_heads(inputs.value)
        self.rpb = None if inputs.rpb is None else inputs.rpb.reshape(problem.heads, -1)
        self.ak = _kv_heads(inputs.additional_keys)
        self.av = _kv_heads(inputs.additional_values)
        self.dtype = self.q.dtype


class _Block:
    """Per-block views and index tensors shared by the forward and the backward."""

    def __init__(self, work: Work, block):
        problem = work.problem
        self.block = block
        B, Hkv, G = problem.batch, work.kv_heads, work.groups
        c, T, P = block.tiles, block.per_tile, block.box
        self.shape6 = (B, Hkv, c, T, G, P)
        self.c, self.T, self.P, self.R = c, T, P, T * G
        device = work.q.device
        self.rows = block.rows
        self.key_flat = block.key_index.reshape(-1)
        keep = block.keep.view(c, T, 1, P)  # broadcasts over [B, Hkv, c, T, G, P]
        self.masked = ~keep
        self.keep_f = self.neg = None
        if not problem.has_mods:
            # the pattern mask as factors: -inf/0 to add for the row max, 0/1 to apply after exp
            self.keep_f = keep.to(work.dtype)
            self.neg = torch.zeros_like(self.keep_f).masked_fill_(self.masked, -math.inf)
        self.idx = None
        if problem.has_mods:
            b = torch.arange(B, device=device).view(-1, 1, 1, 1)
            h = torch.arange(problem.heads, device=device).view(1, 1, -1, 1)
            self.idx = (b, h, block.rows.view(1, -1, 1, 1))

    def gather_q(self, work: Work) -> torch.Tensor:
        return _rows_of(work.q, self.rows).view(*work.q.shape[:2], self.c, self.R, work.q.shape[-1])

    def gather_kv(self, t: torch.Tensor) -> torch.Tensor:
        return _rows_of(t, self.key_flat).view(*t.shape[:2], self.c, self.P, t.shape[-1])

    def rel_flat(self, problem: Problem) -> torch.Tensor:
        """Flat rpb-table index of every (row, key) pair, [n, P]."""
        flat = 0
        for r, K in zip(self.block.relative, problem.window):
            flat = flat * (2 * K - 1) + r
        return flat

    # layouts for score_mod / mask_mod: [B, Hkv, c, T, G, X] <-> [B, n, H, X]
    def to_rows(self, s6: torch.Tensor) -> torch.Tensor:
        B, Hkv, c, T, G, X = s6.shape
        return s6.permute(0, 2, 3, 1, 4, 5).reshape(B, c * T, Hkv * G, X)

    def to_heads(self, s4: torch.Tensor, X: int) -> torch.Tensor:
        B, Hkv, c, T, G, _ = self.shape6
        return s4.expand(B, c * T, Hkv * G, X).reshape(B, c, T, Hkv, G, X).permute(0, 3, 1, 2, 4, 5)


def _mask_mod(problem: Problem, blk: _Block, kv_idx, X: int) -> Optional[torch.Tensor]:
    """mask_mod's verdict as a bool tensor broadcasting to [B, Hkv, c, T, G, X], or None."""
    if problem.mask_mod is None:
        return None
    b, h, q_idx = blk.idx
    return blk.to_heads(problem.apply_mask_mod(b, h, q_idx, kv_idx), X)


class _Scores:
    """Scores of a block (grid keys and additional tokens), with what the backward needs."""

    def __init__(self, work: Work, blk: _Block, qt: torch.Tensor, kt: torch.Tensor, for_backward: bool):
        problem = work.problem
        B, Hkv, c, T, G, P = blk.shape6
        s = torch.matmul(qt, kt.transpose(-1, -2)).view(blk.shape6)  # [B, Hkv, c, T, G, P]
        self.rel = None
        if work.rpb is not None:
            self.rel = blk.rel_flat(problem)
            bias = work.rpb.index_select(1, self.rel.reshape(-1)).view(Hkv, G, c, T, P)
            s.add_(bias.permute(0, 2, 3, 1, 4))
        kv_idx = None
        if problem.has_mods:
            kv_idx = blk.block.kv_index.view(1, c * T, 1, P)
        self.grid = self._finish(problem, blk, s, kv_idx, P, for_backward)
        mask = blk.masked
        allowed = _mask_mod(problem, blk, kv_idx, P)
        if allowed is not None:
            mask = mask | ~allowed
        self.grid_mask = mask if blk.keep_f is None else None
        self.extra = None
        if problem.extra_tokens:
            E = problem.extra_tokens
            se = torch.matmul(qt, work.ak.unsqueeze(2).transpose(-1, -2)).view(B, Hkv, c, T, G, E)
            extra_idx = None
            if problem.has_mods:
                extra_idx = (problem.tokens + torch.arange(E, device=s.device)).view(1, 1, 1, -1)
            self.extra = self._finish(problem, blk, se, extra_idx, E, for_backward)
            allowed = _mask_mod(problem, blk, extra_idx, E)
            self.extra_mask = None if allowed is None else ~allowed
            if blk.block.padded:  # padding rows of ragged tiles see nothing
                padding = ~blk.block.row_valid.view(c, T, 1, 1)
                self.extra_mask = padding if self.extra_mask is None else self.extra_mask | padding

    @staticmethod
    def _finish(problem: Problem, blk: _Block, s: torch.Tensor, kv_idx, X: int, for_backward: bool):
        """score_mod and softcap on scores [B, Hkv, c, T, G, X] (scaled, rpb added).

        Returns (scores, pre, modded, tanh): ``pre`` the scores before score_mod (a leaf that
        requires grad, when there is a score_mod and ``for_backward``), ``modded`` score_mod's
        output, ``tanh`` the softcap's tanh (for its derivative)."""
        pre = modded = None
        if problem.score_mod is not None:
            b, h, q_idx = blk.idx
            if for_backward:
                pre = s.detach().requires_grad_(True)
                # not torch.enable_grad(): inside the haloattn::attention_backward custom op (torch.compile,
                # meta/fake tensors, dispatch modes) autograd's keys are excluded from dispatch, and
                # the score_mod's graph was not recorded (its gradient then failed)
                with recording_autograd():
                    modded = blk.to_heads(problem.apply_score_mod(blk.to_rows(pre), b, h, q_idx, kv_idx), X)
                s = modded.detach().clone(memory_format=torch.contiguous_format)
            else:
                s = blk.to_heads(problem.apply_score_mod(blk.to_rows(s), b, h, q_idx, kv_idx), X).contiguous()
        tanh = None
        if problem.softcap is not None:
            tanh = torch.tanh(s / problem.softcap)
            s = tanh * problem.softcap
        return s, pre, modded, tanh


def _masked_fill(s: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    if mask is not None:
        s.masked_fill_(mask, -math.inf)
    return s


# Scores per compute step on a CPU: blocks (bounded by attend.CHUNK_BYTES) are cut into steps
# of about this many bytes of scores, so that a step's buffers stay in cache (1 MiB measured
# best on a 2-core EPYC: 2x faster than whole blocks). Other devices run whole blocks (fewer,
# larger kernels).
STEP_BYTES = 2**20


def _parts(work: Work, blocks):
    problem = work.problem
    for block in blocks:
        tiles = block.tiles
        if work.q.device.type == "cpu":
            per_tile = problem.batch * problem.heads * block.per_tile * (block.box + problem.extra_tokens)
            tiles = max(1, STEP_BYTES // (per_tile * work.q.element_size()))
        yield from block.parts(tiles, problem.has_rpb, problem.has_mods)


def _grid_exp(blk: _Block, s: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """exp(s - shift) in place, masked pairs 0. ``shift`` >= every kept score of its row.

    Without mods the pattern mask is applied after the exp, as a 0/1 factor, and the exponent
    is clamped at 0 (kept pairs are <= 0 already, masked ones would overflow): a masked-fill
    with -inf costs several times more on CPUs, and so does exp(-inf or underflow)."""
    s.sub_(shift)
    if blk.keep_f is None:
        return s.exp_()
    return s.clamp_max_(0).exp_().mul_(blk.keep_f)


def forward_block(work: Work, blk: _Block):
    """Output [B, Hkv, c, T * G, Dv] and LSE [B, Hkv, c, T * G] of one block (compute dtype)."""
    qt = blk.gather_q(work)
    sc = _Scores(work, blk, qt, blk.gather_kv(work.k), for_backward=False)
    s = sc.grid[0]
    B, Hkv, c, T, G, P = blk.shape6
    if blk.keep_f is None:
        row_max = _masked_fill(s, sc.grid_mask).amax(dim=-1)
    else:
        row_max = torch.add(s, blk.neg).amax(dim=-1)
    se = None
    if sc.extra is not None:
        se = _masked_fill(sc.extra[0], sc.extra_mask)
        row_max = torch.maximum(row_max, se.amax(dim=-1))
    row_max.masked_fill_(row_max == -math.inf, 0.0)
    s = _grid_exp(blk, s, row_max.unsqueeze(-1))
    total = s.sum(dim=-1)
    out = torch.matmul(s.view(B, Hkv, c, blk.R, P), blk.gather_kv(work.v))
    if se is not None:
        se.sub_(row_max.unsqueeze(-1)).exp_()
        total += se.sum(dim=-1)
        out += torch.matmul(se.view(B, Hkv, c, blk.R, -1), work.av.unsqueeze(2))
    lse = total.log().add_(row_max)  # log(0) = -inf for rows with no key
    out.div_(total.masked_fill_(total == 0, 1.0).view(B, Hkv, c, blk.R, 1))
    return out, lse.view(B, Hkv, c, blk.R)


def _write_rows(dest: torch.Tensor, block, src: torch.Tensor) -> None:
    """dest [B, N, Hkv, G, ...] (rows = grid tokens) <- src [B, Hkv, c, T * G, ...], a block's
    rows head-major; padding rows of ragged tiles are left out."""
    B, N, Hkv, G = dest.shape[:4]
    rows = block.rows
    src = src.reshape(B, Hkv, rows.numel(), G, -1).transpose(1, 2)  # [B, n, Hkv, G, X]
    if block.padded:
        positions = block.row_valid.nonzero().squeeze(1)
        src, rows = src.index_select(1, positions), rows.index_select(0, positions)
    dest.view(B, N, Hkv, -1).index_copy_(1, rows, src.flatten(3).to(dest.dtype))


def forward(problem: Problem, work: Work, blocks, out_dtype, lse_dtype):
    """Every block; returns out [B, N, H, Dv] (``out_dtype``) and lse [B, N, H] (``lse_dtype``)."""
    B, N, H, Hkv, G = problem.batch, problem.tokens, problem.heads, work.kv_heads, work.groups
    out = torch.empty(B, N, H, problem.value_dim, dtype=out_dtype, device=work.q.device)
    lse = torch.empty(B, N, H, dtype=lse_dtype, device=work.q.device)
    for block in _parts(work, blocks):
        blk = _Block(work, block)
        o, l = forward_block(work, blk)
        _write_rows(out.view(B, N, Hkv, G, -1), block, o)
        _write_rows(lse.view(B, N, Hkv, G, 1), block, l)
    return out, lse


def _score_grad(part, ds: torch.Tensor) -> torch.Tensor:
    """Chain ds (w.r.t. the final scores) back through softcap and score_mod."""
    _, pre, modded, tanh = part
    if tanh is not None:
        ds = ds * (1 - tanh * tanh)
    if modded is not None:
        (ds,) = torch.autograd.grad(modded, pre, ds)
    return ds


def backward(problem: Problem, work: Work, blocks, out, lse, grad_out, grad_lse, needs_grad):
    """Gradients (compute dtype, flattened layouts [B, N, heads, dim]) of every input in
    ``needs_grad`` order; None where not needed."""
    B, N, H, Hkv, G = problem.batch, problem.tokens, problem.heads, work.kv_heads, work.groups
    dtype, device = work.dtype, work.q.device
    do = _heads(grad_out.reshape(B, N, H, -1).to(dtype), Hkv)  # [B, Hkv, N, G, Dv]
    lse_h = lse.reshape(B, N, Hkv, G).to(dtype).permute(0, 2, 1, 3)  # [B, Hkv, N, G]
    finite = torch.isfinite(lse_h)
    lse_h = lse_h.masked_fill(~finite, 0.0).contiguous()  # never in place: lse is the caller's
    # rowsum(do * o) - dlse: out is exact in the compute dtype unless the inputs are 16-bit
    exact_out = out.dtype == dtype
    delta = None
    if exact_out:
        delta = (grad_out.reshape(B, N, H, -1).to(dtype) * out.reshape(B, N, H, -1)).sum(-1)
        delta = delta.view(B, N, Hkv, G).permute(0, 2, 1, 3).contiguous()  # [B, Hkv, N, G]
    minus = None
    if grad_lse is not None:
        minus = grad_lse.reshape(B, N, Hkv, G).to(dtype).permute(0, 2, 1, 3).masked_fill(~finite, 0.0).contiguous()
        delta = -minus if delta is None else delta - minus

    need_q, need_k, need_v, need_rpb, _, need_ak, need_av = (bool(x) for x in needs_grad)
    D, Dv = work.q.shape[-1], work.v.shape[-1]
    dq = torch.zeros(B, N, H, D, dtype=dtype, device=device) if need_q else None
    dk = torch.zeros_like(work.k) if need_k else None
    dv = torch.zeros_like(work.v) if need_v else None
    drpb = torch.zeros_like(work.rpb) if need_rpb and work.rpb is not None else None
    dak = torch.zeros_like(work.ak) if need_ak and work.ak is not None else None
    dav = torch.zeros_like(work.av) if need_av and work.av is not None else None

    for block in _parts(work, blocks):
        blk = _Block(work, block)
        c, R, P = blk.c, blk.R, blk.P
        qt = blk.gather_q(work)
        kt = blk.gather_kv(work.k)
        vt = blk.gather_kv(work.v)
        sc = _Scores(work, blk, qt, kt, for_backward=True)
        l = _rows_of(lse_h, blk.rows).view(B, Hkv, c, blk.T, G, 1)
        dot = _rows_of(do, blk.rows).view(B, Hkv, c, R, Dv)
        p = _grid_exp(blk, _masked_fill(sc.grid[0], sc.grid_mask), l)  # [B, Hkv, c, T, G, P]
        pe = None
        if sc.extra is not None:
            pe = _masked_fill(sc.extra[0], sc.extra_mask).sub_(l).exp_()
        if exact_out:
            dl = _rows_of(delta, blk.rows).view(B, Hkv, c, blk.T, G, 1)
        else:
            o = torch.matmul(p.view(B, Hkv, c, R, P), vt)
            if pe is not None:
                o += torch.matmul(pe.view(B, Hkv, c, R, -1), work.av.unsqueeze(2))
            dl = (dot * o).sum(-1).view(B, Hkv, c, blk.T, G, 1)
            if minus is not None:
                dl = dl - _rows_of(minus, blk.rows).view(B, Hkv, c, blk.T, G, 1)
        # grid keys
        ds = torch.matmul(dot, vt.transpose(-1, -2)).view(blk.shape6)
        ds.sub_(dl).mul_(p)
        if dv is not None:
            _add_rows(dv, blk.key_flat, torch.matmul(p.view(B, Hkv, c, R, P).transpose(-1, -2), dot))
        ds = _score_grad(sc.grid, ds)
        if drpb is not None:
            per_head = ds.sum(0).permute(0, 3, 1, 2, 4).reshape(H, -1)  # [H, n * P]
            drpb.index_add_(1, sc.rel.reshape(-1), per_head)
        ds = ds.reshape(B, Hkv, c, R, P)
        dqt = torch.matmul(ds, kt) if dq is not None else None
        if dk is not None:
            _add_rows(dk, blk.key_flat, torch.matmul(ds.transpose(-1, -2), qt))
        # additional tokens
        if pe is not None:
            E = pe.shape[-1]
            dse = torch.matmul(dot, work.av.unsqueeze(2).transpose(-1, -2)).view(B, Hkv, c, blk.T, G, E)
            dse.sub_(dl).mul_(pe)
            if dav is not None:
                dav += torch.matmul(pe.reshape(B, Hkv, c * R, E).transpose(-1, -2), dot.reshape(B, Hkv, c * R, Dv))
            dse = _score_grad(sc.extra, dse).reshape(B, Hkv, c, R, E)
            if dqt is not None:
                dqt += torch.matmul(dse, work.ak.unsqueeze(2))
            if dak is not None:
                dak += torch.matmul(dse.reshape(B, Hkv, c * R, E).transpose(-1, -2), qt.reshape(B, Hkv, c * R, D))
        if dq is not None:
            _write_rows(dq.view(B, N, Hkv, G, D), block, dqt)

    scale = problem.scale
    grads = [None] * 7
    if dq is not None:
        grads[0] = dq.mul_(scale)
    if dk is not None:
        grads[1] = dk.permute(0, 2, 1, 3)
    if dv is not None:
        grads[2] = dv.permute(0, 2, 1, 3)
    if drpb is not None:
        grads[3] = drpb
    if dak is not None:
        grads[5] = dak.permute(0, 2, 1, 3)  # the query was scaled already
    if dav is not None:
        grads[6] = dav.permute(0, 2, 1, 3)
    return grads
