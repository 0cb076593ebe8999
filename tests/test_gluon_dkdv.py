"""Which dK/dV passes the triton backend's default config gives the Gluon kernel (tiles.py's rule),
how tuning and stored configs see the choice, and that a config naming it runs the Triton kernel
where the Gluon one cannot run (here: the CPU interpreter), with the oracle's gradients. The kernel
itself is tested on the GPU (test_gluon_dkdv_gpu.py) and built for sm_90 in CI
(test_gluon_probes.py)."""

import pytest
import torch

pytest.importorskip("triton")

from haloattn.backends.triton import gluon_dkdv_launch, launch, tiles  # noqa: E402

from test_gluon_forward import _problem  # noqa: E402
from test_triton_gpu import check_against_oracle  # noqa: E402


# Where the Gluon pass ran the backward 1.00-1.06x the Triton kernel's (H100, 2026-12-06 22:29 UTC):
# programs of GLUON_DKDV_MIN_STEPS steps or more.
@pytest.mark.parametrize("spatial,window,options", [
    ((128, 128), 63, {}), ((16, 48, 48), (7, 15, 15), {}), ((16, 48, 48), (7, 15, 15), dict(head_dim=64)),
    ((16, 48, 48), (7, 15, 15), dict(causal=(True, False, False))), ((200, 200), 41, dict(heads=8, kv_heads=8)),
    ((16384,), 4096, dict(causal=True, heads=32, kv_heads=8)),
])
def test_default_dkdv_is_gluon_on_long_walks(spatial, window, options):
    problem = _problem(spatial, window, **options)
    dkdv = tiles.default_config.__wrapped__(problem)["dkdv"]
    assert dkdv["gluon"] and tiles.gluon_dkdv_tiles(problem, dkdv)
    assert tiles.key_major_steps(problem, dkdv["kv"], dkdv["q"]) >= tiles.GLUON_DKDV_MIN_STEPS


@pytest.mark.parametrize("spatial,window,options", [
    ((128, 128), 16, dict(stride=16)),  # 0.81x: walks of 4 steps
    ((64, 64), 17, {}),  # 0.95x: 9 steps
    ((128, 128), 31, {}),  # 0.99x: 23 steps
    ((128, 128), 32, dict(stride=16)),  # 0.89x: 16 steps
    ((128, 128), 31, dict(dilation=2)),  # dilation, bias, softcap, float32, other widths: none in the kernel
    ((128, 128), 63, dict(softcap=20.0)),
    ((128, 128), 63, dict(dtype=torch.float32)),
    ((128, 128), 63, dict(head_dim=32)),
    ((32768,), 2047, dict(head_dim=256)),
])
def test_default_dkdv_stays_triton(spatial, window, options):
    problem = _problem(spatial, window, **options)
    assert not tiles.default_config.__wrapped__(problem)["dkdv"]["gluon"]


def test_default_dkdv_stays_triton_off_hopper(monkeypatch):
    """wgmma is sm_90's alone: another GPU's default is the Triton dK/dV kernel."""
    monkeypatch.setattr(tiles, "hopper_for_gluon", lambda device: False)
    assert not tiles.default_config.__wrapped__(_problem((128, 128), 63))["dkdv"]["gluon"]


def test_tuning_weighs_the_triton_kernels_against_it():
    problem = _problem((128, 128), 63)
    base = tiles.default_config(problem)
    candidates = tiles.candidate_configs(problem)
    assert candidates[0] == base and base["dkdv"]["gluon"]
    assert any(c["dkdv"] == dict(base["dkdv"], gluon=False) for c in candidates)
    # every other dK/dV part is a Triton one: its knobs (tiles, warps, stages) are Triton's
    assert all(not c["dkdv"]["gluon"] for c in candidates if c["dkdv"] != base["dkdv"])


def test_stored_configs_keep_their_choice_and_older_ones_take_the_default():
    problem = _problem((128, 128), 63)
    dkdv = tiles.default_config(problem)["dkdv"]
    older = {"dkdv": {k: v for k, v in dkdv.items() if k != "gluon"}}
    assert tiles.normalise(older, problem)["dkdv"]["gluon"]
    assert not tiles.normalise({"dkdv": dict(dkdv, gluon=False)}, problem)["dkdv"]["gluon"]


def test_interpreter_runs_the_triton_kernel_a_gluon_config_names(monkeypatch):
    """Gluon has no interpreter: under it (and on CPU tensors) the config's Triton dK/dV kernel
    runs, and the gradients are the oracle's."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not gluon_dkdv_launch.inputs_fit(*(torch.zeros(1, 8, 16, 1, 64, dtype=torch.bfloat16),) * 7)
    default = tiles.default_config
    monkeypatch.setattr(tiles, "default_config",
                        lambda p, **kw: dict(default(p, **kw), dkdv=dict(default(p, **kw)["dkdv"], gluon=True)))
    planned = []
    plan = gluon_dkdv_launch.plan
    monkeypatch.setattr(gluon_dkdv_launch, "plan", lambda *args: planned.append(plan(*args)) or planned[-1])
    launch._BACKWARD_PLANS.clear()
    check_against_oracle((8, 16), (3, 5), dtype=torch.bfloat16, heads=1, head_dim=64, seed=3)
    launch._BACKWARD_PLANS.clear()
    assert planned == [None]
