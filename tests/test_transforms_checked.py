"""Autodiff and torch.func transforms against an independent float64 oracle: a dense masked
computation written from SEMANTICS.md sections 3 and 5 (neither the reference backend nor
tests/oracle.py), differentiated and transformed by torch itself."""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import forward_ad

import haloattn

# torch.func's first use scripts helpers with torch.jit, which torch 2.13 reports as deprecated.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script:DeprecationWarning")

F64 = torch.float64
TOL = 1e-10  # SEMANTICS.md section 7, float64


def _axis_keep(L, K, S, causal):
    """[L, L] keep of SEMANTICS.md section 3 (neighbourhood, dilation 1)."""
    keep = torch.zeros(L, L, dtype=torch.bool)
    for x in range(L):
        if causal:
            leader = min((x // S) * S + S - 1, L - 1)
            lo, hi = max(leader - K + 1, 0), x + 1
        else:
            leader = min((x // S) * S + S // 2, L - 1)
            lo = min(max(leader - K // 2, 0), L - K)
            hi = lo + K
        keep[x, lo:hi] = True
    return keep


def dense_attention(q, k, v, window, *, stride=1, causal=False, softcap=None, score_mod=None, mask_mod=None,
                    additional_keys=None, additional_values=None, return_lse=False):
    """Rank 1, dense: [B, L, H, D] inputs, every score of the grid, masked (SEMANTICS.md 3, 5)."""
    B, L, H, D = q.shape
    G = H // k.shape[2]
    keep = _axis_keep(L, window, stride, causal).view(1, 1, L, L)
    b, h = torch.arange(B).view(-1, 1, 1, 1), torch.arange(H).view(1, -1, 1, 1)
    q_idx, kv_idx = torch.arange(L).view(1, 1, -1, 1), torch.arange(L).view(1, 1, 1, -1)
    keys, values = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
    if additional_keys is not None:
        E = additional_keys.shape[1]
        keys = torch.cat([keys, additional_keys.repeat_interleave(G, dim=2)], 1)
        values = torch.cat([values, additional_values.repeat_interleave(G, dim=2)], 1)
        keep = torch.cat([keep, torch.ones(1, 1, L, E, dtype=torch.bool)], -1)
        kv_idx = torch.arange(L + E).view(1, 1, 1, -1)
    s = torch.einsum("bihd,bjhd->bhij", q, keys) * D ** -0.5
    if score_mod is not None:
        s = score_mod(s, b, h, q_idx, kv_idx)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if mask_mod is not None:
        keep = keep & mask_mod(b, h, q_idx, kv_idx)
    s = torch.where(keep, s, torch.full_like(s, -math.inf))
    top = s.amax(-1, keepdim=True).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.exp(s - top)
    total = e.sum(-1, keepdim=True)
    empty = total == 0
    safe = torch.where(empty, torch.ones_like(total), total)
    out = torch.einsum("bhij,bjhd->bihd", e / safe, values)
    lse = torch.where(empty, torch.full_like(total, -math.inf), top + torch.log(safe)).squeeze(-1).transpose(1, 2)
    return (out, lse) if return_lse else out


def rel_error(ours, ref):
    assert not torch.isnan(ours).any()
    return ((ours - ref).norm() / ref.norm()).item()


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=F64)


# mods that read the batch index b (per-sample masks and biases), beside h and the token indices
def batch_score_mod(score, b, h, q_idx, kv_idx):
    return score * (1 + 0.1 * h) + 0.3 * b - 0.05 * torch.cos(score) * ((kv_idx - q_idx) % 5)


def batch_mask_mod(b, h, q_idx, kv_idx):
    return ((3 * q_idx + kv_idx + h + 2 * b) % 5 != 0) & ~((q_idx == 3) & (b == 1))


def _call(attention, k, v, **extra):
    options = dict(stride=2, softcap=2.5, score_mod=batch_score_mod, mask_mod=batch_mask_mod, return_lse=True)
    return lambda q: attention(q, k, v, 4, **options, **extra)


def _finite(out_lse):
    out, lse = out_lse
    return out, torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))


def test_vmap_transforms_keep_the_batch_index_mods_see():
    """vmap folds the vmapped dimension into the batch; the mods of the folded call saw batch
    indices v * B + b instead of b (vmap, vmap over grad and jacrev / jacfwd, which vmap the
    rules, were all wrong for a mod reading b)."""
    gen = torch.Generator().manual_seed(0)
    B, L, H, Hkv = 2, 9, 4, 2
    q = randn(gen, 3, B, L, H, 3)
    k, v = randn(gen, B, L, Hkv, 3), randn(gen, B, L, Hkv, 2)
    ak, av = randn(gen, B, 2, Hkv, 3), randn(gen, B, 2, Hkv, 2)
    ours = _call(haloattn.attention, k, v, additional_keys=ak, additional_values=av, backend="reference")
    ref = _call(dense_attention, k, v, additional_keys=ak, additional_values=av)

    for o, r in zip(torch.func.vmap(ours)(q), torch.func.vmap(ref)(q)):
        assert rel_error(torch.nan_to_num(o, neginf=0.0), torch.nan_to_num(r, neginf=0.0)) <= TOL

    grad_out, grad_lse = randn(gen, 3, B, L, H, 2), randn(gen, 3, B, L, H)

    def per_sample(call):
        def loss(q, key, g_out, g_lse):
            out, lse = _finite(_call(call, key, v, additional_keys=ak, additional_values=av,
                                     **({"backend": "reference"} if call is haloattn.attention else {}))(q))
            return (out * g_out).sum() + (lse * g_lse).sum()
        return torch.func.vmap(torch.func.grad(loss, argnums=(0, 1)), in_dims=(0, None, 0, 0))

    for o, r in zip(per_sample(haloattn.attention)(q, k, grad_out, grad_lse),
                    per_sample(dense_attention)(q, k, grad_out, grad_lse)):
        assert rel_error(o, r) <= TOL

    for jacobian in (torch.func.jacrev, torch.func.jacfwd):
        ours_jac = jacobian(lambda q: _finite(ours(q)))(q[0])
        ref_jac = jacobian(lambda q: _finite(ref(q)))(q[0])
        for o, r in zip(ours_jac, ref_jac):
            assert rel_error(o, r) <= TOL, jacobian.__name__


def test_nested_vmap_of_a_mod_reading_the_batch_index():
    gen = torch.Generator().manual_seed(1)
    q = randn(gen, 2, 3, 2, 7, 4, 4)
    k, v = randn(gen, 2, 7, 2, 4), randn(gen, 2, 7, 2, 3)
    ours = torch.func.vmap(torch.func.vmap(_call(haloattn.attention, k, v, backend="reference")))(q)
    ref = torch.func.vmap(torch.func.vmap(_call(dense_attention, k, v)))(q)
    for o, r in zip(_finite(ours), _finite(ref)):
        assert rel_error(o, r) <= TOL


def test_a_score_mod_reading_a_tensor_with_a_tangent_is_refused():
    """Captured tensors are constants; one carrying a forward-mode tangent had its tangent
    dropped without a word (torch.func.jvp over the query and the tensor gave the query's share
    alone), as one requiring grad would have its gradient, which is refused."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = randn(gen, 1, 8, 2, 4), randn(gen, 1, 8, 2, 4), randn(gen, 1, 8, 2, 4)
    table, t_q, t_table = randn(gen, 2), randn(gen, 1, 8, 2, 4), randn(gen, 2)

    def call(attention, **extra):
        return lambda q, table: attention(q, k, v, 3, score_mod=lambda s, b, h, qi, ki: s + table[h] * (ki - qi),
                                          **extra)

    # a plain captured tensor is a constant: the query's tangent alone, as the oracle's
    _, ours = torch.func.jvp(lambda q: call(haloattn.attention, backend="reference")(q, table), (q,), (t_q,))
    _, ref = torch.func.jvp(lambda q: call(dense_attention)(q, table), (q,), (t_q,))
    assert rel_error(ours, ref) <= TOL
    with pytest.raises(ValueError, match="score_mod reads a tensor that carries a forward-mode tangent"):
        torch.func.jvp(call(haloattn.attention), (q, table), (t_q, t_table))
    with pytest.raises(ValueError, match="forward-mode tangent"), forward_ad.dual_level():
        call(haloattn.attention)(q, forward_ad.make_dual(table, t_table))


@pytest.mark.parametrize("batched_q", [False, True])
def test_mods_reading_a_vmapped_tensor_are_refused_by_name(batched_q):
    """A mod reading a tensor that vmap batches (per-sample lengths) failed deep inside torch
    with vmap errors, one asking for a torch bug report."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = randn(gen, 2, 8, 2, 4), randn(gen, 2, 8, 2, 4), randn(gen, 2, 8, 2, 4)
    lengths, tables = torch.tensor([[5, 7], [3, 8], [6, 6]]), randn(gen, 3, 2)
    queries = randn(gen, 3, 2, 8, 2, 4) if batched_q else q
    in_dims = (0 if batched_q else None, 0)
    mask = torch.func.vmap(lambda q, n: haloattn.attention(q, k, v, 3, mask_mod=lambda b, h, qi, ki: ki < n[b]),
                           in_dims=in_dims)
    with pytest.raises(ValueError, match="mask_mod reads a tensor that torch.func.vmap batches"):
        mask(queries, lengths)
    score = torch.func.vmap(lambda q, t: haloattn.attention(q, k, v, 3, score_mod=lambda s, b, h, qi, ki: s + t[h]),
                            in_dims=in_dims)
    with pytest.raises(ValueError, match="score_mod reads a tensor that torch.func.vmap batches"):
        score(queries, tables)
    # mods reading plain tensors still run under vmap
    fixed = lengths[0]
    ours = torch.func.vmap(lambda q: haloattn.attention(q, k, v, 3, mask_mod=lambda b, h, qi, ki: ki < fixed[b],
                                                        backend="reference"))(queries if batched_q else q[None])
    ref = torch.func.vmap(lambda q: dense_attention(q, k, v, 3, mask_mod=lambda b, h, qi, ki: ki < fixed[b]))(
        queries if batched_q else q[None])
    assert rel_error(ours, ref) <= TOL
