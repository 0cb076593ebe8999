"""score_mod and mask_mod compiled into backend ``triton``'s kernels (mod_codegen, mod_check,
mod_hooks), on the CPU through Triton's interpreter: each translated operator against PyTorch on
points of both signs, whole problems (forward, LSE and every gradient) against the float64 oracle,
and the reasons given for mods that cannot be compiled."""


import pytest
import torch

pytest.importorskip("triton")

import haloattn  # noqa: E402
from haloattn.backends.reference import attend  # noqa: E402
from haloattn.backends.triton import batch_slices, mod_check, mod_codegen  # noqa: E402

from mods_check import (FLOAT32_TOLERANCE, alibi, checkerboard, gated, per_head_extras, relative_error,  # noqa: E402
                        sparse_rows)
from mods_check import check_mods as _check  # noqa: E402
from tiny_random import check as tiny_random_check  # noqa: E402


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def reference_calls(monkeypatch):
    """Calls of the reference backend: none may come from a fused call."""
    calls = []
    for name in ("forward", "backward"):
        original = getattr(attend, name)

        def counted(*args, _original=original, **kwargs):
            calls.append(args[0])
            return _original(*args, **kwargs)

        monkeypatch.setattr(attend, name, counted)
    return calls


# --- each operator's translation, on points of both signs ------------------------------------

TABLE = torch.randn(5, 7)
SLOPES = torch.rand(6) + 0.1

OPERATOR_MODS = {
    "floor_divide": lambda s, b, h, q, kv: s + (q - kv) // 3,
    "floor_divide_negative_divisor": lambda s, b, h, q, kv: s + torch.floor_divide(q - kv, -4),
    "remainder": lambda s, b, h, q, kv: s + (q - kv) % 5,
    "remainder_float": lambda s, b, h, q, kv: torch.remainder(s, 0.7),
    "fmod": lambda s, b, h, q, kv: s + torch.fmod(q - kv, 3),
    "div_trunc": lambda s, b, h, q, kv: s + torch.div(q - kv, 3, rounding_mode="trunc"),
    "div_floor": lambda s, b, h, q, kv: s + torch.div(q - kv, 3, rounding_mode="floor"),
    "true_divide_ints": lambda s, b, h, q, kv: s + (q - kv) / 4,
    "table_negative_index": lambda s, b, h, q, kv: s + TABLE[h % 5, (q - kv).clamp(-7, 6)],
    "table_select": lambda s, b, h, q, kv: s + TABLE[2][(q + kv) % 7],
    "table_transposed_unsqueezed": lambda s, b, h, q, kv: s + TABLE.t()[(q - kv) % 7, h % 5]
    + TABLE.unsqueeze(0)[0, h % 5, kv % 7],
    "slopes_abs": lambda s, b, h, q, kv: s - SLOPES[h] * (q - kv).abs(),
    "where_tanh_sigmoid": lambda s, b, h, q, kv: torch.where(q > kv, torch.tanh(s), torch.sigmoid(s) * 2),
    "exp_log": lambda s, b, h, q, kv: torch.log1p(torch.exp(s)) - torch.log(1.0 + (q - kv).abs().float()),
    "sqrt_rsqrt_pow": lambda s, b, h, q, kv: s * torch.rsqrt(1.0 + (q * q).float()) + torch.sqrt(s.abs()) + s ** 2,
    "clamp_min_max": lambda s, b, h, q, kv: torch.clamp(s, min=-1.0, max=1.5) + torch.maximum(q, kv) * 0.01,
    "sign_floor_ceil": lambda s, b, h, q, kv: torch.sign(s) * torch.floor(s) + torch.ceil(s * 0.3),
    "bool_logic": lambda s, b, h, q, kv: torch.where(((q > 0) & (kv < 3)) | ~(b == 1), s, -s),
    "cast_to_float64": lambda s, b, h, q, kv: s.to(torch.float64) * 1.5 + b,
    "sin_cos_expm1": lambda s, b, h, q, kv: torch.sin(s) + torch.cos(s * 0.5) + torch.expm1(s * 0.1),
    "reciprocal_neg_minimum": lambda s, b, h, q, kv: -torch.minimum(s, 1.0 / (1.0 + s * s)),
    "add_sub_alpha_rsub": lambda s, b, h, q, kv: torch.add(s, q, alpha=0.5) - torch.sub(kv, s, alpha=2) + (1 - s),
    "where_of_constants": lambda s, b, h, q, kv: s * torch.where(q > kv, 2, 3) + torch.where(q < kv, 1.5, 0.0),
}


