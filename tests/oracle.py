"""An independent float64 oracle of SEMANTICS.md for small problems.

Written from the contract's text alone (no haloattn code): the attention pattern is decided pair by
pair with plain Python loops, then dense attention runs over the full N x N score matrix in
float64. Slow and quadratic on purpose: only for the tiny problems tests use.
"""

from __future__ import annotations

import itertools
import math

import torch


def _axis_attends(L, K, S, Dl, causal, i, j):
    if j % Dl != i % Dl:
        return False
    g = i % Dl
    x, y = i // Dl, j // Dl
    Lg = -(-(L - g) // Dl)
    if causal:
        leader = min((x // S) * S + S - 1, Lg - 1)
        return max(leader - K + 1, 0) <= y <= x
    leader = min((x // S) * S + S // 2, Lg - 1)
    start = min(max(leader - K // 2, 0), Lg - K)
    return start <= y < start + K


def _axis_window(W, s, Dl, causal, i, j):
    if j % Dl != i % Dl:
        return False
    x, y = i // Dl, j // Dl

    def wid(c):
        return (c + W - s) // W if s > 0 else c // W

    return wid(x) == wid(y) and (not causal or y <= x)


def _per_axis(v, rank):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * rank


def pattern_mask(spatial, window, stride=1, dilation=1, causal=False, pattern="neighborhood", shift=0):
    """[N, N] bool: query token (row) attends key token (column)."""
    rank = len(spatial)
    K, S, Dl, C, s = (_per_axis(v, rank) for v in (window, stride, dilation, causal, shift))
    coords = list(itertools.product(*(range(L) for L in spatial)))
    N = len(coords)
    mask = torch.zeros(N, N, dtype=torch.bool)
    for qi, qc in enumerate(coords):
        for ki, kc in enumerate(coords):
            ok = True
            for a in range(rank):
                if pattern == "window":
                    ok = _axis_window(K[a], s[a], Dl[a], C[a], qc[a], kc[a])
                else:
                    ok = _axis_attends(spatial[a], K[a], S[a], Dl[a], C[a], qc[a], kc[a])
                if not ok:
                    break
            mask[qi, ki] = ok
    return mask


def attention(
    query, key, value, window, *, stride=1, dilation=1, causal=False, pattern="neighborhood", shift=0,
    scale=None, softcap=None, rpb=None, score_mod=None, mask_mod=None, kq_conv=None,
    additional_keys=None, additional_values=None, compute_dtype=torch.float64,
):
    """Returns (out, lse) in float64, or in compute_dtype if given. Inputs in any dtype (cast
    first). A float32 run is a plain float32 computation of the contract: its distance from the
    float64 run is the rounding floor of a problem, which tests use where a result is
    ill-conditioned (a gradient that is a small sum of cancelling terms)."""
    s, keep4, vf, shape = _scores(
        query, key, value, window, stride=stride, dilation=dilation, causal=causal, pattern=pattern, shift=shift,
        scale=scale, softcap=softcap, rpb=rpb, score_mod=score_mod, mask_mod=mask_mod, kq_conv=kq_conv,
        additional_keys=additional_keys, additional_values=additional_values, compute_dtype=compute_dtype)
    p, lse = _softmax(s, keep4)
    out = p @ vf  # empty rows: 0
    return _grid_layout(out, shape), _grid_layout(lse, shape)


def _softmax(s, keep4):
    """(probabilities, lse) of masked scores [B, H, N, keys]; rows with no key: p 0, lse -inf."""
    s = torch.where(keep4, s, torch.full((), -math.inf, dtype=s.dtype))
    lse = torch.logsumexp(s, dim=-1)  # -inf for empty rows
    p = torch.where(keep4, torch.exp(s - torch.where(torch.isfinite(lse), lse, 0).unsqueeze(-1)), 0.0)
    return p, lse


def _grid_layout(t, shape):
    """[B, H, N(, C)] -> [B, *spatial, H(, C)]."""
    B, spatial, H = shape
    t = t.transpose(1, 2)
    return t.reshape(B, *spatial, H, *t.shape[3:])


def _scores(
    query, key, value, window, *, stride, dilation, causal, pattern, shift,
    scale, softcap, rpb, score_mod, mask_mod, kq_conv, additional_keys, additional_values, compute_dtype,
):
    """(scores, kept pairs, values) as [B, H, N, keys], [B, H, N, keys], [B, H, keys, Dv]; the keys
    are the grid's N tokens, then the additional ones; plus (B, spatial, H)."""
    q, k, v = (t.to(compute_dtype) for t in (query, key, value))
    B, *spatial, H, D = q.shape
    Hkv, Dv = k.shape[-2], v.shape[-1]
    rank = len(spatial)
    N = math.prod(spatial)
    G = H // Hkv
    K = _per_axis(window, rank)
    Dl = _per_axis(dilation, rank)
    scale = D ** -0.5 if scale is None else scale
    keep = pattern_mask(spatial, window, stride, dilation, causal, pattern, shift)

    qf = q.reshape(B, N, H, D).permute(0, 2, 1, 3)  # B H N D
    kf = k.reshape(B, N, Hkv, D).permute(0, 2, 1, 3).repeat_interleave(G, dim=1)
    vf = v.reshape(B, N, Hkv, Dv).permute(0, 2, 1, 3).repeat_interleave(G, dim=1)
    raw = scale * qf @ kf.transpose(-1, -2)  # B H N N

    b_idx = torch.arange(B).view(B, 1, 1, 1)
    h_idx = torch.arange(H).view(1, H, 1, 1)
    q_idx = torch.arange(N).view(1, 1, N, 1)
    kv_idx = torch.arange(N).view(1, 1, 1, N)
    keep4 = keep.view(1, 1, N, N).expand(B, H, N, N)
    if mask_mod is not None:
        keep4 = keep4 & torch.as_tensor(mask_mod(b_idx, h_idx, q_idx, kv_idx)).bool()

    s = raw
    if kq_conv is not None:
        W = kq_conv.to(compute_dtype)
        c_q, c_k = W.shape[1:]
        S0 = torch.where(keep4, raw, torch.zeros((), dtype=raw.dtype))
        C = torch.zeros_like(S0)
        for a in range(c_q):
            for t in range(c_k):
                di = -(c_q - 1) + a
                dj = -(c_k - 1) // 2 + t
                shifted = torch.zeros_like(S0)
                # shifted[i, j] = S0[i + di, j + dj] where in range
                i0, i1 = max(0, -di), min(N, N - di)
                j0, j1 = max(0, -dj), min(N, N - dj)
                if i0 < i1 and j0 < j1:
                    shifted[..., i0:i1, j0:j1] = S0[..., i0 + di:i1 + di, j0 + dj:j1 + dj]
                C = C + W[:, a, t].view(1, H, 1, 1) * shifted
        s = C
    if rpb is not None:
        # bias[h, q, k] = rpb[h, kc // Dl - qc // Dl + K - 1] per axis, on attended pairs. One
        # gather: assigning pair by pair made one autograd node per pair, and their backward
        # (tens of thousands of full-size gradient copies) grew the CPU suite's process to
        # 12-23 GB in some runs (most likely glibc's heap fragmenting; 2026-11-29).
        coords = torch.tensor(list(itertools.product(*(range(L) for L in spatial)))).view(N, rank)
        idx = [(coords[None, :, a] // Dl[a] - coords[:, None, a] // Dl[a] + K[a] - 1) for a in range(rank)]
        idx = [torch.where(keep, i, 0) for i in idx]  # pairs outside the window index a valid cell, then masked
        bias = torch.where(keep, rpb.to(compute_dtype)[(slice(None), *idx)], torch.zeros((), dtype=compute_dtype))
        s = s + bias.unsqueeze(0)
    if score_mod is not None:
        s = score_mod(s, b_idx, h_idx, q_idx, kv_idx).to(s.dtype)  # kept in the computation's dtype

    if additional_keys is not None:
        ak = additional_keys.to(compute_dtype).permute(0, 2, 1, 3).repeat_interleave(G, dim=1)
        av = additional_values.to(compute_dtype).permute(0, 2, 1, 3).repeat_interleave(G, dim=1)
        E = ak.shape[2]
        se = scale * qf @ ak.transpose(-1, -2)
        e_idx = (N + torch.arange(E)).view(1, 1, 1, E)
        if score_mod is not None:
            se = score_mod(se, b_idx, h_idx, q_idx, e_idx).to(se.dtype)
        keep_e = torch.ones(B, H, N, E, dtype=torch.bool)
        if mask_mod is not None:
            keep_e = keep_e & torch.as_tensor(mask_mod(b_idx, h_idx, q_idx, e_idx)).bool()
        s = torch.cat([s, se], dim=-1)
        keep4 = torch.cat([keep4, keep_e], dim=-1)
        vf = torch.cat([vf, av], dim=2)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    return s, keep4, vf, (B, spatial, H)


_PATTERN_DEFAULTS = dict(stride=1, dilation=1, causal=False, pattern="neighborhood", shift=0)
_OPTIONAL_INPUTS = ("scale", "softcap", "rpb", "score_mod", "mask_mod", "kq_conv", "additional_keys",
                    "additional_values")

# float32's unit roundoff: the largest relative error of one rounding
FLOAT32_UNIT_ROUNDOFF = 2.0 ** -24


def gradient_rounding_floor(query, key, value, window, grad_out, grad_lse, leaves, *, seed=0,
                            unit_roundoff=FLOAT32_UNIT_ROUNDOFF, **kw):
    """Per leaf, the gradient error that rounding in a backward of the usual form leaves (None for
    a leaf the scores do not reach): a model, for gradients whose exact value cancels.

    A backward forms dS = P (dP - delta + grad_lse), with dP = dO V^T and delta = rowsum(dO O) summed
    in different orders and P recomputed from a stored LSE. Where a row's softmax holds one key,
    dP and delta are equal in exact arithmetic and dS is 0, yet rounding leaves about u |dO| |V| in
    their difference. The plain float32 run of ``attention`` may round both alike and cancel exactly,
    so its distance from float64 can miss this. Here each score's rounding is modelled as
    u (P (|dO| |V|^T + rowsum|dO O| + |grad_lse|) + (|s| + |lse| + 1) |dS|) with a random sign, carried
    to the leaves by the exact chain rule (softcap, mods, rpb and kq_conv included)."""
    unknown = set(kw) - set(_PATTERN_DEFAULTS) - set(_OPTIONAL_INPUTS)
    if unknown:
        raise TypeError(f"gradient_rounding_floor: unknown arguments {sorted(unknown)}")
    s, keep4, vf, (B, spatial, H) = _scores(
        query, key, value, window, **{name: kw.get(name) for name in _OPTIONAL_INPUTS},
        **{name: kw.get(name, default) for name, default in _PATTERN_DEFAULTS.items()}, compute_dtype=torch.float64)
    with torch.no_grad():
        p, lse = _softmax(s, keep4)
        out = p @ vf
        d_out = grad_out.double().reshape(B, -1, H, vf.shape[-1]).transpose(1, 2)
        g_lse = (grad_lse.double().reshape(B, -1, H).transpose(1, 2) if grad_lse is not None
                 else torch.zeros_like(lse)).unsqueeze(-1)
        delta = (d_out * out).sum(-1, keepdim=True)
        d_scores = p * (d_out @ vf.transpose(-1, -2) - delta + g_lse)
        magnitude = p * (d_out.abs() @ vf.abs().transpose(-1, -2) + (d_out * out).abs().sum(-1, keepdim=True)
                         + g_lse.abs())
        finite_lse = torch.where(torch.isfinite(lse), lse, 0).abs().unsqueeze(-1)
        magnitude = magnitude + (torch.where(keep4, s, 0).abs() + finite_lse + 1) * d_scores.abs()
        signs = torch.randn(magnitude.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).sign()
        seed_scores = torch.where(keep4, unit_roundoff * magnitude * signs, 0.0)
    return list(torch.autograd.grad(s, leaves, seed_scores, allow_unused=True))


def rel_error(x, ref):
    """||x - ref|| / ||ref||, in float64; NaN anywhere gives inf."""
    x, ref = x.double(), ref.double()
    if torch.isnan(x).any():
        return math.inf
    denom = ref.norm().item()
    diff = (x - ref).norm().item()
    return diff / denom if denom > 0 else diff


def rounding_share(floor, ref):
    """``gradient_rounding_floor``'s size for one leaf relative to the exact gradient (0 for None)."""
    if floor is None:
        return 0.0
    denom = ref.double().norm().item()
    return floor.norm().item() / denom if denom > 0 else floor.norm().item()


TOLERANCE = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.5e-2,
}
LSE_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}
