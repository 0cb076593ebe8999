"""The triton backend's Gluon forward (gluon_forward_kernel.py) on a Hopper GPU, against the
float64 oracle: random problems of every rank, window, stride, causal axis, both patterns (with
shifts), GQA, batches, odd lengths and both 16-bit dtypes, forward, LSE and the backward that runs
on its LSE; the Triton forward where the call's tensors do not suit the Gluon kernel; the same
outputs as the Triton forward on the issue's sizes. Run with ``pytest -m gpu``."""

import random

import pytest
import torch

import haloattn
from test_triton_gpu import check_against_oracle

from haloattn.backends.triton import fast_launch, gluon_forward_launch, tiles

gpu = pytest.mark.gpu
needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                  reason="needs an sm_90 GPU (Hopper)")
pytestmark = [gpu, needs_hopper]
D = tiles.GLUON_FORWARD_HEAD_DIM


@pytest.fixture
def gluon_calls(monkeypatch):
    """Every default config names the Gluon forward (where its problem suits it: the flag is read
    with tiles.gluon_forward_problem); yields the list of Gluon launches made."""
    default = tiles.default_config
    monkeypatch.setattr(tiles, "default_config",
                        lambda p, **kw: dict(default(p, **kw), fwd=dict(default(p, **kw)["fwd"], gluon=True)))
    yield from counted_launches(monkeypatch, gluon_forward_launch.GluonForward)


def counted_launches(monkeypatch, plan_class):
    """The grids of every launch of ``plan_class`` (a Gluon launch plan) while the caller's
    fixture is active, launch plans made afresh before and after (a generator to ``yield from``)."""
    calls = []
    run = plan_class.__call__

    def counted(self, *tensors):
        calls.append(self.grid)
        return run(self, *tensors)

    monkeypatch.setattr(plan_class, "__call__", counted)
    fast_launch.clear_plans()
    yield calls
    fast_launch.clear_plans()


@pytest.fixture(params=["whole", "whole-per-box", "split128", "split128x3", "split64"])
def tiling(request):
    """Each tiling of the Gluon forward in turn (its choice of boxes and cut by the cost model; the
    whole walk on its persistent grid and on a program a box)."""
    saved = tiles.gluon_forward_tiling()
    tiles.use_gluon_tiling(request.param)
    fast_launch.clear_plans()
    yield request.param
    tiles.set_gluon_forward_tiling(*saved)
    fast_launch.clear_plans()


def random_gluon_problem(rng: random.Random, head_dim: int = D) -> dict:
    """A random problem the Gluon kernel takes: at least 128 tokens on the grid, 128 channels
    (or ``head_dim``)."""
    rank = rng.choice((1, 2, 3))
    pattern = rng.choice(("neighborhood", "neighborhood", "window"))
    while True:
        spatial = {1: lambda: [rng.randint(128, 700)], 2: lambda: [rng.randint(6, 30) for _ in range(2)],
                   3: lambda: [rng.randint(3, 10) for _ in range(3)]}[rank]()
        if 128 <= torch.Size(spatial).numel() <= 640:
            break
    window = [rng.randint(1 if pattern == "window" else 2, L) for L in spatial]
    heads = rng.choice((1, 2, 4))
    options = dict(spatial=tuple(spatial), window=tuple(window), pattern=pattern,
                   causal=tuple(rng.random() < 0.3 for _ in spatial), heads=heads,
                   kv_heads=rng.choice([h for h in (1, 2, 4) if heads % h == 0]), batch=rng.choice((1, 2)),
                   head_dim=head_dim)
    if pattern == "window":
        options["shift"] = tuple(rng.randint(0, K - 1) for K in window)
    else:
        options["stride"] = tuple(rng.randint(1, K) for K in window)
    return options


@pytest.mark.parametrize("seed", range(16))
def test_random_problems_against_the_oracle(seed, gluon_calls):
    options = random_gluon_problem(random.Random(4000 + seed))
    spatial, window = options.pop("spatial"), options.pop("window")
    dtype = (torch.bfloat16, torch.float16)[seed % 2]
    check_against_oracle(spatial, window, dtype=dtype, device="cuda", seed=seed, **options)
    assert gluon_calls, "the Gluon forward did not run"


