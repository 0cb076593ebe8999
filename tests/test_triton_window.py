"""Backend ``triton_window`` on CPU through Triton's interpreter, against the float64 oracle:
forward, LSE and every gradient (query, key, value, rpb) for each window feature."""

import os
import zlib

import pytest
import torch

# Without a GPU the kernels run in Triton's interpreter, which must be chosen before they are
# defined (at their first import). tests/test_window_gpu.py reuses check_against_oracle on CUDA.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import haloattn  # noqa: E402

import oracle  # noqa: E402

pytest.importorskip("triton")

BACKEND = "triton_window"


def _per_axis(value, rank):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * rank


def check_against_oracle(spatial, window, *, dtype=torch.float32, heads=2, kv_heads=None, head_dim=16,
                         value_dim=None, batch=1, rpb=True, grad_lse=True, packed=False, device="cpu",
                         **options):
    """Run the backend and the oracle on fresh random inputs; compare output, LSE and gradients."""
    options = dict(pattern="window", **options)
    kv_heads = kv_heads or heads
    value_dim = value_dim or head_dim
    gen = torch.Generator().manual_seed(zlib.crc32(repr((spatial, window, dtype, heads, head_dim, options)).encode()))

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    if packed:
        # q, k, v as strided views of one [B, *spatial, 3, H, D] projection, as Swin produces them.
        qkv = randn(batch, *spatial, 3, heads, head_dim).requires_grad_(True)
        q, k, v = qkv.unbind(-3)
        leaves = [qkv]
    else:
        q = randn(batch, *spatial, heads, head_dim).requires_grad_(True)
        k = randn(batch, *spatial, kv_heads, head_dim).requires_grad_(True)
        v = randn(batch, *spatial, kv_heads, value_dim).requires_grad_(True)
        leaves = [q, k, v]
    table = None
    if rpb:
        shape = (heads,) + tuple(2 * w - 1 for w in _per_axis(window, len(spatial)))
        table = (torch.randn(*shape, generator=gen) * 0.5).to(device).requires_grad_(True)
        leaves.append(table)

    out, lse = haloattn.attention(q, k, v, window, rpb=table, return_lse=True, backend=BACKEND, **options)
    grad_out = randn(*out.shape)
    grad_lse_in = torch.randn(lse.shape, generator=gen).to(device) if grad_lse else torch.zeros_like(lse)
    grads = torch.autograd.grad((out * grad_out).sum() + (lse * grad_lse_in).sum(), leaves)

    ref_leaves = [t.detach().cpu().double().requires_grad_(True) for t in leaves]
    if packed:
        rq, rk, rv = ref_leaves[0].unbind(-3)
    else:
        rq, rk, rv = ref_leaves[:3]
    ref_table = ref_leaves[-1] if rpb else None
    ref_out, ref_lse = oracle.attention(rq, rk, rv, window, rpb=ref_table, **options)
    ref_grads = torch.autograd.grad(
        (ref_out * grad_out.cpu().double()).sum() + (ref_lse * grad_lse_in.cpu().double()).sum(), ref_leaves
    )

    tol = oracle.TOLERANCE[dtype]
    assert out.dtype == dtype and out.shape == ref_out.shape
    out, lse, grads = out.cpu(), lse.cpu(), [g.cpu() for g in grads]
    assert oracle.rel_error(out, ref_out) < tol, f"output: {oracle.rel_error(out, ref_out):.2e}"
    assert (lse.double() - ref_lse).abs().max().item() < oracle.LSE_TOLERANCE[dtype], "lse"
    names = ["qkv"] if packed else ["query", "key", "value"]
    names += ["rpb"] if rpb else []
    for name, got, ref in zip(names, grads, ref_grads):
        assert oracle.rel_error(got, ref) < tol, f"gradient of {name}: {oracle.rel_error(got, ref):.2e}"


