"""Which dQ passes the triton backend's default config gives the Gluon kernel (tiles.py's rule), its
boxes, how tuning and stored configs see the choice, and that a config naming it runs the Triton
dQ kernel where the Gluon one cannot run (here: the CPU interpreter), with the oracle's gradients.
The kernel itself is tested on the GPU (test_gluon_dq_gpu.py) and built for sm_90 in CI
(test_gluon_probes.py)."""

import math

import pytest
import torch

pytest.importorskip("triton")

from haloattn.backends.triton import gluon_dq_launch, launch, tiles  # noqa: E402

from test_gluon_forward import _problem  # noqa: E402
from test_triton_gpu import check_against_oracle  # noqa: E402


# Where the Gluon pass ran the backward 1.03-1.07x the Triton dQ kernel's (H100, 2026-12-07 14:46
# UTC): 128 channels, walks of 16 key tiles and more.
@pytest.mark.parametrize("spatial,window,options", [
    ((128, 128), 31, {}), ((128, 128), 63, {}), ((128, 128), 31, dict(causal=(True, False))),
    ((16, 48, 48), (7, 15, 15), {}), ((16, 48, 48), (7, 15, 15), dict(causal=(True, False, False))),
    ((32768,), 2047, {}), ((128, 128), 32, dict(stride=16)), ((200, 200), 41, dict(heads=8, kv_heads=8)),
    ((16384,), 4096, dict(causal=True, heads=32, kv_heads=8)),
])
def test_default_dq_is_gluon_on_long_walks_at_128_channels(spatial, window, options):
    problem = _problem(spatial, window, **options)
    assert tiles.default_config.__wrapped__(problem)["dq"]["gluon"]
    boxes = tiles.gluon_dq_boxes(problem)
    # the whole walk (both consumers on every key tile) of 128-query boxes, 64-key tiles
    assert not boxes.split_walk and math.prod(boxes.q) == 128
    assert math.prod(boxes.kv) == tiles.GLUON_DQ_KEYS[problem.head_dim] == 64


@pytest.mark.parametrize("spatial,window,options", [
    ((128, 128), 16, dict(stride=16)),  # 0.99x: walks of 4 key tiles
    ((64, 64), 16, dict(pattern="window", shift=8)),  # 0.91x: 6 tiles
    ((128, 128), 31, dict(head_dim=64)),  # 0.96x
    ((128, 128), 31, dict(dilation=2)),  # dilation, bias, softcap, float32, other widths: none in the kernel
    ((128, 128), 63, dict(softcap=20.0)),
    ((128, 128), 63, dict(dtype=torch.float32)),
    ((128, 128), 63, dict(head_dim=32)),
    ((32768,), 2047, dict(head_dim=256)),
    ((5, 7), 3, {}),  # fewer than 128 tokens: no box of the kernel's size
])
def test_default_dq_stays_triton(spatial, window, options):
    problem = _problem(spatial, window, **options)
    assert not tiles.default_config.__wrapped__(problem)["dq"]["gluon"]


def test_default_dq_stays_triton_off_hopper(monkeypatch):
    """wgmma is sm_90's alone: another GPU's default is the Triton dQ kernel."""
    monkeypatch.setattr(tiles, "hopper_for_gluon", lambda device: False)
    assert not tiles.default_config.__wrapped__(_problem((128, 128), 63))["dq"]["gluon"]


def test_tuning_weighs_it_where_the_default_leaves_it_out():
    problem = _problem((128, 128), 31, head_dim=64)
    base = tiles.default_config(problem)
    assert not base["dq"]["gluon"] and tiles.gluon_dq_problem(problem)
    assert any(c["dq"] == dict(base["dq"], gluon=True) for c in tiles.candidate_configs(problem))


def test_tuning_weighs_the_triton_kernels_against_it():
    problem = _problem((128, 128), 31)
    base = tiles.default_config(problem)
    candidates = tiles.candidate_configs(problem)
    assert candidates[0] == base and base["dq"]["gluon"]
    assert any(c["dq"] == dict(base["dq"], gluon=False) for c in candidates)
    # every other dQ part is a Triton one: its knobs (tiles, warps, stages) are Triton's
    assert all(not c["dq"]["gluon"] for c in candidates if c["dq"] != base["dq"])


def test_stored_configs_keep_their_choice_and_older_ones_take_the_default():
    problem = _problem((128, 128), 31)
    dq = tiles.default_config(problem)["dq"]
    older = {"dq": {k: v for k, v in dq.items() if k != "gluon"}}
    assert tiles.normalise(older, problem)["dq"]["gluon"]
    assert not tiles.normalise({"dq": dict(dq, gluon=False)}, problem)["dq"]["gluon"]


def test_interpreter_runs_the_triton_kernel_a_gluon_config_names(monkeypatch):
    """Gluon has no interpreter: under it (and on CPU tensors) the config's Triton dQ kernel runs,
    writing the statistics rows the dK/dV pass reads, and the gradients are the oracle's."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not gluon_dq_launch.inputs_fit(*(torch.zeros(1, 8, 16, 1, 64, dtype=torch.bfloat16),) * 5)
    default = tiles.default_config
    monkeypatch.setattr(tiles, "default_config",
                        lambda p, **kw: dict(default(p, **kw), dq=dict(default(p, **kw)["dq"], gluon=True)))
    planned = []
    plan = gluon_dq_launch.plan
    monkeypatch.setattr(gluon_dq_launch, "plan", lambda *args: planned.append(plan(*args)) or planned[-1])
    launch._BACKWARD_PLANS.clear()
    check_against_oracle((8, 16), (3, 5), dtype=torch.bfloat16, heads=1, head_dim=64, seed=3)
    launch._BACKWARD_PLANS.clear()
    assert planned == [None]
