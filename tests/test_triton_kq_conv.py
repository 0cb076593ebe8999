"""Backend ``triton``'s key-query convolution (kq_conv_kernel, kq_conv_backward) on CPU through
Triton's interpreter, against the float64 oracle: every pattern option of rank 1, GQA, D_v != D,
softcap, scale, the LSE's gradient, kernels with and without reach along the keys, walks over many
key tiles, rpb and additional tokens with their gradients, and the launcher's own pieces (band
matrices, halo spills, tiles refitted to shared memory, limits)."""

import pytest
import torch

pytest.importorskip("triton")

import haloattn  # noqa: E402
from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.reference import attend  # noqa: E402
from haloattn.backends.triton import batch_slices, fast_launch, kq_conv_launch  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402
from triton.runtime.errors import OutOfResources  # noqa: E402

import oracle  # noqa: E402
from kq_conv_check import check_kq_conv, kq_conv_inputs  # noqa: E402
from tiny_random import check as tiny_random_check  # noqa: E402


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def reference_backward_calls(monkeypatch):
    """Calls of the reference backend's backward: none may come from a fused call."""
    calls = []
    original = attend.backward

    def counted(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(attend, "backward", counted)
    return calls


@pytest.mark.parametrize("length,window,options", [
    (40, 9, dict()),
    (41, 9, dict(causal=True, kernel=(6, 11), grad_lse=False)),
    (37, 7, dict(stride=2, dilation=2, heads=4, kv_heads=2, kernel=(4, 3))),
    (35, 8, dict(pattern="window", shift=3, softcap=2.0, batch=2)),
    (30, 6, dict(pattern="window", causal=True, dilation=3, kernel=(2, 7))),
    (70, 21, dict(kernel=(2, 41), head_dim=20, value_dim=24)),  # reach 20: halos of 32 columns
    (66, 13, dict(kernel=(1, 1), scale=0.0, heads=3, kv_heads=1)),  # no shift, no reach: no halos
    (12, 5, dict(kernel=(5, 3), stride=3, causal=True)),
], ids=["plain", "causal-mta-kernel", "stride-dilation-gqa", "window-shift-softcap", "window-causal-dilated",
        "wide-reach-dv", "1x1-scale0-mqa", "short-grid-many-shifts"])
def test_against_the_oracle(reference_backward_calls, length, window, options):
    check_kq_conv(length, window, **options)
    assert reference_backward_calls == []  # fused


@pytest.mark.parametrize("seed", range(17100, 17106))
def test_tiny_random_problems(seed):
    """tests/tiny_random.py's rank-1 problems with a kernel of 1-6 x 1-11 (random scales, losses
    on the output, the LSE or their sums, rpb, softcap, additional tokens)."""
    assert tiny_random_check(seed, "triton", kq_conv=True) == "OK"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit(reference_backward_calls, dtype):
    check_kq_conv(90, 31, dtype=dtype, causal=True, kernel=(6, 11), heads=2, kv_heads=1, head_dim=32)
    assert reference_backward_calls == []


def test_a_frozen_bias_stays_fused(reference_backward_calls):
    check_kq_conv(45, 11, rpb=True, frozen=("rpb",), dilation=2, softcap=3.0)
    assert reference_backward_calls == []


@pytest.mark.parametrize("options", [dict(), dict(causal=True, dilation=2), dict(pattern="window", shift=2)])
def test_the_bias_gradient(reference_backward_calls, options):
    check_kq_conv(45, 11, rpb=True, softcap=3.0, heads=3, kv_heads=1, **options)
    assert reference_backward_calls == []


@pytest.mark.parametrize("options", [dict(causal=True, rpb=True), dict(softcap=2.0, heads=4, kv_heads=2, value_dim=24)])
def test_additional_tokens(reference_backward_calls, options):
    check_kq_conv(33, 9, extra=5, **options)
    assert reference_backward_calls == []


def test_batches_past_the_grid_limit_run_in_slices(monkeypatch):
    """More batch entries than a grid axis holds (65535; here 2) run slice by slice, the kernel's
    and the bias' gradients summed over slices."""
    monkeypatch.setattr(batch_slices, "MAX_GRID_BATCH", 2)
    check_kq_conv(20, 5, batch=5, rpb=True, extra=2)


def _direct(length, window, config, dtype=torch.float32, **options):
    """The launchers called with ``config``, against the oracle: out, LSE, dq, dk, dv, dW."""
    leaves, gen = kq_conv_inputs(length, window, dtype=dtype, **{k: options.pop(k) for k in list(options)
                                                                  if k in ("kernel", "heads", "kv_heads")})
    q, k, v, w = (leaves[n].detach() for n in ("query", "key", "value", "kq_conv"))
    problem = build_problem(q, k, v, window, kq_conv=w, return_lse=True, **options)
    inputs = AttentionInputs(q, k, v, None, w)
    out, lse = kq_conv_launch.forward(problem, inputs, config)
    grad_out = torch.randn(out.shape, generator=gen).to(dtype)
    needs = (True, True, True, False, True, False, False)
    dq, dk, dv, _, dw, _, _ = kq_conv_launch.backward(problem, inputs, out, lse, grad_out, None, needs, config)

    ref = [t.double().requires_grad_(True) for t in (q, k, v, w)]
    ref_out, ref_lse = oracle.attention(ref[0], ref[1], ref[2], window, kq_conv=ref[3], **options)
    ref_grads = torch.autograd.grad((ref_out * grad_out.double()).sum(), ref)
    for name, got, want in zip(("out", "dq", "dk", "dv", "dW"), (out, dq, dk, dv, dw), (ref_out, *ref_grads)):
        assert oracle.rel_error(got, want) <= oracle.TOLERANCE[dtype], name
    assert (lse.double() - ref_lse).abs().max() <= oracle.LSE_TOLERANCE[dtype]


@pytest.mark.parametrize("length,window,options", [
    (100, 41, dict()),
    (100, 41, dict(causal=True, dilation=2)),
    (100, 41, dict(pattern="window", shift=5)),
    (160, 81, dict()),  # most tiles inside every window: no per-pair masks there (all_attended)
    (160, 81, dict(causal=True, stride=3)),
])
def test_walks_over_many_small_tiles(length, window, options):
    """16-row, 16-column tiles: every program walks several key tiles, the backward's key tiles
    spill into both neighbours, source tiles take dC from the next tile, and on the longer windows
    most tiles' sources and targets are all attended."""
    small = {"kq": {"block_m": 16, "block_n": 16, "warps": 1, "stages": 1},
             "kq_bwd": {"block_m": 16, "block_n": 16, "warps": 1, "stages": 1}}
    _direct(length, window, small, kernel=(4, 9), heads=2, kv_heads=1, **options)


def test_tiles_refitted_when_triton_refuses_them(monkeypatch):
    """A kernel refused for its shared memory runs again on smaller tiles (the next call starts
    from them): the forward drops its prefetch stage, then narrows its key tiles; the backward
    halves its rows."""
    refused = []
    refusals = {"kq_conv_forward_kernel": 2, "dq_dw_kernel": 1}
    original = fast_launch.resolve

    def resolve(fn):
        launcher = original(fn)

        class Refusing:
            def __getitem__(self, grid):
                run = launcher[grid]

                def launch(*args, **kwargs):
                    if sum(r[0] == fn.__name__ for r in refused) < refusals.get(fn.__name__, 0):
                        named = dict(zip(fn.arg_names, args), **kwargs)
                        refused.append((fn.__name__, named["BM"], named["BN"], named["num_stages"]))
                        raise OutOfResources(300000, 232448, "shared memory")
                    return run(*args, **kwargs)
                return launch
        return Refusing()

    monkeypatch.setattr(fast_launch, "resolve", resolve)
    fast_launch.clear_plans()
    config = {"kq": {"block_m": 32, "block_n": 32, "warps": 4, "stages": 2},
              "kq_bwd": {"block_m": 32, "block_n": 32, "warps": 4, "stages": 1}}
    _direct(50, 15, config, kernel=(3, 5))
    assert refused == [("kq_conv_forward_kernel", 32, 32, 2), ("kq_conv_forward_kernel", 32, 32, 1),
                       ("dq_dw_kernel", 32, 32, 1)]
    fitted = {key[-1]: tiles for key, tiles in kq_conv_launch._FITTED.items()}
    assert fitted["forward"] == {"block_m": 32, "block_n": 16, "warps": 4, "stages": 1}
    assert fitted["backward"] == {"block_m": 16, "block_n": 32, "warps": 4, "stages": 1}
    fast_launch.clear_plans()


def test_band_matrices_convolve_along_the_keys():
    """S0 over a key tile and its halos times a kernel row's band matrix is that row's
    cross-correlation along the keys (SEMANTICS.md section 6, centred)."""
    gen = torch.Generator().manual_seed(3)
    heads, c_q, c_k, block_n, halo = 2, 3, 7, 16, 16
    weight = torch.randn(heads, c_q, c_k, generator=gen, dtype=torch.float64)
    bands = kq_conv_launch.toeplitz_bands(weight, block_n, halo, torch.float64)
    assert bands.shape == (heads, c_q, block_n + 2 * halo, block_n)
    s0 = torch.randn(5, block_n + 2 * halo, generator=gen, dtype=torch.float64)  # columns n0 - halo ...
    reach = (c_k - 1) // 2
    for h in range(heads):
        for a in range(c_q):
            want = torch.stack([sum(weight[h, a, t] * s0[:, halo + j - reach + t] for t in range(c_k))
                                for j in range(block_n)], 1)
            torch.testing.assert_close(s0 @ bands[h, a], want, rtol=1e-12, atol=1e-12)


def test_halo_parts_land_in_the_neighbouring_columns():
    gen = torch.Generator().manual_seed(4)
    B, L, Hkv, D, BN, halo = 2, 45, 3, 5, 16, 16
    tiles = -(-L // BN)
    dk = torch.randn(B, L, Hkv, D, generator=gen)
    spill = torch.randn(B, Hkv, tiles, 2, halo, D, generator=gen)
    want = dk.clone()
    for t in range(tiles):
        for u in range(halo):
            for side, col in ((0, t * BN - halo + u), (1, (t + 1) * BN + u)):
                if 0 <= col < L:
                    want[:, col] += spill[:, :, t, side, u].permute(0, 1, 2)
    got = kq_conv_launch._with_spills(dk, spill, BN, halo)
    torch.testing.assert_close(got, want)


def test_limits_and_forward_mode(monkeypatch):
    q = torch.randn(1, 40, 2, 16)
    for kernel, words in (((17, 3), "c_q=17"), ((2, 131), "c_k=131")):
        explanation = haloattn.explain(q, q, q, 9, kq_conv=torch.randn(2, *kernel), verbose=False)
        verdict = next(v for v in explanation.verdicts if v.name == "triton")
        assert any(words in r for r in verdict.reasons), verdict.reasons
        assert explanation.chosen == "reference"
    explanation = haloattn.explain(q, q, q, 9, kq_conv=torch.randn(2, 6, 11), verbose=False)
    assert explanation.chosen == "triton"
    problem = build_problem(q, q, q, 9, kq_conv=torch.randn(2, 6, 11))
    backend = haloattn.dispatch.DISPATCHER.get("triton")
    assert backend.jvp_not_supported_reasons(problem)
