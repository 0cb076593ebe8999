"""Bad input raises ValueError/TypeError naming the argument, the axis, the value and what is
allowed. Each case asserts on the message content, through attention() and explain()."""

from __future__ import annotations

import re

import pytest
import torch

import haloattn


def t(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, dtype=dtype, device=device)


def qkv(spatial=(8,), H=2, Hkv=2, D=4, Dv=4, B=1, dtype=torch.float32):
    return t(B, *spatial, H, D, dtype=dtype), t(B, *spatial, Hkv, D, dtype=dtype), t(B, *spatial, Hkv, Dv, dtype=dtype)


def mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


# (id, exception, call kwargs builder, substrings that must appear in the message)
CASES = [
    # tensors of the wrong rank, mismatched shapes, batch, dtypes, devices
    ("query_rank", ValueError, lambda: dict(args=(t(2, 4), t(2, 4), t(2, 4), 3)), ["query", "2 dimensions", "4, 5 or 6"]),
    ("query_rank_7", ValueError, lambda: dict(args=(t(1, 2, 2, 2, 2, 1, 1),) * 3 + (1,)), ["query", "7 dimensions"]),
    ("key_rank", ValueError, lambda: dict(args=(t(1, 8, 2, 4), t(1, 8, 1, 2, 4), t(1, 8, 2, 4), 3)), ["key", "5 dimensions", "query has 4"]),
    ("key_spatial", ValueError, lambda: dict(args=(t(1, 6, 7, 2, 4), t(1, 6, 5, 2, 4), t(1, 6, 7, 2, 4), 3)), ["key", "axis 1", "5", "7"]),
    ("value_spatial", ValueError, lambda: dict(args=(t(1, 6, 7, 2, 4), t(1, 6, 7, 2, 4), t(1, 4, 7, 2, 4), 3)), ["value", "axis 0", "4", "6"]),
    ("key_batch", ValueError, lambda: dict(args=(t(1, 8, 2, 4), t(2, 8, 2, 4), t(1, 8, 2, 4), 3)), ["key", "batch", "2", "1"]),
    ("value_heads", ValueError, lambda: dict(args=(t(1, 8, 2, 4), t(1, 8, 2, 4), t(1, 8, 1, 4), 3)), ["value", "1 heads", "key has 2"]),
    ("gqa", ValueError, lambda: dict(args=qkv(H=3, Hkv=2) + (3,)), ["3", "2", "divisible", "H % H_kv"]),
    ("head_dim", ValueError, lambda: dict(args=(t(1, 8, 2, 4), t(1, 8, 2, 5), t(1, 8, 2, 4), 3)), ["key", "head_dim", "5", "4"]),
    ("mixed_dtype", TypeError, lambda: dict(args=(t(1, 8, 2, 4), t(1, 8, 2, 4, dtype=torch.float64), t(1, 8, 2, 4), 3)), ["dtype", "float32", "float64"]),
    ("int_dtype", TypeError, lambda: dict(args=(torch.ones(1, 8, 2, 4, dtype=torch.int64),) * 3 + (3,)), ["query", "int64", "float16, bfloat16, float32, float64"]),
    ("not_tensor", TypeError, lambda: dict(args=([[1.0]], t(1, 8, 2, 4), t(1, 8, 2, 4), 3)), ["query", "torch.Tensor", "list"]),
    ("device", ValueError, lambda: dict(args=(t(1, 8, 2, 4), t(1, 8, 2, 4, device="meta"), t(1, 8, 2, 4), 3)), ["device", "cpu", "meta"]),
    # empty axes
    ("empty_spatial", ValueError, lambda: dict(args=(t(1, 4, 0, 2, 4),) * 3 + (1,)), ["axis 1", "empty", "length 0"]),
    ("empty_batch", ValueError, lambda: dict(args=(t(0, 8, 2, 4),) * 3 + (3,)), ["empty batch axis", "length 0"]),
    ("empty_heads", ValueError, lambda: dict(args=(t(1, 8, 0, 4),) * 3 + (3,)), ["empty heads axis", "length 0"]),
    ("empty_head_dim", ValueError, lambda: dict(args=(t(1, 8, 2, 0),) * 3 + (3,)), ["empty head_dim axis", "length 0"]),
    # per-axis parameters
    ("window_zero", ValueError, lambda: dict(args=qkv((6, 6)) + ((3, 0),)), ["window", "axis 1", "0", ">= 1"]),
    ("window_too_big", ValueError, lambda: dict(args=qkv((6, 5)) + ((3, 6),)), ["window", "axis 1", "6", "5"]),
    ("window_dilation", ValueError, lambda: dict(args=qkv((9, 5)) + (3,), kw=dict(dilation=(4, 1))), ["window", "dilation", "axis 0", "12", "9"]),
    ("dilation_zero", ValueError, lambda: dict(args=qkv((9,)) + (3,), kw=dict(dilation=0)), ["dilation", "axis 0", "0", ">= 1"]),
    ("window_len", ValueError, lambda: dict(args=qkv((9, 9)) + ((3, 3, 3),)), ["window", "3 entries", "rank 2"]),
    ("window_float", TypeError, lambda: dict(args=qkv((9,)) + (3.0,)), ["window", "axis 0", "3.0", "int"]),
    ("stride_zero", ValueError, lambda: dict(args=qkv((9, 9)) + (3,), kw=dict(stride=(1, 0))), ["stride", "axis 1", "0", "1 <= stride <= window (3)"]),
    ("stride_big", ValueError, lambda: dict(args=qkv((9,)) + (3,), kw=dict(stride=4)), ["stride", "axis 0", "4", "<= window (3)"]),
    ("causal_int", TypeError, lambda: dict(args=qkv((9,)) + (3,), kw=dict(causal=1)), ["causal", "axis 0", "1", "bool"]),
    ("shift_neighborhood", ValueError, lambda: dict(args=qkv((9, 9)) + (3,), kw=dict(shift=(0, 1))), ["shift", "axis 1", "1", "neighborhood", "'window'"]),
    ("shift_range", ValueError, lambda: dict(args=qkv((9, 9)) + (3,), kw=dict(pattern="window", shift=(3, 0))), ["shift", "axis 0", "3", "0 <= shift < window (3)"]),
    ("shift_negative", ValueError, lambda: dict(args=qkv((9,)) + (3,), kw=dict(pattern="window", shift=-1)), ["shift", "axis 0", "-1"]),
    ("window_stride", ValueError, lambda: dict(args=qkv((9,)) + (3,), kw=dict(pattern="window", stride=2)), ["stride", "axis 0", "2", "window"]),
    ("pattern", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(pattern="swin")), ["pattern", "'swin'", "'neighborhood'", "'window'"]),
    # tables and tokens
    ("rpb_shape", ValueError, lambda: dict(args=qkv((6, 6)) + ((3, 3),), kw=dict(rpb=t(2, 5, 4))), ["rpb", "(2, 5, 4)", "(2, 5, 5)"]),
    ("rpb_heads", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(rpb=t(1, 5))), ["rpb", "(1, 5)", "(2, 5)"]),
    ("rpb_dtype", TypeError, lambda: dict(args=qkv() + (3,), kw=dict(rpb=t(2, 5, dtype=torch.float64))), ["rpb", "float64", "float32"]),
    ("rpb_not_tensor", TypeError, lambda: dict(args=qkv() + (3,), kw=dict(rpb=[0.0] * 5)), ["rpb", "torch.Tensor", "list"]),
    ("kq_conv_rank2", ValueError, lambda: dict(args=qkv((5, 5)) + (3,), kw=dict(kq_conv=t(2, 1, 3))), ["kq_conv", "rank-1", "rank 2"]),
    ("kq_conv_even", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(kq_conv=t(2, 2, 4))), ["kq_conv", "c_k=4", "odd"]),
    ("kq_conv_heads", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(kq_conv=t(1, 2, 3))), ["kq_conv", "1 heads", "(2)"]),
    ("kq_conv_dims", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(kq_conv=t(2, 3))), ["kq_conv", "(2, 3)", "[H, c_q, c_k]"]),
    ("extra_no_values", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(additional_keys=t(1, 2, 2, 4))), ["additional_keys", "without", "additional_values"]),
    ("extra_no_keys", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(additional_values=t(1, 2, 2, 4))), ["additional_values", "without", "additional_keys"]),
    ("extra_shape", ValueError, lambda: dict(args=qkv(Dv=3) + (3,), kw=dict(additional_keys=t(1, 2, 2, 4), additional_values=t(1, 2, 2, 4))), ["additional_values", "(1, 2, 2, 4)", "[1, E, 2, 3]"]),
    ("extra_heads", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(additional_keys=t(1, 2, 1, 4), additional_values=t(1, 2, 2, 4))), ["additional_keys", "(1, 2, 1, 4)", "[1, E, 2, 4]"]),
    ("extra_count", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(additional_keys=t(1, 2, 2, 4), additional_values=t(1, 3, 2, 4))), ["additional_keys", "2 tokens", "3"]),
    ("extra_empty", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(additional_keys=t(1, 0, 2, 4), additional_values=t(1, 0, 2, 4))), ["additional_keys", "E = 0"]),
    ("extra_dtype", TypeError, lambda: dict(args=qkv() + (3,), kw=dict(additional_keys=t(1, 2, 2, 4, dtype=torch.float16), additional_values=t(1, 2, 2, 4))), ["additional_keys", "float16", "float32"]),
    # scalars and callables
    ("scale_nan", TypeError, lambda: dict(args=qkv() + (3,), kw=dict(scale=float("nan"))), ["scale", "nan"]),
    ("softcap_neg", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(softcap=-1.0)), ["softcap", "-1.0", "> 0"]),
    ("mask_mod", TypeError, lambda: dict(args=qkv() + (3,), kw=dict(mask_mod="causal")), ["mask_mod", "callable", "str"]),
    ("score_mod_int", TypeError, lambda: dict(args=qkv() + (3,), kw=dict(score_mod=lambda s, b, h, q, k: (s > 0).int())),
     ["score_mod", "dtype torch.int32", "floating tensor"]),
    ("score_mod_reduction", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(score_mod=lambda s, b, h, q, k: s.sum())),
     ["score_mod", "shape ()", "elementwise"]),
    ("score_mod_unindexed_heads", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(score_mod=lambda s, b, h, q, k: s + torch.ones(2))),
     ["score_mod", "(1, 1, 2, 2)", "indexed by h"]),
    ("score_mod_trainable", ValueError, lambda: dict(
        args=qkv() + (3,), kw=dict(score_mod=(lambda w: lambda s, b, h, q, k: s + w[h])(torch.ones(2, requires_grad=True)))),
     ["score_mod", "requires grad", "rpb="]),
    ("return_lse", TypeError, lambda: dict(args=qkv() + (3,), kw=dict(return_lse=1)), ["return_lse", "bool"]),
    # backend names
    ("backend_unknown", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(backend="nonexistent")), ["backend", "'nonexistent'", "does not exist", "reference"]),
    ("backend_list_unknown", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(backend="reference, nope")), ["'nope'", "does not exist"]),
    ("backend_type", TypeError, lambda: dict(args=qkv() + (3,), kw=dict(backend=3)), ["backend=3", "backend name"]),
    ("backend_empty", ValueError, lambda: dict(args=qkv() + (3,), kw=dict(backend=" , ")), ["backend", "names no backend"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("entry", ["attention", "explain"])
def test_bad_input_message(case, entry):
    name, exc, build, needles = case
    call = build()
    fn = haloattn.attention if entry == "attention" else (lambda *a, **k: haloattn.explain(*a, verbose=False, **k))
    if entry == "explain" and name == "return_lse":
        pass
    with pytest.raises(exc) as info:
        fn(*call["args"], **call.get("kw", {}))
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} missing from {message!r}"


def test_valid_call_after_invalid_one_is_not_cached_wrongly():
    q, k, v = qkv((9,))
    with pytest.raises(ValueError):
        haloattn.attention(q, k, v, 3, stride=4)
    assert haloattn.attention(q, k, v, 3, stride=3).shape == (1, 9, 2, 4)
    # a valid call, then the same shapes with a bad option: the fast path must still validate
    with pytest.raises(ValueError, match="stride on axis 0 is 4"):
        haloattn.attention(q, k, v, 3, stride=4)


def test_env_backend_unknown_raises(monkeypatch):
    q, k, v = qkv()
    monkeypatch.setenv("HALOATTN_BACKEND", "does_not_exist")
    with pytest.raises(ValueError, match=re.escape("HALOATTN_BACKEND='does_not_exist': backend='does_not_exist' does not exist")):
        haloattn.attention(q, k, v, 3)


def test_parameters_in_float32_allowed_for_16bit_inputs():
    q, k, v = qkv(dtype=torch.bfloat16)
    rpb = t(2, 5)  # float32 table with bfloat16 activations (autocast-style) is allowed
    out = haloattn.attention(q, k, v, 3, rpb=rpb)
    assert out.dtype == torch.bfloat16