def _points(n=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(n, generator=g) * 3
    b = torch.randint(0, 3, (n,), generator=g)
    h = torch.randint(0, 6, (n,), generator=g)
    q = torch.randint(-40, 41, (n,), generator=g)
    kv = torch.randint(-40, 41, (n,), generator=g)
    return s, b, h, q, kv


def _compiled(fn, *args, **kwargs):
    out = torch.empty(len(args[0]), dtype=torch.float32)
    mod_check._run_points(mod_check._score_points, torch.device("cpu"), *args[:1],
                          *(t.to(torch.int32) for t in args[1:]), out, *kwargs["tables"], FN=fn, N=len(args[0]))
    return out


@pytest.mark.parametrize("name", sorted(OPERATOR_MODS))
def test_each_operator_matches_pytorch(name):
    mod = OPERATOR_MODS[name]
    mods = mod_codegen.fused_mods(mod, None, torch.device("cpu"))
    s, b, h, q, kv = _points()
    tables = list(mods.tensors) + [s] * (mod_codegen.MAX_CAPTURED - len(mods.tensors))
    s_leaf = s.clone().requires_grad_(True)
    expected = mod(s_leaf, b, h, q, kv).float()
    (slope,) = torch.autograd.grad(expected.sum(), s_leaf)
    got = _compiled(mods.score, s, b, h, q, kv, tables=tables)
    got_slope = _compiled(mods.score_grad, s, b, h, q, kv, tables=tables)
    torch.testing.assert_close(got, expected.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_slope, slope, rtol=1e-5, atol=1e-5)


# --- whole problems against the float64 oracle ---------------------------------------------

def test_alibi_on_a_causal_dilated_line(reference_calls):
    _check((40,), (9,), dilation=2, causal=True, score_mod=alibi(torch.rand(4, dtype=torch.float64) + 0.1))
    assert reference_calls == []


def test_mask_and_score_mods_with_rpb_on_a_strided_plane(reference_calls):
    _check((9, 10), (3, 5), stride=(1, 2), rpb=True, mask_mod=checkerboard, score_mod=gated)
    assert reference_calls == []


def test_mods_with_softcap_on_a_volume_causal_in_time(reference_calls):
    _check((3, 4, 5), (3, 3, 3), causal=(True, False, False), softcap=4.0, mask_mod=checkerboard,
           score_mod=alibi(torch.rand(4, dtype=torch.float64)), heads=2, kv_heads=2)
    assert reference_calls == []


def test_mods_on_shifted_windows(reference_calls):
    _check((8, 8), (4, 4), pattern="window", shift=(2, 2), score_mod=gated, heads=3, kv_heads=1,
           head_dim=16, value_dim=32)
    assert reference_calls == []


def test_mods_see_additional_tokens_past_the_grid(reference_calls):
    tokens = 30

    def mask(b, h, q, kv):
        return per_head_extras(b, h, q, kv, tokens)

    _check((5, 6), (3, 3), extra=5, mask_mod=mask, score_mod=gated)
    assert reference_calls == []


def test_rows_the_mask_empties_give_zero_and_no_gradient(reference_calls):
    finite = _check((25,), (7,), heads=3, kv_heads=3, mask_mod=sparse_rows)
    assert not finite.all() and finite.any()
    assert reference_calls == []


def test_bfloat16():
    _check((7, 9), (3, 5), dtype=torch.bfloat16, score_mod=gated, mask_mod=checkerboard, head_dim=32)


@pytest.mark.parametrize("seed", range(18100, 18106))
def test_tiny_random_problems_with_mods(seed):
    """tests/tiny_random.py's problems (every pattern option, rpb, softcap, scales, additional
    tokens, losses on the output, the LSE or their sums) with a score_mod and / or a mask_mod."""
    assert tiny_random_check(seed, "triton", mods=True) == "OK"


def test_batch_slices_pass_the_callers_batch_index(monkeypatch):
    monkeypatch.setattr(batch_slices, "MAX_GRID_BATCH", 2)

    def by_batch(s, b, h, q, kv):
        return s + 0.7 * b * (q > kv)

    _check((12,), (5,), batch=5, score_mod=by_batch)


def test_captured_tables_are_read_at_every_call():
    table = torch.randn(4, 32)

    def score_mod(s, b, h, q, kv):
        return s + table[h, (q - kv) % 32]

    q, k, v = (torch.randn(1, 16, 4, 16) for _ in range(3))
    first = haloattn.attention(q, k, v, 5, score_mod=score_mod, backend="triton")
    table.mul_(-2.0)
    second = haloattn.attention(q, k, v, 5, score_mod=score_mod, backend="triton")
    expected = haloattn.attention(q.double(), k.double(), v.double(), 5, score_mod=score_mod, backend="reference")
    assert not torch.allclose(first, second)
    assert relative_error(second, expected) < FLOAT32_TOLERANCE


def test_dispatch_prefers_the_fused_kernels():
    q = torch.randn(1, 12, 2, 16)
    assert haloattn.explain(q, q, q, 5, score_mod=gated, mask_mod=checkerboard).chosen == "triton"


# --- mods that cannot be compiled: named reasons, the reference runs them ------------------------

def _triton_reasons(**kwargs):
    q = torch.randn(1, 12, 2, 16)
    explanation = haloattn.explain(q, q, q, 5, **kwargs)
    return next(v for v in explanation.verdicts if v.name == "triton").reasons, explanation.chosen


def test_data_dependent_control_flow_is_a_reason():
    def branchy(s, b, h, q, kv):
        return s * 2 if bool((s > 0).all()) else s

    reasons, chosen = _triton_reasons(score_mod=branchy)
    assert len(reasons) == 1 and "could not be traced" in reasons[0] and "control flow" in reasons[0]
    assert chosen == "reference"


@pytest.mark.parametrize("mod,words", [
    (lambda s, b, h, q, kv: torch.erf(s), "aten.erf"),
    (lambda s, b, h, q, kv: s ** 2.5, "pow with exponent 2.5"),
    (lambda s, b, h, q, kv: s + TABLE[h % 5].sum(), "indexing a captured tensor of 2 dims with 1 indices"),
    (lambda s, b, h, q, kv: s.to(torch.bfloat16).float(), "arithmetic in torch.bfloat16"),
])
def test_operators_without_a_translation_are_named(mod, words):
    reasons, _ = _triton_reasons(score_mod=mod)
    assert len(reasons) == 1 and words in reasons[0], reasons


def test_more_captured_tensors_than_places():
    tables = [torch.randn(16) for _ in range(mod_codegen.MAX_CAPTURED + 1)]

    def many(s, b, h, q, kv):
        return s + sum(t[q % 16] for t in tables)

    reasons, _ = _triton_reasons(score_mod=many)
    assert len(reasons) == 1 and f"more than {mod_codegen.MAX_CAPTURED} captured tensors" in reasons[0]


@pytest.mark.parametrize("operator,wrong,mod,named", [
    ("mul", "({0} + {1})", lambda s, b, h, q, kv: s * 1.5, "score_mod: the compiled code disagrees"),
    # The derivative is traced through torch.func.grad and checked by autograd: a wrong rule shows.
    ("tanh_backward", "({0} * (1.0 + {1} * {1}))", lambda s, b, h, q, kv: torch.tanh(s) * 2.0,
     "score_mod's derivative: the compiled code disagrees"),
])
def test_a_translation_that_disagrees_is_a_reason(monkeypatch, operator, wrong, mod, named):
    right = mod_codegen._BINARY[operator]
    monkeypatch.setitem(mod_codegen._BINARY, operator, wrong)  # a deliberately wrong translation
    mod_codegen._fused_mods.cache_clear()
    mod_check.checked_mods.cache_clear()
    try:
        reasons, chosen = _triton_reasons(score_mod=mod)
    finally:
        monkeypatch.setitem(mod_codegen._BINARY, operator, right)
        mod_codegen._fused_mods.cache_clear()
        mod_check.checked_mods.cache_clear()
    assert len(reasons) == 1 and named in reasons[0], reasons
    assert chosen == "reference"


def test_kq_conv_declines_mods():
    reasons, _ = _triton_reasons(score_mod=gated, kq_conv=torch.randn(2, 2, 3))
    assert any(r.startswith("score_mod / mask_mod with kq_conv") for r in reasons)


def test_the_generated_source_is_readable():
    mods = mod_codegen.fused_mods(alibi(SLOPES), checkerboard, torch.device("cpu"))
    assert "@triton.jit\ndef score_mod(" in mods.source and "def mask_mod(" in mods.source
    assert "ops.gather(T0" in mods.source and len(mods.tensors) == 1 and mods.tensors[0] is SLOPES


def test_a_score_mod_that_sends_whole_rows_to_minus_infinity(reference_calls):
    # Flex's idiom for masking inside a score_mod: rows whose every score is -inf have no
    # probability mass (output 0, LSE -inf) and no gradient, never NaN.
    def rows_off(s, b, h, q_idx, kv_idx):
        return torch.where((q_idx % 4 == 1) | (kv_idx == q_idx + 1), float("-inf"), s)

    finite = _check((6, 7), (3, 3), heads=2, kv_heads=1, score_mod=rows_off)
    assert not finite.all()
    assert reference_calls == []


def test_a_mod_that_raises_on_the_sample_pairs_is_a_reason():
    table = torch.randn(3)

    def too_short(s, b, h, q_idx, kv_idx):
        return s + table[q_idx]  # indexes past the table for most queries: PyTorch raises

    reasons, chosen = _triton_reasons(score_mod=too_short)
    assert len(reasons) == 1 and "could not be compiled and checked (IndexError" in reasons[0], reasons


@pytest.mark.parametrize("spatial,window,shape,options", [
    ((7, 6), (3, 3), dict(extra=2, batch=2, rpb=True), dict(score_mod=gated, mask_mod=checkerboard, softcap=4.0)),
    ((12,), 5, dict(heads=4, kv_heads=2), dict(causal=True, dilation=2, score_mod=alibi(torch.rand(4) + 0.1))),
])
def test_forward_mode_tangents_with_mods(reference_calls, spatial, window, shape, options):
    """torch.func.jvp through the fused tangent kernel with the mods compiled in, against
    torch.func.jvp of the float64 oracle (every input moving)."""
    from test_jvp import assert_close, jvp_both, make_primals

    primals, gen = make_primals(spatial, window, **shape)
    ours, ref = jvp_both(primals, gen, tuple(primals), window, dtype=torch.float32, backend="triton", **options)
    assert_close(ours, ref, torch.float32)
    assert reference_calls == []