@pytest.mark.parametrize("seed", range(10))
def test_random_problems_at_64_channels(seed, gluon_calls, monkeypatch):
    # not the default there, nor yet a tuning candidate (tiles.GLUON_FORWARD_HEAD_DIMS)
    monkeypatch.setattr(tiles, "GLUON_FORWARD_HEAD_DIMS", (64, 128))
    options = random_gluon_problem(random.Random(4100 + seed), head_dim=64)
    spatial, window = options.pop("spatial"), options.pop("window")
    dtype = (torch.bfloat16, torch.float16)[seed % 2]
    check_against_oracle(spatial, window, dtype=dtype, device="cuda", seed=seed, **options)
    assert gluon_calls, "the Gluon forward did not run"


@pytest.mark.parametrize("every", [2, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("spatial,window,options", [
    ((20, 24), (7, 9), {}), ((6, 8, 10), (3, 5, 5), dict(causal=(True, False, False)))])
def test_exp2_split_against_the_oracle(spatial, window, options, head_dim, every, monkeypatch):
    # one exp2 in ``every`` on the FMA pipe (exp2_split.py; off in the Gluon forward until this
    # test has passed: tiles.GLUON_EXP2_SPLIT)
    monkeypatch.setattr(tiles, "GLUON_EXP2_SPLIT", True)
    monkeypatch.setattr(tiles, "GLUON_FORWARD_HEAD_DIMS", (64, 128))
    default = tiles.default_config
    monkeypatch.setattr(tiles, "default_config", lambda p, **kw: dict(
        default(p, **kw), fwd=dict(default(p, **kw)["fwd"], gluon=True, exp2_split=every)))
    launches = counted_launches(monkeypatch, gluon_forward_launch.GluonForward)
    calls = next(launches)
    check_against_oracle(spatial, window, dtype=torch.bfloat16, device="cuda", head_dim=head_dim, **options)
    assert calls, "the Gluon forward did not run"
    next(launches, None)  # (the launch plans made afresh after)


@pytest.mark.parametrize("spatial,window,options", [
    ((20, 24), (7, 9), {}),
    ((300,), 65, dict(causal=True, heads=4, kv_heads=1)),
    ((6, 8, 10), (3, 5, 5), dict(stride=(1, 2, 1), causal=(True, False, False))),
    ((16, 16), 8, dict(pattern="window", shift=4)),
])
def test_listed_features_against_the_oracle(spatial, window, options, gluon_calls):
    check_against_oracle(spatial, window, dtype=torch.bfloat16, device="cuda", head_dim=D, **options)
    assert gluon_calls, "the Gluon forward did not run"


@pytest.mark.parametrize("seed", range(10))
def test_each_tiling_against_the_oracle(seed, tiling, gluon_calls):
    """Random problems on each tiling: the split walk's halves, cut along any axis, on 64- and
    128-key tiles, and the whole walk."""
    options = random_gluon_problem(random.Random(7000 + seed))
    spatial, window = options.pop("spatial"), options.pop("window")
    check_against_oracle(spatial, window, dtype=(torch.bfloat16, torch.float16)[seed % 2], device="cuda",
                         seed=seed, **options)
    assert gluon_calls, "the Gluon forward did not run"


@pytest.mark.parametrize("seed", range(8))
def test_few_persistent_programs_walk_many_boxes(seed, gluon_calls, monkeypatch):
    """Three programs on the whole walk's persistent grid, so each walks many boxes of one or
    several heads and batches (walks of different lengths at the grid's edges and causal axes),
    the ring's position running on across them and each query slot reused every other box."""
    monkeypatch.setattr(tiles, "GLUON_PERSISTENT_PROGRAMS", 3)
    saved = tiles.gluon_forward_tiling()
    tiles.use_gluon_tiling("whole")
    try:
        options = random_gluon_problem(random.Random(9000 + seed))
        spatial, window = options.pop("spatial"), options.pop("window")
        options.update(heads=4, batch=2)
        check_against_oracle(spatial, window, dtype=(torch.bfloat16, torch.float16)[seed % 2], device="cuda",
                             seed=seed, **options)
    finally:
        tiles.set_gluon_forward_tiling(*saved)
    assert gluon_calls and all(grid == (3, ) for grid in gluon_calls), gluon_calls


@pytest.mark.parametrize("spatial,window,options", [
    ((16, 24), (5, 7), dict(dilation=2)),  # 3-D regrouped: (8, 2, 12), heads x 2
    ((384,), 33, dict(dilation=3, causal=True, heads=4, kv_heads=2)),
    ((4, 8, 12), (3, 3, 5), dict(dilation=(1, 1, 2), stride=(1, 2, 1))),
    ((12, 20), (4, 9), dict(dilation=(3, 1), pattern="window", shift=(1, 4))),
])
def test_dilated_problems_regrouped_against_the_oracle(spatial, window, options, tiling, gluon_calls):
    """Dilated problems run as their undilated regrouping (gluon_regroup.py) over views."""
    check_against_oracle(spatial, window, dtype=torch.bfloat16, device="cuda", head_dim=D, **options)
    assert gluon_calls, "the Gluon forward did not run"


@pytest.mark.parametrize("spatial,window,options", [
    ((4, 256), (1, 31), {}),  # axial rows: boxes 1 x 128 on the whole walk
    ((136, 5), (17, 1), dict(causal=(True, False), heads=4, kv_heads=2)),  # axial columns, causal
    ((3, 20, 40), (1, 5, 9), {}),  # per-frame windows
])
def test_window_one_axes_against_the_oracle(spatial, window, options, tiling, gluon_calls):
    """Axial and per-frame windows (window 1 on some axes), whose boxes are one token deep there
    (tiles._shapes), on each tiling."""
    check_against_oracle(spatial, window, dtype=torch.bfloat16, device="cuda", head_dim=D, **options)
    assert gluon_calls, "the Gluon forward did not run"


@pytest.mark.parametrize("spatial,window,options", [
    ((16, 16), 8, dict(pattern="window", shift=0)),  # halves in different windows: no shared tile
    ((150,), 16, dict(pattern="window", causal=True)),  # the last box's second half past the grid's end
    ((9, 30), (3, 29), dict(causal=(True, False), stride=(3, 1))),
])
def test_split_walk_edges_against_the_oracle(spatial, window, options, tiling, gluon_calls):
    check_against_oracle(spatial, window, dtype=torch.bfloat16, device="cuda", head_dim=D, **options)
    assert gluon_calls, "the Gluon forward did not run"


def test_a_plan_runs_again_on_new_tensors(gluon_calls):
    """The second call of a problem reuses the first one's launch plan, its descriptors rebased
    onto the new tensors."""
    for seed in (1, 2):
        check_against_oracle((12, 20), (5, 9), dtype=torch.bfloat16, device="cuda", head_dim=D, seed=seed)
    assert len(gluon_calls) == 2


def test_heads_not_back_to_back_take_the_triton_forward(gluon_calls):
    """Heads interleaved with another axis cannot merge into one descriptor axis: the Triton forward
    of the same config runs (read through pointers), and the result is the oracle's."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(1, 2, 16, 24, D, device="cuda", generator=gen, dtype=torch.bfloat16).permute(0, 2, 3, 1, 4)
               for _ in range(3))
    out = haloattn.attention(q, k, v, (7, 9), backend="triton")
    assert not gluon_calls
    ref = haloattn.attention(*(t.double().cpu() for t in (q, k, v)), (7, 9), backend="reference")
    assert ((out.double().cpu() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("spatial,window,options", [
    ((64, 64), 31, {}), ((8, 24, 24), (5, 11, 11), {}), ((8192,), 1023, dict(causal=True)),
])
def test_same_outputs_as_the_triton_forward(spatial, window, options, monkeypatch):
    """Issue-sized problems, too large for the oracle: the Gluon forward's output and LSE against the
    Triton forward's (itself checked against the oracle above and in test_triton_gpu.py)."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(2, *spatial, 4, D, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    default = tiles.default_config
    results = {}
    for gluon in (True, False):
        monkeypatch.setattr(tiles, "default_config",
                            lambda p, g=gluon, **kw: dict(default(p, **kw), fwd=dict(default(p, **kw)["fwd"], gluon=g)))
        fast_launch.clear_plans()
        results[gluon] = haloattn.attention(q, k, v, window, backend="triton", return_lse=True, **options)
    fast_launch.clear_plans()
    (out, lse), (ref, ref_lse) = results[True], results[False]
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 5e-3
    assert (lse - ref_lse).abs().max().item() < 2e-2
