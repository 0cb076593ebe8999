"""The reference backend against the independent float64 oracle (tests/oracle.py) on random
problems covering every parameter and feature, in every dtype, plus fully-masked rows and
merge_attentions."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import haloattn

import oracle


pytestmark = pytest.mark.usefixtures("plain_cpu_environment")


# A few fixed FlexAttention-style functions (module level, so they hash by identity).
def score_bias_by_head(score, b, h, q_idx, kv_idx):
    return score + 0.25 * h - 0.1 * b


def score_distance(score, b, h, q_idx, kv_idx):
    return score - 0.05 * (q_idx - kv_idx).abs()


def mask_flat_causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def mask_sparse(b, h, q_idx, kv_idx):
    # leaves some rows empty on small windows
    return (q_idx + 2 * kv_idx + h) % 3 == 0


def mask_odd_heads(b, h, q_idx, kv_idx):
    return (h % 2 == 0) | (kv_idx % 2 == 1)


SCORE_MODS = [None, score_bias_by_head, score_distance]
MASK_MODS = [None, mask_flat_causal, mask_sparse, mask_odd_heads]


@st.composite
def problems(draw, max_tokens=48):
    rank = draw(st.integers(1, 3))
    pattern = draw(st.sampled_from(["neighborhood", "window"]))
    max_len = {1: 16, 2: 7, 3: 4}[rank]
    spatial, window, stride, dilation, causal, shift = [], [], [], [], [], []
    for _ in range(rank):
        L = draw(st.integers(1, max_len))
        Dl = draw(st.integers(1, L))
        K = draw(st.integers(1, L // Dl))
        S = draw(st.integers(1, K)) if pattern == "neighborhood" else 1
        s = draw(st.integers(0, K - 1)) if pattern == "window" else 0
        spatial.append(L)
        window.append(K)
        stride.append(S)
        dilation.append(Dl)
        causal.append(draw(st.booleans()))
        shift.append(s)
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 2))
    spec = dict(
        spatial=tuple(spatial),
        batch=draw(st.integers(1, 2)),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=draw(st.integers(1, 5)),
        value_dim=draw(st.integers(1, 5)),
        kw=dict(
            stride=tuple(stride) if draw(st.booleans()) else list(stride),
            dilation=tuple(dilation),
            causal=tuple(causal),
            pattern=pattern,
            shift=tuple(shift),
        ),
        window=tuple(window),
        rpb=draw(st.booleans()),
        softcap=draw(st.sampled_from([None, None, 0.7, 5.0])),
        scale=draw(st.sampled_from([None, None, 0.3, 0.0, -1.5])),
        extra=draw(st.sampled_from([0, 0, 1, 3])),
        score_mod=draw(st.sampled_from(SCORE_MODS)),
        mask_mod=draw(st.sampled_from(MASK_MODS)),
        kq_conv=(draw(st.integers(1, 3)), draw(st.sampled_from([1, 3, 5]))) if rank == 1 and draw(st.booleans()) else None,
        seed=draw(st.integers(0, 2**31 - 1)),
    )
    return spec


def make_inputs(spec, dtype=torch.float64, requires_grad=False):
    g = torch.Generator().manual_seed(spec["seed"])

    def rnd(*shape):
        t = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
        return t.requires_grad_(requires_grad)

    B, sp, H, Hkv = spec["batch"], spec["spatial"], spec["heads"], spec["kv_heads"]
    D, Dv = spec["head_dim"], spec["value_dim"]
    tensors = dict(query=rnd(B, *sp, H, D), key=rnd(B, *sp, Hkv, D), value=rnd(B, *sp, Hkv, Dv))
    kw = dict(spec["kw"])
    if spec["rpb"]:
        kw["rpb"] = rnd(H, *(2 * k - 1 for k in spec["window"]))
    if spec["kq_conv"] is not None:
        kw["kq_conv"] = rnd(H, *spec["kq_conv"]) * 0.5
    if spec["extra"]:
        kw["additional_keys"] = rnd(B, spec["extra"], Hkv, D)
        kw["additional_values"] = rnd(B, spec["extra"], Hkv, Dv)
    for name in ("softcap", "scale", "score_mod", "mask_mod"):
        if spec[name] is not None:
            kw[name] = spec[name]
    return tensors, kw


def check_against_oracle(spec, dtype):
    tensors, kw = make_inputs(spec, dtype)
    out, lse = haloattn.attention(*tensors.values(), spec["window"], return_lse=True, backend="reference", **kw)
    ref_out, ref_lse = oracle.attention(*tensors.values(), spec["window"], **kw)
    assert out.dtype == dtype and out.shape == ref_out.shape
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert lse.shape == ref_lse.shape
    err = oracle.rel_error(out, ref_out)
    assert err <= oracle.TOLERANCE[dtype], f"output rel error {err:.3g} for {spec}"
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), "empty rows differ"
    finite = torch.isfinite(ref_lse)
    if finite.any():
        lse_err = (lse.double() - ref_lse)[finite].abs().max().item()
        assert lse_err <= oracle.LSE_TOLERANCE[dtype] * max(1.0, ref_lse[finite].abs().max().item()), lse_err
    # empty rows: output 0 and lse -inf
    empty = ~finite
    if empty.any():
        assert (ref_lse[empty] == -math.inf).all() and (lse[empty] == -math.inf).all()
        assert (out.permute(-1, *range(out.dim() - 1))[:, empty] == 0).all()
    return tensors, kw, ref_lse


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_reference_matches_oracle_float64(spec):
    tensors, kw, ref_lse = check_against_oracle(spec, torch.float64)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.booleans())
def test_reference_gradients_match_oracle_float64(spec, through_lse):
    """Gradients of every differentiable input (q, k, v, rpb, kq_conv, additional tokens) against
    autograd through the oracle, seeded on the output and (optionally) the lse."""
    tensors, kw = make_inputs(spec, torch.float64, requires_grad=True)
    ref_out, ref_lse = oracle.attention(*tensors.values(), spec["window"], **kw)
    if not torch.isfinite(ref_lse).all():
        # the oracle's logsumexp has no defined gradient on empty rows; test_empty_rows covers them
        return
    out, lse = haloattn.attention(*tensors.values(), spec["window"], return_lse=True, backend="reference", **kw)
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64)
    gl = torch.randn(lse.shape, generator=g, dtype=torch.float64) if through_lse else None
    leaves = [t for t in list(tensors.values()) + [kw.get(n) for n in ("rpb", "kq_conv", "additional_keys", "additional_values")] if t is not None]

    def loss(o, l):
        return (o * go).sum() + ((l * gl).sum() if gl is not None else 0)

    grads = torch.autograd.grad(loss(out, lse), leaves)
    ref_grads = torch.autograd.grad(loss(ref_out, ref_lse), leaves)
    for i, (a, b) in enumerate(zip(grads, ref_grads)):
        err = oracle.rel_error(a, b)
        assert err <= 1e-9, f"grad {i} rel error {err:.3g}"


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=problems())
def test_reference_matches_oracle_low_precision(dtype, spec):
    # 16-bit: keep magnitudes moderate (their inputs are rounded, the oracle sees the rounded ones)
    check_against_oracle(spec, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_low_precision_gradients(dtype):
    spec = dict(spatial=(6, 7), batch=2, heads=4, kv_heads=2, head_dim=8, value_dim=6, window=(3, 3),
                kw=dict(dilation=(1, 2), causal=(True, False)), rpb=True, softcap=None, scale=None, extra=2,
                score_mod=None, mask_mod=None, kq_conv=None, seed=7)
    tensors, kw = make_inputs(spec, dtype, requires_grad=True)
    out, lse = haloattn.attention(*tensors.values(), spec["window"], return_lse=True, backend="reference", **kw)
    ref_out, ref_lse = oracle.attention(*tensors.values(), spec["window"], **kw)
    leaves = list(tensors.values()) + [kw["rpb"], kw["additional_keys"], kw["additional_values"]]
    go = torch.randn(out.shape, dtype=torch.float64)
    grads = torch.autograd.grad((out.double() * go).sum() + lse.double().sum(), leaves)
    ref_grads = torch.autograd.grad((ref_out * go).sum() + ref_lse.sum(), leaves)
    for a, b, t in zip(grads, ref_grads, leaves):
        assert a.dtype == t.dtype
        assert oracle.rel_error(a, b) <= oracle.TOLERANCE[dtype] * (2 if dtype != torch.float32 else 1)


def test_scale_zero_is_honoured_and_default_scale():
    q, k, v = (torch.randn(1, 9, 2, 4, dtype=torch.float64) for _ in range(3))
    out = haloattn.attention(q, k, v, 3, scale=0.0)
    ref, _ = oracle.attention(q, k, v, 3, scale=0.0)
    assert oracle.rel_error(out, ref) <= 1e-10
    # scale=0: plain average of the window's values
    assert torch.allclose(out[0, 4], v[0, 3:6].mean(0))
    default = haloattn.attention(q, k, v, 3)
    explicit = haloattn.attention(q, k, v, 3, scale=4 ** -0.5)
    assert torch.equal(default, explicit)
    assert not torch.allclose(default, out)


def test_empty_rows_output_zero_lse_minus_inf_zero_gradient():
    """Rows whose every key is masked (mask_mod) give output 0, lse -inf and no gradient, while
    the other rows stay exact and gradients stay finite."""
    def mask_rows(b, h, q_idx, kv_idx):
        return (q_idx % 4 != 1) | (h == 1)  # query 1, 5, ... of head 0 see nothing

    q, k, v = (torch.randn(2, 8, 2, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    rpb = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    out, lse = haloattn.attention(q, k, v, 3, mask_mod=mask_rows, rpb=rpb, return_lse=True)
    ref_out, ref_lse = oracle.attention(q, k, v, 3, mask_mod=mask_rows, rpb=rpb)
    assert oracle.rel_error(out, ref_out) <= 1e-10
    empty = torch.zeros(2, 8, 2, dtype=torch.bool)
    empty[:, 1::4, 0] = True
    assert torch.equal(lse == -math.inf, empty)
    assert (out[empty] == 0).all()
    # gradient: seed only the empty rows -> every gradient is exactly zero
    seed = torch.where(empty.unsqueeze(-1), torch.randn_like(out), torch.zeros_like(out))
    lse_seed = torch.where(empty, 1.0, 0.0).double()
    grads = torch.autograd.grad((out * seed).sum() + (torch.where(empty, 0.0, lse) * 0).sum(), (q, k, v, rpb))
    for g in grads:
        assert torch.isfinite(g).all() and (g == 0).all()
    # through lse on all rows (backend receives a grad_lse on -inf rows): finite, and q of empty rows gets 0
    out, lse = haloattn.attention(q, k, v, 3, mask_mod=mask_rows, rpb=rpb, return_lse=True)
    finite_lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    gq, gk, gv, grpb = torch.autograd.grad(out.sum() + finite_lse.sum(), (q, k, v, rpb))
    for g in (gq, gk, gv, grpb):
        assert torch.isfinite(g).all()
    assert (gq[:, 1::4, 0] == 0).all()
    del lse_seed


def test_every_key_masked_with_additional_tokens_is_still_exact():
    def only_extra(b, h, q_idx, kv_idx):
        return kv_idx >= 6

    q, k, v = (torch.randn(1, 6, 1, 3, dtype=torch.float64) for _ in range(3))
    ak, av = torch.randn(1, 2, 1, 3, dtype=torch.float64), torch.randn(1, 2, 1, 3, dtype=torch.float64)
    out = haloattn.attention(q, k, v, 3, mask_mod=only_extra, additional_keys=ak, additional_values=av)
    ref, _ = oracle.attention(q, k, v, 3, mask_mod=only_extra, additional_keys=ak, additional_values=av)
    assert oracle.rel_error(out, ref) <= 1e-10
    # every query sees the same two tokens: softmax over q.ak
    w = torch.softmax(torch.einsum("bnhd,behd->bnhe", q, ak) * 3 ** -0.5, -1)
    torch.testing.assert_close(out, torch.einsum("bnhe,behd->bnhd", w, av))


# ---------------------------------------------------------------------------------------------
# merge_attentions


def test_merge_grid_and_additional_tokens():
    """attention(grid + extra) == merge(attention(grid), attention(extra only))."""
    q, k, v = (torch.randn(2, 5, 4, 4, 3, dtype=torch.float64) for _ in range(3))
    ak, av = torch.randn(2, 3, 4, 3, dtype=torch.float64), torch.randn(2, 3, 4, 3, dtype=torch.float64)

    def extra_only(b, h, q_idx, kv_idx):
        return kv_idx >= 20

    full, full_lse = haloattn.attention(q, k, v, (3, 2), additional_keys=ak, additional_values=av, return_lse=True)
    grid, grid_lse = haloattn.attention(q, k, v, (3, 2), return_lse=True)
    extra, extra_lse = haloattn.attention(q, k, v, (3, 2), additional_keys=ak, additional_values=av,
                                          mask_mod=extra_only, return_lse=True)
    out, lse = haloattn.merge_attentions([grid, extra], [grid_lse, extra_lse])
    assert oracle.rel_error(out, full) <= 1e-10
    assert (lse - full_lse).abs().max() <= 1e-10


def _split_masks():
    def left(b, h, q_idx, kv_idx):
        return (kv_idx % 2 == 0) & (q_idx != 3)

    def right(b, h, q_idx, kv_idx):
        return (kv_idx % 2 == 1) & (q_idx != 4) & (q_idx != 3)

    def union(b, h, q_idx, kv_idx):
        return left(b, h, q_idx, kv_idx) | right(b, h, q_idx, kv_idx)

    return left, right, union


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_merge_disjoint_masks_with_empty_rows(dtype):
    left, right, union = _split_masks()
    q, k, v = (torch.randn(1, 10, 2, 4, dtype=dtype) for _ in range(3))
    o1, l1 = haloattn.attention(q, k, v, 5, mask_mod=left, return_lse=True)
    o2, l2 = haloattn.attention(q, k, v, 5, mask_mod=right, return_lse=True)
    full, full_lse = haloattn.attention(q, k, v, 5, mask_mod=union, return_lse=True)
    assert torch.isinf(l2[0, 4]).all() and torch.isfinite(l1[0, 4]).all()  # row 4 empty in one part
    assert torch.isinf(full_lse[0, 3]).all()  # row 3 empty everywhere
    out, lse = haloattn.merge_attentions([o1, o2], [l1, l2])
    assert out.dtype == dtype and lse.dtype == full_lse.dtype
    assert oracle.rel_error(out, full) <= oracle.TOLERANCE[dtype] * 2
    assert torch.equal(torch.isinf(lse), torch.isinf(full_lse))
    assert (out[0, 3] == 0).all() and (lse[0, 3] == -math.inf).all()
    finite = torch.isfinite(full_lse)
    assert (lse[finite] - full_lse[finite]).abs().max() <= oracle.LSE_TOLERANCE[dtype]


def test_merge_is_numerically_stable():
    o = [torch.randn(3, 2, 4, dtype=torch.float64) for _ in range(2)]
    l = [torch.full((3, 2), 1000.0, dtype=torch.float64), torch.full((3, 2), 1000.0 + math.log(3), dtype=torch.float64)]
    out, lse = haloattn.merge_attentions(o, l)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, 0.25 * o[0] + 0.75 * o[1])
    torch.testing.assert_close(lse, torch.full((3, 2), 1000.0 + math.log(4), dtype=torch.float64))


def test_merge_gradcheck():
    left, right, _ = _split_masks()
    q, k, v = (torch.randn(1, 8, 1, 2, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def fn(q, k, v):
        o1, l1 = haloattn.attention(q, k, v, 5, mask_mod=left, return_lse=True)
        o2, l2 = haloattn.attention(q, k, v, 5, mask_mod=right, return_lse=True)
        out, lse = haloattn.merge_attentions([o1, o2], [l1, l2])
        return out, torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))

    assert torch.autograd.gradcheck(fn, (q, k, v))
    # merge alone, on raw tensors with a -inf part
    o = [torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    l1 = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    l2 = torch.randn(4, 2, dtype=torch.float64)
    l2[0] = -math.inf
    l2.requires_grad_()

    def merge(o1, o2, l1, l2):
        return haloattn.merge_attentions([o1, o2], [l1, l2])

    assert torch.autograd.gradcheck(merge, (o[0], o[1], l1, l2))


def test_merge_rejects_bad_arguments():
    o, l = torch.randn(3, 2, 4), torch.randn(3, 2)
    with pytest.raises(ValueError, match="one lse per output"):
        haloattn.merge_attentions([o, o], [l])
    with pytest.raises(ValueError, match=r"outputs\[1\]"):
        haloattn.merge_attentions([o, torch.randn(3, 2, 5)], [l, l])


def keys_even(b, h, q_idx, kv_idx):
    return kv_idx % 2 == 0


def keys_odd(b, h, q_idx, kv_idx):
    return kv_idx % 2 == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_merge_of_random_key_split_equals_full(spec):
    """Any problem (no kq_conv, whose convolution mixes masked sources): attention over the even
    keys merged with attention over the odd keys equals attention over all of them; rows empty
    in one part (e.g. a 1-key window) are handled."""
    spec = dict(spec, kq_conv=None, mask_mod=None)
    tensors, kw = make_inputs(spec, torch.float64)
    full, full_lse = haloattn.attention(*tensors.values(), spec["window"], return_lse=True, **kw)
    parts = [haloattn.attention(*tensors.values(), spec["window"], return_lse=True, mask_mod=m, **kw)
             for m in (keys_even, keys_odd)]
    out, lse = haloattn.merge_attentions([p[0] for p in parts], [p[1] for p in parts])
    assert oracle.rel_error(out, full) <= 1e-10
    assert (lse - full_lse).abs().max() <= 1e-10


def _extra_key_for_odd_rows(b, h, q_idx, kv_idx):
    # grid key kv_idx < N (window 1: the row's own token) always; the additional key only on odd rows
    return (kv_idx < 16) | (q_idx % 2 == 1)


def _usual_form_query_gradient(q, k, v, ak, av, go, scale):
    """dQ of window-1 attention with one additional key on odd rows, in float32, as a fused
    backward forms it: dP by a product, delta = rowsum(dO * O) elementwise, P from the stored LSE."""
    keys, values = torch.cat([k[0, :, 0], ak[0, :, 0]]), torch.cat([v[0, :, 0], av[0, :, 0]])  # [N + 1, D]
    N = q.shape[1]
    rows = torch.arange(N)
    keep = torch.zeros(N, N + 1, dtype=torch.bool)
    keep[rows, rows] = True
    keep[rows % 2 == 1, N] = True
    s = torch.where(keep, scale * q[0, :, 0] @ keys.T, -math.inf)
    lse = torch.logsumexp(s, -1, keepdim=True)
    p = torch.exp(s - lse)
    o = p @ values
    d_p = go[0, :, 0] @ values.T
    d_s = p * (d_p - (go[0, :, 0] * o).sum(-1, keepdim=True))
    return (scale * d_s @ keys).view_as(q)


def test_gradient_rounding_floor_covers_a_usual_form_backward():
    """The modelled floor (oracle.gradient_rounding_floor) is as large as what a float32 backward
    of the usual form leaves where the exact gradient cancels (even rows attend one key: their dQ
    is exactly 0), while a plain float32 run of the oracle rounds those rows to 0; on a
    well-conditioned problem four times the model (what tests allow) stays below the float32 tolerance."""
    g = torch.Generator().manual_seed(11)
    grid, extra = (1, 16, 1, 24), (1, 1, 1, 24)
    # queries and keys 4x unit size: scores of order 50, whose P the LSE fixes only to float32 rounding
    q, k, ak = (4 * torch.randn(shape, generator=g, dtype=torch.float64) for shape in (grid, grid, extra))
    v, av = (torch.randn(shape, generator=g, dtype=torch.float64) for shape in (grid, extra))
    go = torch.randn(grid, generator=g, dtype=torch.float64)
    q.requires_grad_(True)
    kw = dict(additional_keys=ak, additional_values=av, mask_mod=_extra_key_for_odd_rows, scale=0.7)
    exact = torch.autograd.grad((oracle.attention(q, k, v, 1, **kw)[0] * go).sum(), q)[0]
    fused = _usual_form_query_gradient(*(t.detach().float() for t in (q, k, v, ak, av, go)), 0.7)
    plain_out, _ = oracle.attention(q, k, v, 1, compute_dtype=torch.float32, **kw)
    plain = torch.autograd.grad((plain_out.double() * go).sum(), q)[0]
    (model,) = oracle.gradient_rounding_floor(q, k, v, 1, go, None, [q], **kw)
    even = slice(0, None, 2)
    assert exact[:, even].abs().max() < 1e-12 and plain[:, even].abs().max() < 1e-12
    assert fused[:, even].abs().max() > 0  # rounding that does not cancel
    assert oracle.rel_error(fused, exact) <= 4 * oracle.rounding_share(model, exact)
    assert oracle.rel_error(fused, exact) > 3 * oracle.rel_error(plain, exact)  # the plain floor misses it

    # unit-size inputs, window 5 on 16 tokens, no additional key: no row's softmax saturates
    q, k = (t.detach().div(4).requires_grad_(True) for t in (q, k))
    (model,) = oracle.gradient_rounding_floor(q, k, v, 5, go, None, [q], scale=0.7)
    exact = torch.autograd.grad((oracle.attention(q, k, v, 5, scale=0.7)[0] * go).sum(), q)[0]
    assert 0 < 4 * oracle.rounding_share(model, exact) < 0.5 * oracle.TOLERANCE[torch.float32]  # tests allow 4x


def test_gradient_rounding_floor_rejects_unknown_arguments():
    q = torch.randn(1, 4, 1, 2, dtype=torch.float64, requires_grad=True)
    with pytest.raises(TypeError, match="softcapp"):
        oracle.gradient_rounding_floor(q, q, q, 1, torch.ones_like(q), None, [q], softcapp=1.0)
