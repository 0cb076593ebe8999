"""The reference backend's forward-mode AD on query tiles, explicit (as the tiled backward is).

With the forward's LSE, per block: ``p = exp(s - lse)``, the scores' tangent
``ds = (scale (dq k^T + q dk^T) + d rpb)`` through softcap's ``1 - tanh^2``, then
``d lse = rowsum(p ds)`` and ``d out = (p ds) v + p dv - d lse * out`` (and the same over the
additional tokens), with ``out`` recomputed in the compute dtype. Problems with a ``score_mod``
(a user function to differentiate) or a key-query convolution take jvp.py's general rule instead.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from haloattn.backend import AttentionInputs
from haloattn.problem import Problem

from .tiled import Work, _Block, _grid_exp, _heads, _kv_heads, _masked_fill, _parts, _rows_of, _Scores, _write_rows


def covers(problem: Problem) -> bool:
    return problem.score_mod is None and problem.kq_conv_shape is None


def _directions(problem: Problem, tangents: AttentionInputs) -> SimpleNamespace:
    """The tangents in Work's head-major layouts (the query's scaled as Work scales the query)."""
    q = tangents.query
    return SimpleNamespace(
        q=None if q is None else _heads(q * problem.scale, problem.kv_heads),
        k=_kv_heads(tangents.key), v=_kv_heads(tangents.value), ak=_kv_heads(tangents.additional_keys),
        av=_kv_heads(tangents.additional_values),
        rpb=None if tangents.rpb is None else tangents.rpb.reshape(problem.heads, -1),
    )


def _score_tangent(qt, kt, t_qt, t_kt, shape, bias: Optional[torch.Tensor], tanh) -> Optional[torch.Tensor]:
    """d(scores), laid out as ``shape``, of a block's rows against keys ``kt``: dq k^T + q dk^T
    (+ d rpb), through softcap's 1 - tanh^2; None where nothing moves the scores."""
    ds = None
    if t_qt is not None:
        ds = torch.matmul(t_qt, kt.transpose(-1, -2))
    if t_kt is not None:
        product = torch.matmul(qt, t_kt.transpose(-1, -2))
        ds = product if ds is None else ds.add_(product)
    if ds is not None:
        ds = ds.view(shape)
    if bias is not None:
        ds = bias.expand(shape) if ds is None else ds.add_(bias)
    if ds is not None and tanh is not None:
        ds = ds * (1 - tanh * tanh)
    return ds


def jvp(problem: Problem, work: Work, tangents: AttentionInputs, blocks, lse, out_dtype, lse_dtype):
    """(d out [B, N, H, Dv], d lse [B, N, H]) for ``tangents`` (flattened, compute dtype)."""
    B, N, H, Hkv, G = problem.batch, problem.tokens, problem.heads, work.kv_heads, work.groups
    t = _directions(problem, tangents)
    lse_h = lse.reshape(B, N, Hkv, G).to(work.dtype).permute(0, 2, 1, 3)
    lse_h = lse_h.masked_fill(~torch.isfinite(lse_h), 0.0).contiguous()  # rows that saw nothing: p = 0
    t_out = torch.empty(B, N, H, problem.value_dim, dtype=out_dtype, device=work.q.device)
    t_lse = torch.empty(B, N, H, dtype=lse_dtype, device=work.q.device)
    for block in _parts(work, blocks):
        blk = _Block(work, block)
        d_out, d_lse = _block_jvp(problem, work, t, blk, lse_h)
        _write_rows(t_out.view(B, N, Hkv, G, -1), block, d_out)
        _write_rows(t_lse.view(B, N, Hkv, G, 1), block, d_lse)
    return t_out, t_lse


def _block_jvp(problem: Problem, work: Work, t: SimpleNamespace, blk: _Block, lse_h: torch.Tensor):
    B, Hkv, c, T, G, P = blk.shape6
    R = blk.R
    qt, kt, vt = blk.gather_q(work), blk.gather_kv(work.k), blk.gather_kv(work.v)
    t_qt = None if t.q is None else _rows_of(t.q, blk.rows).view(qt.shape)
    sc = _Scores(work, blk, qt, kt, for_backward=True)
    l = _rows_of(lse_h, blk.rows).view(B, Hkv, c, T, G, 1)
    p = _grid_exp(blk, _masked_fill(sc.grid[0], sc.grid_mask), l)  # [B, Hkv, c, T, G, P]
    p_rows = p.view(B, Hkv, c, R, P)
    out = torch.matmul(p_rows, vt)
    bias = None
    if t.rpb is not None:
        bias = t.rpb.index_select(1, sc.rel.reshape(-1)).view(Hkv, G, c, T, P).permute(0, 2, 3, 1, 4)
    ds = _score_tangent(qt, kt, t_qt, None if t.k is None else blk.gather_kv(t.k), blk.shape6, bias, sc.grid[3])
    t_lse = torch.zeros(B, Hkv, c, T, G, dtype=p.dtype, device=p.device)
    t_out = torch.zeros_like(out)
    if ds is not None:
        pds = p * ds
        t_lse += pds.sum(-1)
        t_out += torch.matmul(pds.view(B, Hkv, c, R, P), vt)
    if t.v is not None:
        t_out += torch.matmul(p_rows, blk.gather_kv(t.v))
    if sc.extra is not None:
        pe = _masked_fill(sc.extra[0], sc.extra_mask).sub_(l).exp_()  # [B, Hkv, c, T, G, E]
        E = pe.shape[-1]
        pe_rows = pe.view(B, Hkv, c, R, E)
        av = work.av.unsqueeze(2)
        out += torch.matmul(pe_rows, av)
        dse = _score_tangent(qt, work.ak.unsqueeze(2), t_qt, None if t.ak is None else t.ak.unsqueeze(2), pe.shape,
                             None, sc.extra[3])
        if dse is not None:
            pdse = pe * dse
            t_lse += pdse.sum(-1)
            t_out += torch.matmul(pdse.view(B, Hkv, c, R, E), av)
        if t.av is not None:
            t_out += torch.matmul(pe_rows, t.av.unsqueeze(2))
    t_lse = t_lse.view(B, Hkv, c, R)
    t_out -= t_lse.unsqueeze(-1) * out
    return t_out, t_lse
