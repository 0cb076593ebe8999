"""score_mod, mask_mod and kq_conv against a dense float64 oracle of SEMANTICS.md written here
from sections 3-6 alone (not tests/oracle.py, not the reference backend), and the validation of
the mods: what each returns and how it is called."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import haloattn
from haloattn.dispatch import DISPATCHER
from haloattn.problem import build_problem


def _axis_keep(L, K, S, Dl, causal, pattern, shift):
    """Section 3/4 on one axis: keep[i, j] and the rpb offset (y - x + K - 1) in group units."""
    keep = torch.zeros(L, L, dtype=torch.bool)
    rel = torch.zeros(L, L, dtype=torch.long)
    for i, j in itertools.product(range(L), range(L)):
        if i % Dl != j % Dl:
            continue
        g, x, y = i % Dl, i // Dl, j // Dl
        Lg = -(-(L - g) // Dl)
        if pattern == "window":
            wid = (lambda c: (c + K - shift) // K) if shift > 0 else (lambda c: c // K)
            ok = wid(x) == wid(y) and (y <= x or not causal)
        elif causal:
            leader = min((x // S) * S + S - 1, Lg - 1)
            ok = max(leader - K + 1, 0) <= y <= x
        else:
            leader = min((x // S) * S + S // 2, Lg - 1)
            start = min(max(leader - K // 2, 0), Lg - K)
            ok = start <= y < start + K
        keep[i, j] = ok
        rel[i, j] = min(max(y - x + K - 1, 0), 2 * K - 2)
    return keep, rel


def dense_oracle(q, k, v, window, *, stride=1, dilation=1, causal=False, pattern="neighborhood", shift=0,
                 scale=None, softcap=None, rpb=None, score_mod=None, mask_mod=None, kq_conv=None,
                 additional_keys=None, additional_values=None):
    """(out, lse) in the inputs' dtype (pass float64), every pair of the grid scored: N x N."""
    B, spatial, (H, D) = q.shape[0], tuple(q.shape[1:-2]), q.shape[-2:]
    rank, Hkv, Dv, N = len(spatial), k.shape[-2], v.shape[-1], math.prod(spatial)

    def per_axis(x):
        return tuple(x) if isinstance(x, (tuple, list)) else (x,) * rank

    Ks, Ss, Dls, Cs, shifts = map(per_axis, (window, stride, dilation, causal, shift))
    scale = D ** -0.5 if scale is None else scale
    coords = torch.tensor(list(itertools.product(*map(range, spatial)))).view(N, rank)  # row-major
    keep, rpb_index = torch.ones(N, N, dtype=torch.bool), torch.zeros(N, N, dtype=torch.long)
    for a in range(rank):
        ka, ra = _axis_keep(spatial[a], Ks[a], Ss[a], Dls[a], Cs[a], pattern, shifts[a])
        c = coords[:, a]
        keep &= ka[c[:, None], c[None, :]]
        rpb_index = rpb_index * (2 * Ks[a] - 1) + ra[c[:, None], c[None, :]]
    G = H // Hkv
    qf = q.reshape(B, N, H, D)
    kf = k.reshape(B, N, Hkv, D).repeat_interleave(G, dim=2)
    vf = v.reshape(B, N, Hkv, Dv).repeat_interleave(G, dim=2)
    b_i, h_i = torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, 1, H, 1)
    q_i, kv_i = torch.arange(N).view(1, N, 1, 1), torch.arange(N).view(1, 1, 1, N)
    s = torch.einsum("bihd,bjhd->bihj", qf, kf) * scale  # [B, N, H, N]
    kept = keep.view(1, N, 1, N).expand(B, N, H, N)
    if mask_mod is not None:
        kept = kept & mask_mod(b_i, h_i, q_i, kv_i)
    if kq_conv is not None:  # section 6
        c_q, c_k = kq_conv.shape[1:]
        s0 = torch.where(kept, s, torch.zeros((), dtype=s.dtype))
        conv = torch.zeros_like(s)
        for a, t in itertools.product(range(c_q), range(c_k)):
            di, dj = a - (c_q - 1), t - (c_k - 1) // 2
            shifted = torch.zeros_like(s0)  # shifted[i, j] = s0[i + di, j + dj], 0 off the grid
            i0, i1, j0, j1 = max(0, -di), min(N, N - di), max(0, -dj), min(N, N - dj)
            if i1 > i0 and j1 > j0:
                shifted[:, i0:i1, :, j0:j1] = s0[:, i0 + di:i1 + di, :, j0 + dj:j1 + dj]
            conv = conv + kq_conv[:, a, t].to(s.dtype).view(1, 1, H, 1) * shifted
        s = conv
    if rpb is not None:
        s = s + rpb.to(s.dtype).reshape(H, -1)[:, rpb_index].permute(1, 0, 2).unsqueeze(0)
    if score_mod is not None:
        s = score_mod(s, b_i, h_i, q_i, kv_i)
    s = s.expand(B, N, H, N)
    if additional_keys is not None:
        E = additional_keys.shape[1]
        e_i = (N + torch.arange(E)).view(1, 1, 1, E)
        se = torch.einsum("bihd,behd->bihe", qf, additional_keys.repeat_interleave(G, dim=2)) * scale
        if score_mod is not None:
            se = score_mod(se, b_i, h_i, q_i, e_i)
        kept_e = torch.ones(B, N, H, E, dtype=torch.bool)
        if mask_mod is not None:
            kept_e = kept_e & mask_mod(b_i, h_i, q_i, e_i)
        s = torch.cat([s, se.expand(B, N, H, E)], -1)
        kept = torch.cat([kept, kept_e], -1)
        vf = torch.cat([vf, additional_values.repeat_interleave(G, dim=2)], 1)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = torch.where(kept, s, torch.full((), -math.inf, dtype=s.dtype))
    top = s.amax(-1, keepdim=True).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    w = torch.exp(s - top)
    total = w.sum(-1)
    empty = total == 0
    safe_total = torch.where(empty, torch.ones_like(total), total)
    out = torch.einsum("bihj,bjhd->bihd", w, vf) / safe_total.unsqueeze(-1)
    lse = torch.where(empty, torch.full_like(total, -math.inf), top.squeeze(-1) + torch.log(safe_total))
    return out.reshape(B, *spatial, H, Dv), lse.reshape(B, *spatial, H)


