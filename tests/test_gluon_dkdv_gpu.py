"""The triton backend's Gluon dK/dV pass (gluon_dkdv_kernel.py) on a Hopper GPU, against the float64
oracle: random problems of every rank, window, stride, causal axis, both patterns (with shifts),
GQA, batches, odd lengths, both 16-bit dtypes and 64 or 128 channels, every gradient (with an LSE
gradient too); the Triton dK/dV kernel where the call's tensors do not suit the Gluon one; the
same gradients as the Triton kernel on the issue's sizes. Run with ``pytest -m gpu``."""

import random

import pytest
import torch

import haloattn
from test_gluon_forward_gpu import counted_launches, random_gluon_problem
from test_triton_gpu import check_against_oracle

from haloattn.backends.triton import fast_launch, gluon_dkdv_launch, tiles

gpu = pytest.mark.gpu
needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                  reason="needs an sm_90 GPU (Hopper)")
pytestmark = [gpu, needs_hopper]


def with_gluon_dkdv(default, gluon: bool):
    """``default`` (tiles.default_config) with the dK/dV pass on 64-token tiles (the Gluon kernel's:
    tiles.gluon_dkdv_tiles) named Gluon or Triton by ``gluon``."""

    def config(problem, **kw):
        base = default(problem, **kw)
        ext = tiles.group_extents(problem)
        dkdv = dict(base["dkdv"], q=tiles.fit(base["dkdv"]["q"], ext, tiles.GLUON_DKDV_TOKENS),
                    kv=tiles.fit(base["dkdv"]["kv"], ext, tiles.GLUON_DKDV_TOKENS), gluon=gluon)
        return dict(base, dkdv=dkdv)

    return config


@pytest.fixture
def gluon_calls(monkeypatch):
    """Every default config names the Gluon dK/dV pass on its tiles (where its problem suits it);
    yields the list of Gluon launches made."""
    monkeypatch.setattr(tiles, "default_config", with_gluon_dkdv(tiles.default_config, True))
    yield from counted_launches(monkeypatch, gluon_dkdv_launch.GluonKeyMajor)


@pytest.mark.parametrize("seed", range(16))
def test_random_problems_against_the_oracle(seed, gluon_calls):
    options = random_gluon_problem(random.Random(7000 + seed))
    spatial, window = options.pop("spatial"), options.pop("window")
    options["head_dim"] = tiles.GLUON_DKDV_HEAD_DIMS[seed % 2]
    dtype = (torch.bfloat16, torch.float16)[(seed // 2) % 2]
    check_against_oracle(spatial, window, dtype=dtype, device="cuda", seed=seed, **options)
    assert gluon_calls, "the Gluon dK/dV pass did not run"


@pytest.mark.parametrize("spatial,window,options", [
    ((20, 24), (7, 9), {}),
    ((300,), 65, dict(causal=True, heads=4, kv_heads=1)),
    ((6, 8, 10), (3, 5, 5), dict(stride=(1, 2, 1), causal=(True, False, False))),
    ((16, 16), 8, dict(pattern="window", shift=4)),
    ((16, 16), 16, dict(stride=16, head_dim=64)),
])
def test_listed_features_against_the_oracle(spatial, window, options, gluon_calls):
    options.setdefault("head_dim", 128)
    check_against_oracle(spatial, window, dtype=torch.bfloat16, device="cuda", **options)
    assert gluon_calls, "the Gluon dK/dV pass did not run"


def test_a_plan_runs_again_on_new_tensors(gluon_calls):
    """The second call of a problem reuses the first one's launch plan, its descriptors rebased
    onto the new tensors."""
    for seed in (1, 2):
        check_against_oracle((12, 20), (5, 9), dtype=torch.bfloat16, device="cuda", head_dim=128, seed=seed)
    assert len(gluon_calls) == 2


def test_heads_not_back_to_back_take_the_triton_kernel(gluon_calls):
    """Heads interleaved with another axis cannot merge into one descriptor axis: the Triton dK/dV
    kernel of the same config runs, and the gradients are the oracle's."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(1, 2, 16, 24, 64, device="cuda", generator=gen, dtype=torch.bfloat16)
               .permute(0, 2, 3, 1, 4).requires_grad_(True) for _ in range(3))
    out = haloattn.attention(q, k, v, (7, 9), backend="triton")
    grads = torch.autograd.grad(out.float().square().sum(), (k, v))
    assert not gluon_calls
    ref_in = [t.detach().double().cpu().requires_grad_(True) for t in (q, k, v)]
    ref = haloattn.attention(*ref_in, (7, 9), backend="reference")
    ref_grads = torch.autograd.grad(ref.square().sum(), ref_in[1:])
    for got, want in zip(grads, ref_grads):
        assert ((got.double().cpu() - want).norm() / want.norm()).item() < 2e-2


@pytest.mark.parametrize("spatial,window,options", [
    ((64, 64), 31, {}), ((8, 24, 24), (5, 11, 11), {}), ((8192,), 1023, dict(causal=True)),
    ((64, 64), 16, dict(stride=16)),
])
def test_same_gradients_as_the_triton_kernel(spatial, window, options, monkeypatch):
    """Issue-sized problems, too large for the oracle: dK and dV of the Gluon pass against the Triton
    kernel's on the same tiles (itself checked against the oracle in test_triton_gpu.py)."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(2, *spatial, 4, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
               .requires_grad_(True) for _ in range(3))
    grad_out = torch.randn(q.shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    default = tiles.default_config
    results = {}
    for gluon in (True, False):
        monkeypatch.setattr(tiles, "default_config", with_gluon_dkdv(default, gluon))
        fast_launch.clear_plans()
        out = haloattn.attention(q, k, v, window, backend="triton", **options)
        results[gluon] = torch.autograd.grad(out, (k, v), grad_out)
    fast_launch.clear_plans()
    for got, want in zip(results[True], results[False]):
        assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 5e-3
