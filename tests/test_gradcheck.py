"""torch.autograd.gradcheck in float64 for every differentiable input of haloattn.attention
(reference backend), through the output and through the lse."""

from __future__ import annotations


import pytest
import torch

import haloattn


pytestmark = pytest.mark.usefixtures("plain_cpu_environment")


def rnd(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


def score_mod(score, b, h, q_idx, kv_idx):
    return score * (1.0 + 0.5 * h) - 0.1 * (q_idx - kv_idx).abs()


def mask_mod(b, h, q_idx, kv_idx):
    return (q_idx + kv_idx) % 3 != 1


CASES = {
    "1d_plain": dict(spatial=(7,), window=3, kw={}),
    "1d_causal_stride_dilation": dict(spatial=(9,), window=3, kw=dict(stride=2, dilation=2, causal=True)),
    "2d_gqa_rpb_softcap": dict(spatial=(3, 4), window=(3, 2), heads=4, kv_heads=2, rpb=True, kw=dict(softcap=2.0, causal=(False, True))),
    "2d_window_shift_rpb": dict(spatial=(4, 3), window=(3, 2), rpb=True, kw=dict(pattern="window", shift=(1, 1))),
    "3d_dilated_extra": dict(spatial=(2, 4, 2), window=(2, 2, 1), extra=2, kw=dict(dilation=(1, 2, 1), stride=(2, 1, 1))),
    "1d_kq_conv": dict(spatial=(8,), window=5, kq_conv=(2, 3), kw={}),
    "1d_kq_conv_causal_rpb_extra": dict(spatial=(8,), window=3, kq_conv=(3, 1), rpb=True, extra=1, kw=dict(causal=True)),
    "2d_mods_extra": dict(spatial=(3, 4), window=(3, 3), extra=2, kw=dict(score_mod=score_mod)),
}


def build(case, dv=2):
    B, H, Hkv, D = 1, case.get("heads", 2), case.get("kv_heads", 1), 2
    sp, window = case["spatial"], case["window"]
    rank = len(sp)
    Ks = window if isinstance(window, tuple) else (window,) * rank
    tensors = [rnd(B, *sp, H, D), rnd(B, *sp, Hkv, D), rnd(B, *sp, Hkv, dv)]
    names = ["query", "key", "value"]
    kw = dict(case["kw"])
    if case.get("rpb"):
        tensors.append(rnd(H, *(2 * k - 1 for k in Ks)))
        names.append("rpb")
    if case.get("kq_conv"):
        tensors.append(torch.nn.Parameter(0.5 * torch.randn(H, *case["kq_conv"], dtype=torch.float64)))
        names.append("kq_conv")
    if case.get("extra"):
        tensors += [rnd(B, case["extra"], Hkv, D), rnd(B, case["extra"], Hkv, dv)]
        names += ["additional_keys", "additional_values"]

    def fn(*ts):
        args = dict(zip(names, ts))
        out, lse = haloattn.attention(args.pop("query"), args.pop("key"), args.pop("value"), window,
                                      return_lse=True, backend="reference", **args, **kw)
        return out, lse

    return fn, tuple(tensors), names


@pytest.mark.parametrize("name", list(CASES))
def test_gradcheck_out_and_lse(name):
    fn, inputs, names = build(CASES[name])
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["1d_plain", "2d_gqa_rpb_softcap", "1d_kq_conv"])
def test_gradcheck_output_only(name):
    fn, inputs, names = build(CASES[name])
    assert torch.autograd.gradcheck(lambda *t: fn(*t)[0], inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["2d_gqa_rpb_softcap", "3d_dilated_extra"])
def test_gradcheck_lse_only(name):
    fn, inputs, names = build(CASES[name])
    assert torch.autograd.gradcheck(lambda *t: fn(*t)[1], inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradcheck_subset_of_inputs_requires_grad():
    """Only some inputs need a gradient: the others get None and the rest stay exact."""
    q, k, v = rnd(1, 6, 2, 3), rnd(1, 6, 1, 3), rnd(1, 6, 1, 2)
    k.requires_grad_(False)
    rpb = rnd(2, 5)
    assert torch.autograd.gradcheck(lambda q, rpb: haloattn.attention(q, k, v.detach(), 3, rpb=rpb), (q, rpb))
    out = haloattn.attention(q, k, v, 3)
    out.sum().backward()
    assert k.grad is None and q.grad is not None and v.grad is not None


def test_gradcheck_with_mask_mod_and_empty_rows():
    """mask_mod may leave rows empty: their lse is -inf (replaced by 0 here so finite differences
    are defined) and their gradient is zero; the rest is exact."""
    def sparse(b, h, q_idx, kv_idx):
        return (q_idx != 2) & mask_mod(b, h, q_idx, kv_idx)

    q, k, v = rnd(1, 7, 2, 3), rnd(1, 7, 2, 3), rnd(1, 7, 2, 2)
    ak, av = rnd(1, 2, 2, 3), rnd(1, 2, 2, 2)

    def fn(q, k, v, ak, av):
        out, lse = haloattn.attention(q, k, v, 3, mask_mod=sparse, additional_keys=ak, additional_values=av,
                                      return_lse=True)
        assert torch.isinf(lse[0, 2]).all()
        return out, torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))

    assert torch.autograd.gradcheck(fn, (q, k, v, ak, av))


def test_rpb_orientation():
    """An independent closed-form check of the table orientation (key minus query + K - 1):
    a large bias at offset +1 makes every query that has its right neighbour in its window
    attend exactly that key."""
    L, K = 6, 3
    q, k = torch.randn(1, L, 1, 2, dtype=torch.float64), torch.randn(1, L, 1, 2, dtype=torch.float64)
    v = torch.randn(1, L, 1, 1, dtype=torch.float64)
    rpb = torch.tensor([[0.0, 0.0, 0.0, 60.0, 0.0]], dtype=torch.float64)
    out = haloattn.attention(q, k, v, K, scale=0.0, rpb=rpb)
    # queries 0..4 have key i + 1 in their window; query 5 (window 3..5) has none and averages
    torch.testing.assert_close(out[0, :5, 0, 0], v[0, 1:6, 0, 0], atol=1e-12, rtol=0)
    torch.testing.assert_close(out[0, 5, 0, 0], v[0, 3:6, 0, 0].mean(), atol=1e-12, rtol=0)
    # 2-D: offset (-1, +1) on a 5x5 grid, window 3x3
    q, k = torch.randn(1, 5, 5, 1, 2, dtype=torch.float64), torch.randn(1, 5, 5, 1, 2, dtype=torch.float64)
    v = torch.randn(1, 5, 5, 1, 1, dtype=torch.float64)
    rpb = torch.zeros(1, 5, 5, dtype=torch.float64)
    rpb[0, 1, 3] = 60.0
    out = haloattn.attention(q, k, v, 3, scale=0.0, rpb=rpb)
    torch.testing.assert_close(out[0, 2, 2, 0, 0], v[0, 1, 3, 0, 0], atol=1e-12, rtol=0)