def rel_error(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _inputs(spatial, H=2, Hkv=1, D=4, Dv=3, B=2, E=0, kq=None, rpb_window=None, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    tensors = dict(query=rnd(B, *spatial, H, D), key=rnd(B, *spatial, Hkv, D), value=rnd(B, *spatial, Hkv, Dv))
    if rpb_window is not None:
        tensors["rpb"] = rnd(H, *(2 * K - 1 for K in rpb_window))
    if kq is not None:
        tensors["kq_conv"] = rnd(H, *kq) * 0.5
    if E:
        tensors["additional_keys"], tensors["additional_values"] = rnd(B, E, Hkv, D), rnd(B, E, Hkv, Dv)
    return tensors


def _compare(tensors, dtype, tol, **options):
    """attention() in ``dtype`` (rpb/kq_conv float32 beside 16-bit tokens) against the float64
    oracle: out, lse and every input's gradient."""
    ours = {n: t.to(dtype if n not in ("rpb", "kq_conv") or dtype == torch.float64 else torch.float32)
            .requires_grad_() for n, t in tensors.items()}
    ref = {n: t.to(ours[n].dtype).double().requires_grad_() for n, t in tensors.items()}
    q, k, v = (ours.pop(n) for n in ("query", "key", "value"))
    out, lse = haloattn.attention(q, k, v, return_lse=True, **ours, **options)
    rq, rk, rv = (ref.pop(n) for n in ("query", "key", "value"))
    ref_out, ref_lse = dense_oracle(rq, rk, rv, **ref, **options)
    assert rel_error(out, ref_out) <= tol
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse.double()[finite] - ref_lse[finite]).abs().max() <= (1e-9 if dtype == torch.float64 else 1e-4)
    go = torch.randn(ref_out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    leaves, ref_leaves = [q, k, v, *ours.values()], [rq, rk, rv, *ref.values()]
    grads = torch.autograd.grad(out, leaves, go.to(out.dtype))
    ref_grads = torch.autograd.grad(ref_out, ref_leaves, go)
    for g, r in zip(grads, ref_grads):
        assert not torch.isnan(g).any()
        assert rel_error(g, r) <= tol


# --- score_mod's result dtype ------------------------------------------------------------------
# A score_mod reading a captured float64 table (numpy's default dtype, torch.tensor of a float64
# array) on float32 scores returned float64 scores; the reference's products then raised
# "expected scalar type Double but found Float". Likewise a score_mod casting to 16 bits.

SLOPES = torch.tensor([0.25, -0.5], dtype=torch.float64)  # e.g. from numpy


def alibi_float64_table(score, b, h, q_idx, kv_idx):
    return score - SLOPES[h] * (q_idx - kv_idx).abs()


def halved_in_float16(score, b, h, q_idx, kv_idx):
    return (score * 0.5).half()


@pytest.mark.parametrize("options", [
    dict(window=3),
    dict(window=3, E=2, rpb=True, softcap=2.0),
    dict(window=4, kq=(2, 3), causal=True),
], ids=["grid", "extra-rpb-softcap", "kq_conv"])
def test_score_mod_returning_another_float_dtype_runs_in_the_compute_dtype(options):
    options = dict(options)
    E, kq, rpb = options.pop("E", 0), options.pop("kq", None), options.pop("rpb", False)
    tensors = _inputs((9,), E=E, kq=kq, rpb_window=(options["window"],) if rpb else None, seed=1)
    _compare(tensors, torch.float32, 1e-5, score_mod=alibi_float64_table, **options)
    _compare(tensors, torch.bfloat16, 1.5e-2, score_mod=alibi_float64_table, **options)


def test_score_mod_casting_to_float16_matches_its_float16_rounding():
    tensors = _inputs((3, 4), H=2, Hkv=2, seed=2)
    q, k, v = (tensors[n].float() for n in ("query", "key", "value"))
    out = haloattn.attention(q, k, v, 3, score_mod=halved_in_float16)
    ref, _ = dense_oracle(q.double(), k.double(), v.double(), 3,
                          score_mod=lambda s, *_: (s * 0.5).half().double())
    assert rel_error(out, ref) <= 1e-5


# --- mask_mod's result --------------------------------------------------------------------------


def _qkv():
    t = _inputs((8,), H=2, Hkv=2, seed=3)
    return tuple(t[n].float() for n in ("query", "key", "value"))


def test_additive_float_mask_is_refused_not_inverted():
    """mask_mod's verdict was taken with .bool(): an additive mask (0 keep, -inf drop) kept
    exactly the pairs it meant to drop, silently."""
    def additive(b, h, q_idx, kv_idx):
        return torch.where(kv_idx <= q_idx, 0.0, -math.inf)

    with pytest.raises(TypeError, match=r"mask_mod returned dtype torch.float32.*booleans.*score_mod"):
        haloattn.attention(*_qkv(), 3, mask_mod=additive)


@pytest.mark.parametrize("mask, error, words", [
    (lambda b, h, q, k: None, TypeError, ["mask_mod returned a NoneType", "booleans"]),
    (lambda b, h, q, k: (q - k) % 2, TypeError, ["mask_mod returned dtype torch.int64", "booleans"]),
    (lambda b, h, q, k: torch.ones(8, 8, dtype=torch.bool), ValueError, ["mask_mod returned shape (8, 8)", "elementwise"]),
], ids=["none", "int", "whole-table"])
def test_mask_mod_results_that_are_not_per_pair_booleans_are_refused(mask, error, words):
    """None masked every pair (silently: output 0); a table returned whole failed inside a
    backend's broadcasting."""
    with pytest.raises(error) as info:
        haloattn.attention(*_qkv(), 3, mask_mod=mask)
    for word in words:
        assert word in str(info.value)


def test_python_bool_and_indexed_tables_are_still_valid_mask_mods():
    q, k, v = _qkv()
    allowed = torch.rand(8, 8, generator=torch.Generator().manual_seed(4)) > 0.3
    by_table = haloattn.attention(q, k, v, 3, mask_mod=lambda b, h, qi, ki: allowed[qi, ki])
    ref, _ = dense_oracle(q.double(), k.double(), v.double(), 3, mask_mod=lambda b, h, qi, ki: allowed[qi, ki])
    assert rel_error(by_table, ref) <= 1e-5
    constant = haloattn.attention(q, k, v, 3, mask_mod=lambda b, h, qi, ki: True)
    assert rel_error(constant, dense_oracle(q.double(), k.double(), v.double(), 3)[0]) <= 1e-5


# --- how the mods are called ----------------------------------------------------------------------


@pytest.mark.parametrize("name, fn, words", [
    ("mask_mod", lambda score, b, h, q_idx, kv_idx: q_idx >= kv_idx,
     ["mask_mod", "(score, b, h, q_idx, kv_idx)", "mask_mod(b, h, q_idx, kv_idx)", "4 positional"]),
    ("score_mod", lambda b, h, q_idx, kv_idx: q_idx >= kv_idx,
     ["score_mod", "(b, h, q_idx, kv_idx)", "score_mod(score, b, h, q_idx, kv_idx)", "5 positional"]),
    ("mask_mod", lambda b, h, q_idx: q_idx >= 0, ["mask_mod", "(b, h, q_idx)", "too many positional"]),
], ids=["score-signature-as-mask", "mask-signature-as-score", "three-arguments"])
def test_mods_with_the_wrong_signature_are_named(name, fn, words):
    """A mask_mod with score_mod's signature failed inside the backend ('missing 1 required
    positional argument'), naming neither the argument nor the signature expected."""
    with pytest.raises(TypeError) as info:
        haloattn.attention(*_qkv(), 3, **{name: fn})
    for word in words:
        assert word in str(info.value)


def test_triton_window_reason_for_kq_conv_does_not_send_it_to_flex():
    """Flex cannot run kq_conv (a per-score mod cannot see neighbouring scores): the reason said
    'the flex backend runs it on CUDA'."""
    q, k, v = _qkv()
    problem = build_problem(q, k, v, 4, pattern="window", kq_conv=torch.randn(2, 1, 3))
    reasons = [r for r in DISPATCHER.get("triton_window").not_supported_reasons(problem) if "kq_conv" in r]
    assert reasons and not any("flex" in r for r in reasons)
    assert any("kq_conv" in r for r in DISPATCHER.get("flex").not_supported_reasons(problem))


# --- the mods across the patterns, against the dense oracle ------------------------------------


def score_by_head_and_batch(score, b, h, q_idx, kv_idx):
    return score * (1.0 + 0.25 * h) + 0.1 * (q_idx - kv_idx).abs() - 0.05 * b


def score_minus_inf_on_some_pairs(score, b, h, q_idx, kv_idx):
    return torch.where((q_idx + kv_idx) % 3 == 0, torch.full_like(score, -math.inf), 1.3 * score)


def mask_scattered(b, h, q_idx, kv_idx):
    return (q_idx * 7 + kv_idx * 3 + h + b) % 4 != 0


def mask_empty_rows(b, h, q_idx, kv_idx):
    return ~((q_idx % 5 == 2) & (h == 1))


@pytest.mark.parametrize("spatial, options", [
    ((10,), dict(window=4, stride=2, causal=True, score_mod=score_by_head_and_batch, mask_mod=mask_scattered)),
    ((11,), dict(window=3, dilation=2, kq=(3, 5), mask_mod=mask_empty_rows, score_mod=score_by_head_and_batch,
                 E=2, rpb=True, softcap=2.0)),
    ((5, 6), dict(window=(3, 2), stride=(1, 2), causal=(True, False), score_mod=score_minus_inf_on_some_pairs,
                  mask_mod=mask_empty_rows, rpb=True, E=1, H=4, Hkv=2)),
    ((6, 7), dict(window=(2, 3), pattern="window", shift=(1, 2), dilation=(2, 1), score_mod=score_by_head_and_batch,
                  mask_mod=mask_scattered, rpb=True, E=2)),
    ((3, 4, 5), dict(window=(2, 3, 3), causal=(True, False, False), score_mod=score_minus_inf_on_some_pairs,
                     mask_mod=mask_empty_rows, rpb=True, E=1)),
], ids=["1d-causal-stride", "1d-kq_conv-dilation-extra", "2d-gqa-mixed-causal", "2d-window-shift", "3d"])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5), (torch.bfloat16, 1.5e-2)],
                         ids=["float64", "float32", "bfloat16"])
