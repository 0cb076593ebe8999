"""Which forwards the triton backend's default config gives the Gluon kernel (tiles.py's rule), how
tuning and stored configs see the choice, and that a config naming it runs the Triton forward
where the Gluon kernel cannot run (here: the CPU interpreter), with the oracle's results. The
kernel itself is tested on the GPU (test_gluon_forward_gpu.py) and built for sm_90 in CI
(test_gluon_probes.py)."""

import pytest
import torch

pytest.importorskip("triton")

from haloattn.backends.triton import gluon_forward_launch, launch, tiles  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

from test_triton_gpu import check_against_oracle  # noqa: E402


def _problem(spatial, window, head_dim=128, dtype=torch.bfloat16, heads=16, kv_heads=16, **options):
    q = torch.empty(1, *spatial, heads, head_dim, dtype=dtype, device="meta")
    k = torch.empty(1, *spatial, kv_heads, head_dim, dtype=dtype, device="meta")
    return build_problem(q, k, k, window, **options)


# Where the Gluon forward ran 1.06-1.28x the Triton forward (H100, 2026-12-06 19:08 UTC): the
# issue's 128-channel rows and off-list ones; the dilation-2 row regrouped one group deep (1.20x,
# 2026-12-07 23:04 UTC); long walks at 64 channels (1.07-1.09x, 23:07 UTC).
@pytest.mark.parametrize("spatial,window,options", [
    ((128, 128), 31, {}), ((128, 128), 63, {}), ((128, 128), 31, dict(causal=(True, False))),
    ((128, 128), 31, dict(dilation=2)), ((128, 128), 63, dict(head_dim=64)), ((32768,), 2047, dict(head_dim=64)),
    ((16384,), 4096, dict(causal=True, heads=32, kv_heads=8, head_dim=64)),
    ((16, 48, 48), (7, 15, 15), {}), ((32768,), 2047, {}), ((128, 128), 32, dict(stride=16)),
    ((16384,), 4096, dict(causal=True, heads=32, kv_heads=8)), ((200, 200), 41, dict(heads=8, kv_heads=8)),
    ((12, 40, 36), (5, 17, 15), dict(causal=(True, False, False), stride=(1, 2, 1), heads=8, kv_heads=8)),
])
def test_default_forward_is_gluon_on_the_issue_rows(spatial, window, options):
    problem = _problem(spatial, window, **options)
    assert tiles.default_config.__wrapped__(problem)["fwd"]["gluon"]


@pytest.mark.parametrize("spatial,window,options", [
    ((128, 128), 31, dict(head_dim=64)),  # 0.97x at 64 channels (walks of 3 x 3 128-key tiles)
    ((16, 48, 48), (7, 15, 15), dict(head_dim=64)),  # 0.90x at 64 channels
    ((128, 128), 31, dict(head_dim=32)),  # no Gluon kernel at 32 channels
    ((90, 75), (13, 21), dict(heads=8, kv_heads=2)),  # 0.75x: 128 x 128 boxes waste pairs
    ((4096,), 255, {}),  # 0.89x: walks of 3 tiles, where the program's own steps tell
    ((128, 128), 16, dict(stride=16)),  # 1.01x: one-window walks (a tie)
    ((56, 56), 7, {}),  # a small window: the same waste
    ((128, 128), 31, dict(softcap=20.0)),  # bias, softcap, float32: the kernel has none
    ((128, 128), 31, dict(dtype=torch.float32)),
    ((50,), 31, {}),  # boxes of at most 64 tokens (powers of two over the grid)
])
def test_default_forward_stays_triton(spatial, window, options):
    problem = _problem(spatial, window, **options)
    assert not tiles.default_config.__wrapped__(problem)["fwd"]["gluon"]


def _gluon_candidates(problem) -> list:
    return [c["fwd"]["exp2_split"] for c in tiles.candidate_configs(problem) if c["fwd"]["gluon"]]


def test_gluon_forward_is_a_candidate_where_the_default_leaves_it():
    assert _gluon_candidates(_problem((128, 128), 16, stride=16)) == [0]


def test_gluon_forward_at_64_channels_is_a_candidate_without_its_exp2_split(monkeypatch):
    # where the default leaves it (31x31 at 64 channels); the exp2 split ran no faster than
    # without on any 64-channel problem timed (GLUON_EXP2_SPLIT)
    problem = _problem((128, 128), 31, head_dim=64)
    assert set(_gluon_candidates(problem)) == {0}
    monkeypatch.setattr(tiles, "GLUON_EXP2_SPLIT", True)
    assert set(_gluon_candidates(problem)) == {0, *tiles.EXP2_SPLIT_CHOICES}