CASES = {
    # name: (spatial, window, options)
    "1d_blocks": ((8,), 4, {}),
    "1d_shift_ragged": ((11,), 4, dict(shift=2)),
    "2d_swin_shift": ((6, 6), 3, dict(shift=1)),
    "2d_partial_edges": ((7, 5), (3, 2), dict(shift=(2, 1))),
    "2d_grid_attention": ((8, 6), (2, 3), dict(dilation=(4, 2))),
    "2d_dilation_ragged_shift": ((7, 6), (3, 2), dict(dilation=(2, 2), shift=(1, 0))),
    "2d_causal_axis": ((6, 6), 3, dict(causal=(True, False), shift=1)),
    "3d_video": ((4, 5, 6), (2, 3, 3), dict(shift=(1, 1, 2))),
    "3d_causal_time": ((4, 4, 4), 2, dict(causal=(True, False, False), shift=(0, 1, 1))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_window_features_float32(name):
    spatial, window, options = CASES[name]
    check_against_oracle(spatial, window, **options)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    check_against_oracle((6, 7), 3, dtype=dtype, shift=1)


def test_head_dim_30_like_swinir():
    check_against_oracle((6, 6), 3, head_dim=30, value_dim=30, shift=1)


def test_gqa_and_value_dim():
    check_against_oracle((6, 6), 3, heads=4, kv_heads=2, head_dim=16, value_dim=32, shift=1)


def test_packed_qkv_views_read_in_place():
    check_against_oracle((6, 6), 3, packed=True, shift=1, batch=2)


def test_softcap_and_scale():
    check_against_oracle((6, 6), 3, shift=1, softcap=1.5, scale=0.7)


def test_without_rpb_or_lse_gradient():
    check_against_oracle((6, 6), 3, shift=2, rpb=False, grad_lse=False)


def test_float32_rpb_under_half_inputs():
    # rpb is a float32 parameter while q/k/v are 16-bit (autocast); its gradient stays float32.
    check_against_oracle((4, 4), 2, dtype=torch.float16, shift=1)


def test_chosen_automatically_for_window_pattern():
    q = torch.randn(1, 6, 6, 2, 16)
    explanation = haloattn.explain(q, q, q, 3, pattern="window", shift=1, verbose=False)
    assert explanation.chosen == BACKEND


def _reasons(monkeypatch=None, **kwargs):
    from haloattn.backends.triton.window_plugin import TritonWindowBackend

    spatial = kwargs.pop("spatial", (32, 32))
    dtype = kwargs.pop("dtype", torch.float32)
    q = torch.randn(1, *spatial, 2, 16, dtype=dtype)
    problem = haloattn.build_problem(q, q, q, kwargs.pop("window", 7), **kwargs)
    return TritonWindowBackend().not_supported_reasons(problem)


def test_reasons_are_precise(monkeypatch):
    assert _reasons(pattern="window") == []
    assert _reasons() == ["pattern 'neighborhood' runs on backend 'triton'"]
    assert _reasons(pattern="window", window=(16, 32)) == [
        "window 16x32 has 512 tokens > 256: the neighbourhood kernel (backend 'triton') runs it"
    ]
    assert _reasons(pattern="window", dtype=torch.float64) == ["float64 runs on the reference backend"]
    assert _reasons(pattern="window", score_mod=lambda s, b, h, q, k: s) == [
        "score_mod is not supported here: backend 'triton' compiles it into its kernels where its operators "
        "allow (else the flex backend runs it on CUDA, the reference backend elsewhere)"
    ]
    extra = torch.randn(1, 3, 2, 16)
    assert _reasons(pattern="window", additional_keys=extra, additional_values=extra) == [
        "additional_keys/additional_values are not supported here: backend 'triton' runs them"
    ]
    assert _reasons(spatial=(64,), pattern="window", kq_conv=torch.randn(2, 2, 3)) == [
        "kq_conv is not supported here: backend 'triton' runs it (its own kernels), the reference backend "
        "where triton cannot"
    ]
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    (reason,) = _reasons(pattern="window")
    assert reason.startswith("device cpu: Triton runs on CUDA devices (set TRITON_INTERPRET=1")


def test_windows_over_the_square_tile_limit_run_the_long_kernels(monkeypatch):
    # Long windows run the long-window kernels (cut into parts; tests/test_triton_window_long.py
    # covers them): shrink the limits so a tiny window (20 tokens: two parts of 16) takes that path.
    from haloattn.backends.triton import window_launch, window_long_launch

    monkeypatch.setattr(window_launch, "SQUARE_TILE_MAX", 16)
    monkeypatch.setattr(window_long_launch, "MAX_PART", 16)
    check_against_oracle((8, 9), (4, 5), shift=(2, 3), batch=2)


def test_long_windows_route_to_the_neighbourhood_kernel():
    if "triton" not in haloattn.backends():
        pytest.skip("backend 'triton' is not installed")
    q = torch.randn(1, 32, 64, 2, 16)
    explanation = haloattn.explain(q, q, q, (16, 32), pattern="window", shift=(8, 0), verbose=False)
    assert explanation.chosen == "triton"


def test_batch_elements_beyond_int32_offsets_are_refused():
    # The kernels index inside one batch element with int32: a view spanning more must raise
    # (naming the span) rather than wrap around, and the plugin must decline such grids up front.
    from haloattn.backends.triton import window_launch
    from haloattn.backends.triton.window_plugin import TritonWindowBackend
    from haloattn.problem import build_problem

    fits = torch.empty_strided((2, 8, 8, 2, 16), (2048, 256, 32, 16, 1), device="meta")
    assert window_launch.batch_element_span(fits) == 2048
    window_launch._check_int32(fits)
    # A [B, 2, 2, 1, 16] view whose first spatial stride is 2^31 elements spans more than int32 covers.
    wide = torch.empty_strided((1, 2, 2, 1, 16), (2**33, 2**31, 2**29, 16, 1), device="meta")
    assert window_launch.batch_element_span(wide) > window_launch.INT32_LIMIT
    with pytest.raises(ValueError, match="int32"):
        window_launch._check_int32(wide)

    huge = torch.empty(1, 2048, 2048, 16, 64, device="meta")
    reasons = TritonWindowBackend().not_supported_reasons(build_problem(huge, huge, huge, 8, pattern="window"))
    assert any("int32 offsets" in r and "backend 'triton' runs it" in r for r in reasons), reasons
    small = torch.empty(1, 64, 64, 16, 64, device="meta")
    reasons = TritonWindowBackend().not_supported_reasons(build_problem(small, small, small, 8, pattern="window"))
    assert not any("int32" in r for r in reasons), reasons


def test_windows_whose_kernels_exceed_shared_memory_go_to_the_neighbourhood_kernel():
    """Measured sm_90 shared memory of the window kernels against a GPU's per-block limit."""
    from haloattn.backends.triton.window_plugin import shared_memory_reasons

    h100, small_gpu = 227 * 1024, 99 * 1024

    def reasons(window, dtype, head_dim, limit):
        q = torch.empty(1, 24, 24, 2, head_dim, dtype=dtype, device="meta")
        return shared_memory_reasons(haloattn.build_problem(q, q, q, window, pattern="window"), limit)

    assert reasons(12, torch.float16, 32, h100) == []  # Swin V2 / Swin-B 384 in 16-bit
    assert reasons(10, torch.float16, 128, h100) == []  # 224 KiB: just fits
    assert reasons(7, torch.float32, 128, h100) == []
    # Long windows (the part kernels) fit in float32 and at head_dim 128 too.
    assert reasons(12, torch.float32, 32, h100) == []
    assert reasons(12, torch.bfloat16, 128, h100) == []
    assert reasons(16, torch.float32, 128, h100) == []  # backward 224 KiB
    (reason,) = reasons(10, torch.float32, 96, h100)  # padded to 128 slots and 128 channels
    assert reason == ("window 10x10 (100 tokens) in float32 with head_dim 96 needs 320 KiB of shared memory per "
                      "block, more than this GPU's 227 KiB: the neighbourhood kernel (backend 'triton') runs it")
    assert reasons(12, torch.float32, 128, small_gpu)  # 224 KiB on a 99 KiB GPU
    assert reasons(8, torch.float16, 128, small_gpu)  # 104 KiB on a 99 KiB GPU
    assert reasons(8, torch.float16, 64, small_gpu) == []


@pytest.mark.parametrize("windows", [(1, 7, 7), (4, 8, 8), (1, 1, 200)])
def test_bias_table_gradient_equals_a_scatter_add(windows):
    """The bias tile's gradient folded into the table axis by axis equals a plain scatter-add of
    every (query slot, key slot) gradient into its table entry; tile slots past the window's
    tokens carry nothing. (A 4x8x8 window's dense one-hot fold took 826 MB.)"""
    import math
    import types

    from haloattn.backends.triton import window_launch

    block = max(16, 1 << (math.prod(windows) - 1).bit_length())
    heads = 3
    dbias = torch.randn(heads, block, block)
    rpb = torch.randn(heads, *(2 * w - 1 for w in windows))
    index, inside = window_launch._build_bias_index(windows, block, torch.device("cpu"))
    expected = torch.zeros(heads, rpb[0].numel(), dtype=torch.float64)
    expected.index_add_(1, index[inside], dbias[:, inside].double())
    got = window_launch.table_gradient(dbias, rpb, types.SimpleNamespace(windows=windows, block=block))
    assert got.dtype == rpb.dtype and got.shape == rpb.shape
    assert oracle.rel_error(got, expected.view(rpb.shape)) <= 1e-6