def test_mods_match_the_dense_oracle(spatial, options, dtype, tol):
    options = dict(options)
    H, Hkv, E = options.pop("H", 2), options.pop("Hkv", 1), options.pop("E", 0)
    kq, rpb = options.pop("kq", None), options.pop("rpb", False)
    window = options["window"]
    windows = window if isinstance(window, tuple) else (window,) * len(spatial)
    tensors = _inputs(spatial, H=H, Hkv=Hkv, E=E, kq=kq, rpb_window=windows if rpb else None, seed=len(spatial))
    _compare(tensors, dtype, tol, **options)


# --- DTensor shards: the mods see global batch and head indices ----------------------------------


def _dtensor_inputs():
    g = torch.Generator().manual_seed(5)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return make(3, 9, 4, 8), make(3, 9, 2, 8), make(3, 9, 2, 8)  # batch 3: uneven over two ranks


def score_by_global_head_and_batch(score, b, h, q_idx, kv_idx):
    return score + 0.5 * h - 0.3 * b


def mask_by_global_head_and_batch(b, h, q_idx, kv_idx):
    return (q_idx + kv_idx + h + b) % 3 != 0


def _dtensor_ranks(rank, init_file, results):
    import os

    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    os.environ.pop("TRITON_INTERPRET", None)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        q, k, v = _dtensor_inputs()
        options = dict(score_mod=score_by_global_head_and_batch, mask_mod=mask_by_global_head_and_batch)
        expected, _ = dense_oracle(q, k, v, 3, **options)
        errors = {}
        for label, placement in (("heads", Shard(2)), ("batch", Shard(0))):
            sharded = [distribute_tensor(t, mesh, [placement]) for t in (q, k, v)]
            out = haloattn.attention(*sharded, 3, **options).full_tensor()
            errors[label] = rel_error(out, expected)
        results[rank] = errors
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("plain_cpu_environment")
def test_dtensor_shards_call_the_mods_with_global_batch_and_head_indices(tmp_path):
    """Each rank ran its shard with local indices: head 0 of rank 1 is global head 2, and a
    score_mod reading a per-head slope with h (or a mask_mod using b) silently used rank 0's."""
    import torch.multiprocessing as mp

    results = mp.Manager().dict()
    mp.spawn(_dtensor_ranks, args=(str(tmp_path / "init"), results), nprocs=2, join=True)
    for rank in range(2):
        for label, error in results[rank].items():
            assert error <= 1e-10, (rank, label, error)