def test_gluon_forward_boxes_keep_the_token_thin_box_rule():
    """The Triton kernels' boxes follow the window's proportions (tiles.THIN_RELATIVE_TO_WINDOW),
    the Gluon forward's do not: under that rule the 3-D issue row's Gluon tiling moved to 8x2x8
    query boxes past 1x16x8 key boxes and ran 1.19x slower (H100, 2026-12-07)."""
    assert tiles.THIN_RELATIVE_TO_WINDOW
    tiling = tiles.gluon_forward_boxes(_problem((16, 48, 48), (7, 15, 15)))
    assert (tiling.q, tiling.kv, tiling.split_walk) == ((2, 8, 8), (8, 2, 8), True)
    anisotropic = tiles.default_config.__wrapped__(_problem((128, 128), (3, 63)))
    assert not anisotropic["fwd"]["gluon"] and anisotropic["fwd"]["q"] == [2, 32]


def test_gluon_forward_is_no_candidate_where_it_cannot_run():
    for problem in (_problem((128, 128), 31, head_dim=32), _problem((128, 128), 31, dtype=torch.float32),
                    _problem((128, 128), 31, softcap=20.0)):
        assert not any(c["fwd"]["gluon"] for c in tiles.candidate_configs(problem))


# The split walk where it computes enough fewer pairs to outrun its unpipelined first tiles (H100,
# 2026-12-07 06:51 UTC: 1.11x the whole walk on the 3-D row), else the whole walk (0.92-0.96x
# with the same pairs on the 2-D rows, 0.98x on 3-D causal time).
@pytest.mark.parametrize("spatial,window,options,split_walk", [
    ((16, 48, 48), (7, 15, 15), {}, True), ((128, 128), 31, {}, False), ((128, 128), 63, {}, False),
    ((16, 48, 48), (7, 15, 15), dict(causal=(True, False, False)), False), ((32768,), 2047, {}, False),
])
def test_default_gluon_walk(spatial, window, options, split_walk):
    tiling = tiles.gluon_forward_boxes(_problem(spatial, window, **options))
    assert tiling.split_walk == split_walk
    assert tiles.GLUON_RING_SLOTS[tiling.split_walk, torch.Size(tiling.kv).numel()] == (3 if split_walk else 2)


def test_default_forward_stays_triton_off_hopper(monkeypatch):
    """wgmma is sm_90's alone: another GPU's default is the Triton forward."""
    monkeypatch.setattr(tiles, "hopper_for_gluon", lambda device: False)
    assert not tiles.default_config.__wrapped__(_problem((128, 128), 63))["fwd"]["gluon"]


def test_tuning_weighs_the_triton_forwards_against_it():
    problem = _problem((128, 128), 31)
    base = tiles.default_config(problem)
    candidates = tiles.candidate_configs(problem)
    assert candidates[0] == base and base["fwd"]["gluon"]
    displaced = dict(base["fwd"], gluon=False)
    assert any(c["fwd"] == displaced for c in candidates)
    # every other forward is a Triton one: its knobs (tiles, warps, stages) are Triton's
    assert all(not c["fwd"]["gluon"] for c in candidates if c["fwd"] != base["fwd"])
    assert sum(not c["fwd"]["gluon"] for c in candidates) > 5


def test_stored_configs_keep_their_choice_and_older_ones_take_the_default():
    problem = _problem((128, 128), 31)
    fwd = tiles.default_config(problem)["fwd"]
    older = {"fwd": {k: v for k, v in fwd.items() if k != "gluon"}}
    assert tiles.normalise(older, problem)["fwd"]["gluon"]
    assert not tiles.normalise({"fwd": dict(fwd, gluon=False)}, problem)["fwd"]["gluon"]


@pytest.mark.parametrize("kinds", [[(False, 128)], [(True, 128)], [(True, 64)], [(True, 64), (True, 128)],
                                   [(False, 128), (True, 128)]])
def test_gluon_boxes_hold_128_queries_and_a_key_tile_of_a_weighed_size(kinds):
    saved = tiles.gluon_forward_tiling()
    tiles.set_gluon_forward_tiling({kind: tiles.GLUON_FORWARD_SPEED for kind in kinds})
    try:
        for problem in (_problem((128, 128), 31), _problem((16, 48, 48), (7, 15, 15)), _problem((300,), 65)):
            tiling = tiles.gluon_forward_boxes(problem)
            assert torch.Size(tiling.q).numel() == 128 and (tiling.split_walk, torch.Size(tiling.kv).numel()) in kinds
            # the cut halves the box along an axis of at least two queries
            assert tiling.q[tiling.split] >= 2
        assert tiles.gluon_forward_boxes(_problem((50,), 5)) is None  # 64 tokens at most a box
    finally:
        tiles.set_gluon_forward_tiling(*saved)


@pytest.mark.parametrize("spatial,window,dilation", [((128, 128), 31, 2), ((96, 120), (21, 33), (3, 2)),
                                                     ((128, 96), (17, 9), (2, 1))])
def test_regrouped_dilated_boxes_hold_one_dilation_group(spatial, window, dilation):
    """A dilated problem's regrouping (gluon_regroup.py) has a window-1 axis per dilated axis but
    the last (the dilation group): each consumer's queries and each key tile are one group deep
    there, as queries of two groups share no key (the dilation-2 issue row: 1.50 computed pairs
    per attended pair on the whole walk, not the 2.70 of boxes spanning both groups). The split
    walk may cut a box of two groups between its consumers."""
    from haloattn.backends.triton.gluon_regroup import regrouped
    saved = tiles.gluon_forward_tiling()
    tiles.set_gluon_forward_tiling(tiles.GLUON_FORWARD_SPEEDS, regroup_dilated=True)
    try:
        problem = _problem(spatial, window, dilation=dilation)
        groups = [i for i, axis in enumerate(regrouped(problem).problem.axes) if axis.window == 1]
        tiling = tiles.gluon_forward_boxes(problem)
        consumer = [t // 2 if i == tiling.split and tiling.split_walk else t for i, t in enumerate(tiling.q)]
        assert groups and all(consumer[i] == 1 and tiling.kv[i] == 1 for i in groups), tiling
    finally:
        tiles.set_gluon_forward_tiling(*saved)


def test_interpreter_runs_the_triton_forward_a_gluon_config_names(monkeypatch):
    """Gluon has no interpreter: under it (and on CPU tensors) the config's Triton forward runs, and
    the results are the oracle's."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not gluon_forward_launch.inputs_fit(*(torch.zeros(1, 8, 16, 1, 128, dtype=torch.bfloat16),) * 3)
    default = tiles.default_config
    monkeypatch.setattr(tiles, "default_config",
                        lambda p, **kw: dict(default(p, **kw), fwd=dict(default(p, **kw)["fwd"], gluon=True)))
    launch._GLUON_PLANS.clear()
    check_against_oracle((8, 16), (3, 5), dtype=torch.bfloat16, heads=1, head_dim=128, seed=3)
    assert set(launch._GLUON_PLANS.values()) == {launch.TRITON_FORWARD}


def _plan(problem, heads=16):
    """The Gluon launch plan of a problem on meta tensors (``_problem``'s shapes)."""
    spatial = [a.length for a in problem.axes]
    q, k, out = (torch.empty(1, *spatial, heads, 128, dtype=torch.bfloat16, device="meta") for _ in range(3))
    lse = torch.empty(1, *spatial, heads, dtype=torch.float32, device="meta")
    return gluon_forward_launch.GluonForward(problem, q, k, k, out, lse)


@pytest.mark.parametrize("name,persistent", [("whole", True), ("whole-per-box", False), ("whole3", False),
                                             ("split128x3", False)])
def test_persistent_grid_where_a_second_box_fits(name, persistent):
    """The whole walk on two ring slots runs a program a multiprocessor, each walking 15 or 16
    boxes with two query slots a consumer (the next box's queries load during this one), dealt by
    gluon_schedule.py; where the
    ring leaves no room for them (three slots), or the tiling asks for it, a program a box."""
    saved = tiles.gluon_forward_tiling()
    tiles.use_gluon_tiling(name)
    try:
        problem = _problem((128, 128), 31)
        plan = _plan(problem)
        items = 16 * 16 * 16 // 2  # 128-query boxes of a 128 x 128 grid, times 16 heads
        assert plan.grid == ((132, ) if persistent else (items, ))
        assert plan.meta.get("QBUFS", 1) == (2 if persistent else 1)
        assert plan.scalars[-2:] == [items // 16, 16]  # boxes a head, heads
        if persistent:  # a row a program: its count of boxes, then the boxes
            table, stride = plan.schedule
            assert table.shape == (132, stride) and table.dtype == torch.int32  # (on the meta device here)
    finally:
        tiles.set_gluon_forward_tiling(*saved)


def test_persistent_grid_never_exceeds_the_work(monkeypatch):
    monkeypatch.setattr(tiles, "GLUON_PERSISTENT_PROGRAMS", 1000)
    saved = tiles.gluon_forward_tiling()
    tiles.use_gluon_tiling("whole")
    try:
        assert _plan(_problem((128, 128), 31)).grid == (1000, )
        assert _plan(_problem((64, 64), 31, heads=2, kv_heads=2), heads=2).grid == (64, )  # 32 boxes, 2 heads
    finally:
        tiles.set_gluon_forward_tiling(*saved)