# --- torch.func.vmap: the vmapped dimension is folded into the batch, not into b -----------------

PER_ELEMENT = torch.tensor([0.0, 1.5], dtype=torch.float64)  # one entry per batch element (B = 2)


def score_by_batch_table(score, b, h, q_idx, kv_idx):
    return score + PER_ELEMENT[b] * (kv_idx % 2)


def mask_by_batch(b, h, q_idx, kv_idx):
    return (q_idx + kv_idx + b) % 3 != 0


def test_vmap_calls_the_mods_with_each_calls_own_batch_index():
    """vmap folded V calls of batch B into one of batch V * B, and the mods saw the folded index:
    score_by_batch_table read PER_ELEMENT out of range, mask_by_batch masked other pairs."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(3, 2, 8, 2, 4, generator=g, dtype=torch.float64) for _ in range(3))
    options = dict(score_mod=score_by_batch_table, mask_mod=mask_by_batch)
    out = torch.func.vmap(lambda q, k, v: haloattn.attention(q, k, v, 3, **options))(q, k, v)
    expected = torch.stack([dense_oracle(q[i], k[i], v[i], 3, **options)[0] for i in range(3)])
    assert rel_error(out, expected) <= 1e-10
    # and the backward under vmap (per-sample gradients)
    grads = torch.func.vmap(torch.func.grad(lambda q, k, v: haloattn.attention(q, k, v, 3, **options).sum()))(q, k, v)
    expected_grads = []
    for i in range(3):
        qi = q[i].clone().requires_grad_()
        (g_i,) = torch.autograd.grad(dense_oracle(qi, k[i], v[i], 3, **options)[0].sum(), qi)
        expected_grads.append(g_i)
    assert rel_error(grads, torch.stack(expected_grads)) <= 1e-10
