"""Backend ``triton`` (fused neighbourhood kernels) on CPU through Triton's interpreter, against the
float64 oracle: forward, LSE and every gradient for each feature, on tiny problems.

The interpreter is switched on only around this module's tests (the backend interprets its
kernels whenever TRITON_INTERPRET=1 at launch, however they were defined), so other modules' CPU
calls keep going to the reference backend.
"""

import dataclasses
import math
import os
import random
import sys

import pytest
import torch

pytest.importorskip("triton")

import haloattn  # noqa: E402
from haloattn.backends.triton import launch, tiles  # noqa: E402
from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

import oracle  # noqa: E402
from test_triton_gpu import atomic_default, check_against_oracle, record_launches  # noqa: E402


def _drop_tile_caches():
    """The cached configs and tilings, which follow tiles' module flags."""
    for cached in (tiles.default_config, tiles._best_forward, tiles.gluon_forward_boxes):
        getattr(cached, "cache_clear", lambda: None)()


def _thinness_rule(monkeypatch, relative: bool):
    _drop_tile_caches()
    monkeypatch.setattr(tiles, "THIN_RELATIVE_TO_WINDOW", relative)
    yield _drop_tile_caches
    monkeypatch.undo()
    _drop_tile_caches()


@pytest.fixture
def window_relative_thinness(monkeypatch):
    """tiles.THIN_RELATIVE_TO_WINDOW on for one test (the caches dropped before and after); yields
    what drops them."""
    yield from _thinness_rule(monkeypatch, True)


@pytest.fixture
def token_thinness(monkeypatch):
    """tiles.THIN_RELATIVE_TO_WINDOW off for one test: the thin-box rule in tokens only."""
    yield from _thinness_rule(monkeypatch, False)


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize(
    "spatial,window,options",
    [
        ((12,), 5, dict(heads=4, kv_heads=2, head_dim=20, value_dim=32)),
        ((13,), 4, dict(stride=2, dilation=2, causal=True)),
        ((10,), 4, dict(stride=4, softcap=2.0, extra=70, heads=3, kv_heads=1)),
        ((9, 11), (3, 5), dict(stride=(1, 2), dilation=(2, 1), causal=(True, False), rpb=True, softcap=3.0,
                               heads=4, kv_heads=2, value_dim=24, extra=5)),
        ((4, 5, 6), (3, 2, 3), dict(stride=(1, 2, 3), dilation=(1, 2, 1), causal=(True, False, False),
                                    kv_heads=1, rpb=True, extra=2)),
        ((9, 11), (3, 4), dict(pattern="window", shift=(1, 2), dilation=(1, 2), causal=(False, True),
                               rpb=True, extra=3)),
        ((6, 8), (6, 3), dict(pattern="window", scale=0.0, batch=2)),
    ],
    ids=["1d-gqa-dv", "1d-stride-dil-causal", "1d-blocked-softcap-extra", "2d-mixed-all",
         "3d-mixed-rpb", "2d-window-shift", "2d-window-scale0"],
)
def test_float32_features(spatial, window, options):
    check_against_oracle(spatial, window, dtype=torch.float32, **options)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit(dtype):
    check_against_oracle((7, 9), (3, 5), dtype=dtype, causal=(False, True), rpb=True, softcap=4.0, extra=2,
                         heads=2, kv_heads=1, head_dim=32)


def descriptor_config(problem):
    return {name: dict(cfg, tma=True) for name, cfg in tiles.default_config(problem).items()}


@pytest.mark.parametrize(
    "spatial,window,options",
    [
        ((40,), 9, dict(stride=3, causal=True)),
        ((12, 14), (5, 3), dict(dilation=(1, 2), kv_heads=2)),
        ((5, 6, 7), (3, 3, 5), dict(dilation=(1, 2, 1), stride=(1, 1, 2), causal=(True, False, False))),
    ],
    ids=["1d", "2d-dilation-gqa", "3d"],
)
def test_descriptor_loads_equal_pointer_loads(spatial, window, options):
    """K/V (forward, dQ) and Q/dO (dK/dV) tiles read through tensor descriptors give bit for bit
    what pointer loads give, and both match the oracle."""
    gen = torch.Generator().manual_seed(len(spatial))
    kv_heads = options.pop("kv_heads", 4)
    q = torch.randn(2, *spatial, 4, 32, generator=gen).bfloat16()
    k, v = (torch.randn(2, *spatial, kv_heads, 32, generator=gen).bfloat16() for _ in range(2))
    problem = build_problem(q, k, v, window, **options)
    assert launch.use_descriptors(True, False, q, k, v)
    inputs = AttentionInputs(q, k, v)
    needs = (True, True, True, False, False, False, False)
    results = []
    descriptors = descriptor_config(problem)
    # dK/dV's wait for its last product (WAIT_DK) either way: the same products, the same result.
    other_wait = dict(descriptors, dkdv=dict(descriptors["dkdv"], wait_dk=not descriptors["dkdv"]["wait_dk"]))
    for config in (tiles.default_config(problem), descriptors, other_wait):
        out, lse = launch.forward(problem, inputs, config)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).bfloat16()
        results.append((out, lse) + launch.backward(problem, inputs, out, lse, grad, None, needs, config)[:3])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)
    ref, _ = oracle.attention(q.double(), k.double(), v.double(), window, **options)
    assert oracle.rel_error(results[1][0], ref) <= oracle.TOLERANCE[torch.bfloat16]


def test_descriptor_loads_need_aligned_strides():
    q = torch.randn(1, 8, 2, 32).bfloat16()
    assert launch.use_descriptors(True, False, q)
    assert not launch.use_descriptors(False, False, q)  # not asked for
    assert not launch.use_descriptors(True, True, q)  # int64 offsets
    assert not launch.use_descriptors(True, False, q.float())  # 32-bit data
    odd = torch.randn(1, 8, 2, 36).bfloat16()[..., :30]  # head stride 72 bytes
    assert not launch.use_descriptors(True, False, odd)
    # expanded heads or tokens (stride 0): read by pointer, never through a descriptor
    assert not launch.use_descriptors(True, False, torch.randn(1, 8, 1, 32).bfloat16().expand(1, 8, 4, 32))
    assert not launch.use_descriptors(True, False, torch.randn(1, 1, 2, 32).bfloat16().expand(1, 8, 2, 32))


def test_descriptor_backward_with_a_large_bias():
    """The dK/dV kernel copies a query tile's (lse, delta) rows through a descriptor, and rows past
    the grid arrive as zeros, not lse = +inf: with a bias near 90 their P would overflow to inf and
    inf * 0 turn dK and dV into NaN, were such rows not masked on the tiles that reach past the grid."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 10, 13, 2, 32, generator=gen).bfloat16() for _ in range(3))
    window = (5, 7)
    rpb = (torch.randn(2, 9, 13, generator=gen) + 90.0).bfloat16()
    problem = build_problem(q, k, v, window, rpb=rpb)
    inputs = AttentionInputs(q, k, v, rpb=rpb)
    config = descriptor_config(problem)
    assert launch.use_descriptors(config["dkdv"]["tma"], False, q, k, v)
    out, lse = launch.forward(problem, inputs, config)
    grad = torch.randn(out.shape, generator=gen).bfloat16()
    _, dk, dv, *_ = launch.backward(problem, inputs, out, lse, grad, None, (False, True, True) + (False,) * 4,
                                    config)
    ref = {name: t.double().requires_grad_(True) for name, t in (("k", k), ("v", v))}
    ref_out, _ = oracle.attention(q.double(), ref["k"], ref["v"], window, rpb=rpb.double())
    ref_dk, ref_dv = torch.autograd.grad((ref_out * grad.double()).sum(), [ref["k"], ref["v"]])
    assert oracle.rel_error(dk, ref_dk) <= oracle.TOLERANCE[torch.bfloat16]
    assert oracle.rel_error(dv, ref_dv) <= oracle.TOLERANCE[torch.bfloat16]


def test_without_lse_gradient():
    check_against_oracle((11,), 3, grad_lse=False, rpb=True)


@pytest.mark.parametrize("spatial,window,options", [
    ((13,), 5, dict(stride=2, extra=3)),
    ((7, 9), (3, 5), dict(dilation=(2, 1), causal=(False, True), rpb=True, heads=4, kv_heads=2)),
])
def test_gradients_of_a_summed_loss(spatial, window, options):
    # The gradient of lse.sum() is an expanded tensor: its rows were once read past its one element.
    check_against_oracle(spatial, window, sum_loss=True, **options)


@pytest.mark.parametrize(
    "spatial,window,batch,heads,kv_heads,pack,options",
    [
        ((12,), 5, 3, 1, 1, 2, {}),
        ((9, 11), (3, 5), 3, 3, 1, 4, dict(causal=(True, False), dilation=(2, 1), softcap=3.0, rpb=True)),
        ((4, 5, 6), (3, 2, 3), 2, 3, 3, 16, dict(stride=(1, 2, 3), causal=(False, False, True))),
        ((9, 11), (3, 4), 2, 2, 1, 2, dict(pattern="window", shift=(1, 2), rpb=True, scale=0.3)),
    ],
    ids=["1d-last-program-short", "2d-gqa-causal-dilated-rpb-softcap", "3d-strided-more-pack-than-pairs",
         "2d-window-shift-rpb"],
)
def test_packed_forward_programs(spatial, window, batch, heads, kv_heads, pack, options):
    """Forward programs running ``pack`` (batch, head) pairs of one query tile each, against the
    oracle: pair counts that leave the last program short, heads that wrap into the next batch
    entry inside a program, GQA (a program's pairs read different key heads), per-head bias."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(batch, *spatial, heads, 16, generator=gen)
    k = torch.randn(batch, *spatial, kv_heads, 16, generator=gen)
    v = torch.randn(batch, *spatial, kv_heads, 24, generator=gen)
    kwargs = dict(options)
    if kwargs.pop("rpb", False):
        per_axis = window if isinstance(window, tuple) else (window,) * len(spatial)
        kwargs["rpb"] = torch.randn(heads, *(2 * w - 1 for w in per_axis), generator=gen)
    problem = build_problem(q, k, v, window, **kwargs)
    config = tiles.default_config(problem)
    config = dict(config, fwd=dict(config["fwd"], pack=pack))
    out, lse = launch.forward(problem, AttentionInputs(q, k, v, rpb=kwargs.get("rpb")), config)
    ref, ref_lse = oracle.attention(q, k, v, window, **kwargs)
    assert oracle.rel_error(out, ref) <= oracle.TOLERANCE[torch.float32]
    assert (lse.double() - ref_lse).abs().max() <= oracle.LSE_TOLERANCE[torch.float32]


@pytest.mark.parametrize("dim,split", [(16, (16, 0)), (20, (32, 0)), (40, (64, 0)), (48, (64, 0)),
                                       (64, (64, 0)), (72, (128, 0)), (80, (64, 16)), (96, (128, 0)),
                                       (112, (128, 0)), (136, (256, 0)), (144, (128, 16)), (152, (256, 0)),
                                       (160, (128, 32)), (192, (256, 0)), (200, (256, 0)), (256, (256, 0))])
def test_head_split_widths(dim, split):
    """A block and a tail only where the tail is at most a quarter of the block (where the split
    measured faster than one padded block) and the head fills it (partial tails miscompiled)."""
    assert tiles.head_split(dim) == split
    block, tail = split
    assert block & (block - 1) == 0 and (block + tail == dim if tail else block >= dim)
    assert tail == 0 or 16 <= tail <= block // 4


@pytest.mark.parametrize(
    "spatial,window,head_dim,value_dim,dtype,options",
    [
        ((11,), 5, 80, 80, torch.float32, dict(causal=True, stride=2)),
        ((7, 9), (3, 5), 80, 160, torch.bfloat16, dict(dilation=(2, 1), rpb=True, softcap=3.0)),
        ((7, 9), (5, 3), 96, 80, torch.float16, dict(causal=(False, True), kv_heads=1)),
        ((3, 4, 5), (3, 3, 3), 144, 96, torch.bfloat16, dict(stride=(1, 2, 1))),
    ],
    ids=["1d-fp32-80", "2d-80-160-rpb-softcap", "2d-96-80-gqa", "3d-144-96"],
)
@pytest.mark.parametrize("variant", ["pointer", "descriptors", "packed-forward", "atomic-dq"])
def test_split_heads(spatial, window, head_dim, value_dim, dtype, options, variant, monkeypatch):
    """Forward and backward on head and value dims split into a power-of-two block and a tail
    (tiles.head_split) against the oracle: by pointer loads, through tensor descriptors, in packed
    forward programs, with the opt-in atomic dQ (whose dK/dV kernel keeps one padded block); and
    they give what one padded block gives up to the order of the sums."""
    gen = torch.Generator().manual_seed(head_dim + value_dim)
    kwargs = dict(options)
    heads, kv_heads = 2, kwargs.pop("kv_heads", 2)
    q = torch.randn(2, *spatial, heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(2, *spatial, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(2, *spatial, kv_heads, value_dim, generator=gen).to(dtype)
    if kwargs.pop("rpb", False):
        kwargs["rpb"] = torch.randn(heads, *(2 * w - 1 for w in window), generator=gen).to(dtype)
    grad = torch.randn(*q.shape[:-1], value_dim, generator=gen).to(dtype)
    problem = build_problem(q, k, v, window, **kwargs)
    assert tiles.splits_heads(problem)
    config = tiles.default_config(problem)
    tma = variant == "descriptors"
    config = dict(config, fwd=dict(config["fwd"], tma=tma, pack=4 if variant == "packed-forward" else 1),
                  dq=dict(config["dq"], tma=tma), dkdv=dict(config["dkdv"], tma=tma, atomic_dq=variant == "atomic-dq"))
    if tma:
        assert launch.use_descriptors(True, False, k, v) == (dtype != torch.float32)
    if variant == "atomic-dq":
        monkeypatch.setenv(tiles.DETERMINISTIC_ENV, "0")
    padded_config = {part: dict(cfg, split_heads=False) for part, cfg in config.items()}
    inputs = AttentionInputs(q, k, v, rpb=kwargs.get("rpb"))
    needs = (True, True, True, "rpb" in kwargs, False, False, False)

    def run(cfg):
        out, lse = launch.forward(problem, inputs, cfg)
        return (out, lse) + tuple(g for g in launch.backward(problem, inputs, out, lse, grad, None, needs, cfg)
                                  if g is not None)

    split, padded = run(config), run(padded_config)
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref_kwargs = {n: (t.double().requires_grad_(True) if torch.is_tensor(t) else t) for n, t in kwargs.items()}
    ref_out, ref_lse = oracle.attention(*leaves, window, **ref_kwargs)
    wrt = leaves + ([ref_kwargs["rpb"]] if "rpb" in kwargs else [])
    ref_grads = torch.autograd.grad((ref_out * grad.double()).sum(), wrt)
    assert oracle.rel_error(split[0], ref_out) <= oracle.TOLERANCE[dtype]
    assert (split[1].double() - ref_lse).abs().max() <= oracle.LSE_TOLERANCE[dtype]
    for got, want in zip(split[2:], ref_grads):
        assert oracle.rel_error(got, want) <= oracle.TOLERANCE[dtype]
    assert len(split) == len(padded) == 2 + len(ref_grads)
    for a, b in zip(split[2:], padded[2:]):
        assert oracle.rel_error(a, b) <= oracle.TOLERANCE[dtype]
    assert (split[1] - padded[1]).abs().max() <= oracle.LSE_TOLERANCE[dtype]


def test_tuning_weighs_the_padded_head_against_the_split():
    """Where the default splits a head (measured on Hopper only), tuning also times it padded."""
    def padded_candidates(head_dim):
        q = torch.randn(1, 10, 2, head_dim)
        configs = tiles.candidate_configs(build_problem(q, q, q, 3))
        return [c for c in configs if not any(part.get("split_heads", True) for part in c.values())]

    assert len(padded_candidates(80)) == 1
    assert padded_candidates(64) == [] and padded_candidates(96) == []


@pytest.mark.parametrize("spatial,window,options,head_dim,dtype", [
    ((128, 128), 31, {}, 64, torch.bfloat16),  # two builders' candidates had landed on the default
    ((16, 48, 48), (7, 15, 15), {"causal": (True, False, False)}, 128, torch.bfloat16),
    ((56, 56), 7, {}, 32, torch.float16),
    ((1024,), 63, {"stride": 4}, 160, torch.float32),
])
def test_tuning_candidates_are_distinct_and_as_run(spatial, window, options, head_dim, dtype):
    """Every candidate is offered as the kernels run it (normalise leaves it alone) and once,
    the default first: a config timed twice only adds noise to the tuner's ranking."""
    q = torch.empty(2, *spatial, 4, head_dim, dtype=dtype, device="meta")
    problem = build_problem(q, q, q, window, **options)
    configs = tiles.candidate_configs(problem)
    assert configs[0] == tiles.default_config(problem)
    assert all(tiles.normalise(config, problem) == config for config in configs)
    assert len(configs) > 10 and all(configs.count(config) == 1 for config in configs)


@pytest.mark.parametrize("spatial,window,head_dim,keys", [
    ((64, 64), 17, 256, 32), ((56, 112), 12, 192, 32), ((16, 32, 32), (5, 9, 9), 160, 64), ((4096,), 511, 144, 64),
])
def test_wide_16bit_forward_fits_two_programs_a_multiprocessor(spatial, window, head_dim, keys):
    """Above 128 channels in 16 bits the default forward (64 queries, 4 warps) takes two stages
    and the widest key tile with which two programs fit a Hopper multiprocessor's tile budget
    (tiles.WIDE_16BIT_FORWARD_RULE); the cost model's one-program tiles stay a tuning candidate."""
    q = torch.empty(2, *spatial, 4, head_dim, dtype=torch.bfloat16, device="meta")
    problem = build_problem(q, q, q, window)
    item, d, dv = tiles._operand_sizes(problem, "fwd")

    def shared(fwd):
        return tiles._shared_bytes("fwd", math.prod(fwd["q"]), math.prod(fwd["kv"]), fwd["stages"], d, dv, item)

    fwd = tiles.default_config(problem)["fwd"]
    half = tiles.tile_shared_budget(problem.device) // 2
    assert (math.prod(fwd["q"]), math.prod(fwd["kv"]), fwd["warps"], fwd["stages"]) == (64, keys, 4, 2)
    assert shared(fwd) <= half < shared(dict(fwd, kv=tiles.fit(fwd["kv"], tiles.group_extents(problem), 2 * keys)))
    cost_model = tiles._config_on_forward_boxes(problem)["fwd"]
    assert shared(cost_model) > half and cost_model != fwd
    assert cost_model in [c["fwd"] for c in tiles.candidate_configs(problem)]


@pytest.mark.parametrize("spatial,window,head_dim", [((16, 32, 32), (5, 9, 9), 160), ((64, 64), 17, 256), ((512,), 31, 64)])
def test_no_forward_runs_on_one_stage(spatial, window, head_dim):
    """One stage read an illegal address on a 3-D forward at 160 channels (H200, 2026-12-05):
    no tuning candidate offers it, and a cache entry asking for it runs two."""
    q = torch.empty(2, *spatial, 4, head_dim, dtype=torch.bfloat16, device="meta")
    problem = build_problem(q, q, q, window)
    assert min(c["fwd"]["stages"] for c in tiles.candidate_configs(problem)) >= tiles.MIN_FORWARD_STAGES == 2
    stored = {"fwd": dict(tiles.default_config(problem)["fwd"], stages=1)}
    assert tiles.normalise(stored, problem)["fwd"]["stages"] == 2


@pytest.mark.parametrize("dtype,head_dim,optin_kib", [(torch.bfloat16, 128, 227), (torch.float32, 160, 227),
                                                      (torch.bfloat16, 160, 163), (torch.bfloat16, 256, 99)])
def test_two_program_rule_only_for_wide_16bit_heads_on_hopper(monkeypatch, dtype, head_dim, optin_kib):
    """At up to 128 channels, in float32, and on GPUs with less shared memory than Hopper (where
    it was not measured) the forward keeps the cost model's tiles."""
    monkeypatch.setattr(tiles, "tile_shared_budget", lambda device: (optin_kib - 27) * 1024)
    q = torch.empty(2, 16, 32, 32, 4, head_dim, dtype=dtype, device="meta")
    problem = build_problem(q, q, q, (5, 9, 9))
    default = tiles.default_config.__wrapped__(problem)["fwd"]  # (the Triton forward's tiles: gluon aside)
    assert dict(default, gluon=False) == tiles._config_on_forward_boxes(problem)["fwd"]


def _forward_tiles(spatial, window, head_dim, dtype=torch.bfloat16, heads=4, kv_heads=4, **options):
    q = torch.empty(2, *spatial, heads, head_dim, dtype=dtype, device="meta")
    k = torch.empty(2, *spatial, kv_heads, head_dim, dtype=dtype, device="meta")
    problem = build_problem(q, k, k, window, **options)
    fwd = tiles.default_config.__wrapped__(problem)["fwd"]  # not the cache: tests patch the budget
    return problem, (math.prod(fwd["q"]), math.prod(fwd["kv"]), fwd["warps"], fwd["stages"])


@pytest.mark.parametrize("spatial,window,head_dim,options,wide", [
    ((8192,), 4096, 256, dict(causal=True, kv_heads=2), True),
    ((16384,), 1023, 256, {}, True),
    ((8192,), 2048, 192, dict(causal=True, kv_heads=1), True),
    ((8192,), 511, 256, dict(dilation=2), True),
    ((2048,), 127, 256, {}, False),  # 1.4x the pairs: 0.90x on an H100
    ((4096,), 256, 192, dict(stride=64), False),  # 1.33x the pairs: 1.01x
    ((32768,), 4096, 160, dict(causal=True), False),  # 160 channels keep 64 keys on 4 warps: 0.93x
    ((64, 64), 17, 256, {}, False),  # 2-D and 3-D: 0.51-0.91x
])
def test_wide_1d_forward_on_8_warps_where_it_costs_few_pairs(spatial, window, head_dim, options, wide):
    """1-D problems at 161-256 channels in 16 bits take 128 x 64 forward tiles on 8 warps where
    those cost at most WIDE_1D_MAX_COST_RATIO times the two-program tiles' pairs
    (tiles.WIDE_1D_FORWARD_TILES); other problems keep the two-program tiles, which stay a
    tuning candidate."""
    options = dict(options)
    kv_heads = options.pop("kv_heads", 4)
    problem, fwd = _forward_tiles(spatial, window, head_dim, kv_heads=kv_heads, **options)
    assert (fwd == (128, 64, 8, 2)) == wide, fwd
    if wide:
        two_programs = [c["fwd"] for c in tiles.candidate_configs(problem)
                        if c["fwd"]["warps"] == 4 and math.prod(c["fwd"]["q"]) == 64 and c["fwd"]["stages"] == 2]
        assert two_programs, "the two-program forward is no longer a candidate"
        ext = tiles.group_extents(problem)
        cost = tiles.forward_cost(problem, tiles.fit([1], ext, 128), tiles.fit([1], ext, 64), 1.0)
        assert cost <= tiles.WIDE_1D_MAX_COST_RATIO * tiles.forward_cost(problem, [64], [32], 1.0)


def test_wide_1d_rule_only_on_hopper_size_gpus(monkeypatch):
    """GPUs with less shared memory than Hopper (where the rule was not measured) keep the
    forward of before."""
    monkeypatch.setattr(tiles, "tile_shared_budget", lambda device: (163 - 27) * 1024)
    _, fwd = _forward_tiles((16384,), 1023, 256)
    assert fwd[2] == 4, fwd


@pytest.mark.parametrize("spatial,window,head_dim,options", [
    ((32768,), 2047, 64, {}), ((16384,), 4096, 64, dict(causal=True)), ((8192,), 1024, 32, dict(causal=True)),
    ((16384,), 16384, 64, {}), ((32768,), 4095, 16, {}), ((256, 256), 127, 64, {}),
])
def test_narrow_heads_leave_the_128_block(monkeypatch, spatial, window, head_dim, options):
    """At 16-bit head dims of at most 64 channels (read by pointer) the 128 x 128 forward block
    runs at NARROW_128_BLOCK_SPEED of FORWARD_BLOCKS' scale (0.76-0.82 the time of 128 x 64 or
    64 x 64 tiles on an H200): the long 1-D windows and large 2-D windows that took it take 64 x 64
    on 4 warps; it stays a tuning candidate."""
    problem, fwd = _forward_tiles(spatial, window, head_dim, **options)
    assert fwd == (64, 64, 4, 3), fwd
    assert any(math.prod(c["fwd"]["q"]) == 128 == math.prod(c["fwd"]["kv"]) for c in tiles.candidate_configs(problem))
    monkeypatch.setattr(tiles, "NARROW_128_BLOCK_RULE", False)
    assert math.prod(tiles._best_forward.__wrapped__(problem, False)[0]) == 128  # what the rule replaced


@pytest.mark.parametrize("spatial,window,options", [
    ((2048,), 128, dict(stride=128)), ((32, 32, 32), (2, 8, 8), dict(stride=(2, 8, 8))),
    ((64, 64), (8, 16), dict(stride=(8, 16))),
])
def test_narrow_heads_leave_the_128_block_on_one_tile_walks(monkeypatch, spatial, window, options):
    """A blocked problem whose walk is one 128 x 128 tile left that block too: on the H100 its
    forward, packed four pairs a program, took 1.04-1.13x the time of 64 x 64 tiles on 4 warps
    (2026-12-06). With the threshold of before (PACK_MAX_STEPS) it would keep the block."""
    problem, fwd = _forward_tiles(spatial, window, 64, **options)
    assert fwd == (64, 64, 4, 3), fwd
    monkeypatch.setattr(tiles, "NARROW_128_KEEP_MAX_STEPS", tiles.PACK_MAX_STEPS)
    q, kv, _, _ = tiles._best_forward.__wrapped__(problem, False)
    assert math.prod(q) == 128 == math.prod(kv), (q, kv)  # what the threshold changed
    assert tiles.steps_per_tile(problem, q, kv) <= 1


@pytest.mark.parametrize("spatial,window,options", [
    ((2048,), 128, dict(stride=128)), ((32, 32, 32), (2, 8, 8), dict(stride=(2, 8, 8))),
])
@pytest.mark.parametrize("head_dim", [16, 32])
def test_narrowest_heads_one_tile_walks_keep_the_short_walk_block(spatial, window, options, head_dim):
    """At up to NARROW_HEAD_DIM channels a one-tile walk keeps the 128 x 128 block in the cost
    model, so NARROW_SHORT_WALK_BLOCK takes its forward (measured there; the 64-channel change of
    2026-12-06 was not) and the backward keeps the boxes that followed the block."""
    problem, fwd = _forward_tiles(spatial, window, head_dim, **options)
    (queries, keys), (warps, _) = tiles.NARROW_SHORT_WALK_BLOCK
    assert fwd[:3] == (queries, keys, warps), fwd
    q, kv, _, _ = tiles._best_forward.__wrapped__(problem, False)
    assert math.prod(q) == 128 == math.prod(kv), (q, kv)


@pytest.mark.parametrize("spatial,window,options", [
    ((4096,), 384, dict(stride=128)), ((16384,), 256, dict(stride=256)), ((128, 128), 16, dict(stride=16)),
    ((8, 32, 32), (4, 8, 8), dict(stride=(4, 8, 8))),
])
@pytest.mark.parametrize("head_dim", [32, 64])
def test_narrow_heads_leave_the_128_block_on_walks_of_a_few_tiles(monkeypatch, spatial, window, options, head_dim):
    """Walks of two to four 128 x 128 tiles follow the rule: on the H100 those blocked problems
    ran their forward 1.35-1.64x faster on 64 x 64 tiles on 4 warps (2026-12-06). With the
    threshold of before (SHORT_WALK_STEPS) they would keep the block."""
    problem, fwd = _forward_tiles(spatial, window, head_dim, **options)
    assert fwd == (64, 64, 4, 3), fwd
    monkeypatch.setattr(tiles, "NARROW_128_KEEP_MAX_STEPS", tiles.SHORT_WALK_STEPS)
    q, kv, _, _ = tiles._best_forward.__wrapped__(problem, False)
    assert math.prod(q) == 128 == math.prod(kv), (q, kv)  # what the threshold changed
    assert 1.5 < tiles.steps_per_tile(problem, q, kv) <= tiles.SHORT_WALK_STEPS


@pytest.mark.parametrize("head_dim,dtype", [(128, torch.bfloat16), (64, torch.float32)])
def test_narrow_128_block_rule_leaves_other_heads(monkeypatch, head_dim, dtype):
    """Heads read through descriptors (above 64 channels) and float32 keep FORWARD_BLOCKS' speeds:
    the rule changes no forward choice of theirs."""
    q = torch.empty(1, 32768, 4, head_dim, dtype=dtype, device="meta")
    problem = build_problem(q, q, q, 2047)
    assert not tiles._pointer_width_16bit_on_copy_engine(problem)
    with_rule = [tiles._best_forward.__wrapped__(problem, descriptors) for descriptors in (False, True)]
    monkeypatch.setattr(tiles, "NARROW_128_BLOCK_RULE", False)
    assert with_rule == [tiles._best_forward.__wrapped__(problem, descriptors) for descriptors in (False, True)]


def test_split_heads_not_with_additional_tokens():
    """The additional-token loop multiplies one padded block: problems with such tokens keep it."""
    q = torch.randn(1, 10, 2, 80)
    extra = torch.randn(1, 3, 2, 80)
    problem = build_problem(q, q, q, 3, additional_keys=extra, additional_values=extra)
    assert tiles.head_blocks(problem) == (128, 0, 128, 0)
    assert tiles.head_blocks(build_problem(q, q, q, 3)) == (64, 16, 64, 16)
    assert tiles.head_blocks(build_problem(q, q, q, 3), split=False) == (128, 0, 128, 0)


def test_split_heads_not_with_float32_products_in_three_parts():
    """Float32 products in three TF32 parts take one padded block in every kernel (the split's tail
    product miscompiled there, launch.SPLIT_HEADS_UNSAFE_PRECISIONS); the other precisions, the
    interpreter's included, keep the split."""
    q = torch.randn(1, 10, 2, 80)
    problem = build_problem(q, q, q, 3)
    for part, cfg in tiles.default_config(problem).items():
        assert launch.head_block_constexprs(problem, cfg, "tf32x3") == dict(BLOCK_D=128, TAIL_D=0, BLOCK_DV=128,
                                                                            TAIL_DV=0), part
        for precision in ("tf32", "ieee", "interpret"):
            assert launch.head_block_constexprs(problem, cfg, precision) == dict(BLOCK_D=64, TAIL_D=16, BLOCK_DV=64,
                                                                                 TAIL_DV=16), (part, precision)


def test_packing_only_for_walks_of_one_key_tile():
    """The default packs pairs where a query tile's walk is one key tile (a dilated 7x7 window whose
    dilation group fits in one tile), never on longer walks, with additional tokens, or more pairs
    than the problem has; stored configs are fitted the same way."""
    def problem_of(spatial, heads, window, batch=64, extra=0, **options):
        q = torch.empty(batch, *spatial, heads, 32, dtype=torch.bfloat16)
        more = torch.empty(batch, extra, heads, 32, dtype=torch.bfloat16) if extra else None
        return build_problem(q, q, q, window, additional_keys=more, additional_values=more, **options)

    dilated = problem_of((56, 56), 2, 7, dilation=8)
    config = tiles.default_config(dilated)["fwd"]
    assert tiles.steps_per_tile(dilated, config["q"], config["kv"]) == 1.0
    assert config["pack"] > 1 and not config["tma"]
    assert tiles.default_config(problem_of((56, 56), 2, 7))["fwd"]["pack"] == 1  # 3.7 key tiles a walk
    assert tiles.default_config(problem_of((56, 56), 2, 7, dilation=8, extra=3))["fwd"]["pack"] == 1
    one_pair = problem_of((7, 7), 1, 7, batch=1)
    assert tiles.default_config(one_pair)["fwd"]["pack"] == 1  # packing would leave the GPU idle
    assert tiles.normalise({"fwd": {"pack": 64}}, one_pair)["fwd"]["pack"] == 1
    assert tiles.normalise({"fwd": {"pack": 3}}, dilated)["fwd"]["pack"] == 4


def test_short_walks_read_keys_by_pointer(monkeypatch, forget_configs):
    """On a GPU with a copy engine, with descriptors built by each program, 16-bit heads of 65-128
    channels read K/V through descriptors, except where a query tile walks at most
    SHORT_WALK_STEPS key tiles (blocked problems, small windows: 1.14-1.22x by pointer on the
    H100); longer walks and 256-channel heads keep them, and one-tile walks then pack (batch,
    head) pairs as at narrow heads. (Host-built descriptors move these rules:
    test_host_descriptors_move_the_descriptor_rules.)"""
    from haloattn.backends.triton import host_descriptors

    _pretend_gpu(monkeypatch, 227 * 1024, (9, 0))
    monkeypatch.setattr(tiles, "multiprocessors", lambda device: 132)  # an H100's
    monkeypatch.setattr(host_descriptors, "HOST_DESCRIPTORS", False)

    def fwd(spatial, window, head_dim=128, batch=1, **options):
        q = torch.empty(batch, *spatial, 16, head_dim, dtype=torch.bfloat16)
        problem = dataclasses.replace(build_problem(q, q, q, window, **options), device=torch.device("cuda", 0))
        config = tiles.default_config(problem)["fwd"]
        return config, tiles.steps_per_tile(problem, config["q"], config["kv"])

    for spatial, window, options in (((128, 128), 16, dict(stride=16)), ((16, 48, 48), (2, 8, 8), dict(stride=(2, 8, 8))),
                                     ((32768,), 256, dict(stride=256)), ((56, 56), 7, {})):
        config, steps = fwd(spatial, window, **options)
        assert steps <= tiles.SHORT_WALK_STEPS and not config["tma"], (spatial, window, steps)
    for spatial, window, options in (((128, 128), 31, {}), ((128, 128), 32, dict(stride=32))):
        config, steps = fwd(spatial, window, **options)
        assert steps > tiles.SHORT_WALK_STEPS and config["tma"], (spatial, window, steps)
    # At 256 channels descriptors stay on a walk that is short on the cost model's tiles (the
    # default's own key tiles are halved there: WIDE_16BIT_FORWARD_RULE)
    config, _ = fwd((64, 64), 5, head_dim=256)
    q = torch.empty(1, 64, 64, 16, 256, dtype=torch.bfloat16)
    wide = dataclasses.replace(build_problem(q, q, q, 5), device=torch.device("cuda", 0))
    cost_model = tiles._config_on_forward_boxes(wide)["fwd"]
    assert tiles.steps_per_tile(wide, cost_model["q"], cost_model["kv"]) <= tiles.SHORT_WALK_STEPS and config["tma"]
    config, steps = fwd((64, 64), 8, batch=4, stride=8)
    assert steps == 1.0 and not config["tma"] and config["pack"] > 1


def test_host_descriptors_move_the_descriptor_rules(monkeypatch, forget_configs):
    """Where descriptors are built on the host (undilated 16-bit problems on a GPU with a copy
    engine), the forward reads K/V through them from 64 channels on and on short walks too
    (1.07-1.14x on an H200), the backward from 32 channels (1.32x) and on one- and two-tile walks
    too (1.09-1.15x on the H100), and packed forwards keep their pointers; dilated problems, and
    every problem with host descriptors off, keep the rules of per-program descriptors; only the
    loads change, never the tiles."""
    from haloattn.backends.triton import host_descriptors

    _pretend_gpu(monkeypatch, 227 * 1024, (9, 0))
    monkeypatch.setattr(tiles, "multiprocessors", lambda device: 132)

    def configs(spatial, window, head_dim, batch=1, **options):
        q = torch.empty(batch, *spatial, 16, head_dim, dtype=torch.bfloat16)
        problem = dataclasses.replace(build_problem(q, q, q, window, **options), device=torch.device("cuda", 0))
        tiles.default_config.cache_clear()
        monkeypatch.setattr(host_descriptors, "HOST_DESCRIPTORS", True)
        on_host = tiles.default_config(problem)
        tiles.default_config.cache_clear()
        monkeypatch.setattr(host_descriptors, "HOST_DESCRIPTORS", False)
        per_program = tiles.default_config(problem)
        tiles.default_config.cache_clear()
        # (the Gluon forward's choice weighs the Triton forward at its loads' speed, so it may move too)
        for name in on_host:
            ignored = dict(tma=None, wait_dk=None, gluon=None)
            assert dict(on_host[name], **ignored) == dict(per_program[name], **ignored)
        return on_host, per_program

    on_host, per_program = configs((128, 128), 31, 64)
    assert on_host["fwd"]["tma"] and not per_program["fwd"]["tma"]
    on_host, per_program = configs((128, 128), 16, 128, stride=16)  # four key tiles a walk
    assert on_host["fwd"]["tma"] and not per_program["fwd"]["tma"]
    on_host, per_program = configs((56, 56), 7, 32)
    assert not on_host["fwd"]["tma"] and not per_program["fwd"]["tma"]
    assert on_host["dq"]["tma"] and on_host["dkdv"]["tma"] and not per_program["dq"]["tma"]
    on_host, per_program = configs((64, 64), 13, 64, dilation=2)
    assert on_host == per_program and not on_host["fwd"]["tma"]
    on_host, per_program = configs((64, 64), 8, 64, batch=4, stride=8)  # one key tile: packed
    assert on_host["fwd"]["pack"] > 1 and not on_host["fwd"]["tma"]
    for spatial, window, head_dim, options in (((64, 64), 8, 64, dict(stride=8)), ((64, 64), 8, 128, dict(stride=8)),
                                               ((16, 48, 48), (2, 8, 8), 128, dict(stride=(2, 8, 8)))):
        on_host, per_program = configs(spatial, window, head_dim, batch=4, **options)  # one- and two-tile walks
        assert on_host["dq"]["tma"] and on_host["dkdv"]["tma"], (spatial, head_dim)
        assert not per_program["dq"]["tma"] and not per_program["dkdv"]["tma"], (spatial, head_dim)


def test_short_backward_walks_read_by_pointer(monkeypatch, forget_configs):
    """On a GPU with a copy engine, with descriptors built by each program, the backward streams
    16-bit tiles of 64-128 channels through descriptors, except where its dQ walk visits at most
    BACKWARD_SHORT_WALK_STEPS tiles (one-tile and two-tile blocked problems: 1.04-1.24x by pointer
    on the H100); both kernels then agree, and dK/dV drops the descriptor-only wait. (Host-built
    descriptors drop the rule: test_host_descriptors_move_the_descriptor_rules.)"""
    from haloattn.backends.triton import host_descriptors

    _pretend_gpu(monkeypatch, 227 * 1024, (9, 0))
    monkeypatch.setattr(tiles, "multiprocessors", lambda device: 132)  # an H100's
    monkeypatch.setattr(host_descriptors, "HOST_DESCRIPTORS", False)

    def backward(spatial, window, head_dim=128, **options):
        q = torch.empty(2, *spatial, 8, head_dim, dtype=torch.bfloat16)
        problem = dataclasses.replace(build_problem(q, q, q, window, **options), device=torch.device("cuda", 0))
        config = tiles.default_config(problem)
        return config["dq"], config["dkdv"], tiles.steps_per_tile(problem, config["dq"]["q"], config["dq"]["kv"])

    for spatial, window, options, head_dim in (((64, 64), 8, dict(stride=8), 64), ((64, 64), 8, dict(stride=8), 128),
                                               ((16, 48, 48), (2, 8, 8), dict(stride=(2, 8, 8)), 128)):
        dq, dkdv, steps = backward(spatial, window, head_dim, **options)
        assert steps <= tiles.BACKWARD_SHORT_WALK_STEPS, (spatial, window, steps)
        assert not dq["tma"] and not dkdv["tma"] and not dkdv["wait_dk"], (spatial, window)
    for spatial, window, options in (((128, 128), 16, dict(stride=16)), ((56, 56), 7, {}), ((128, 128), 31, {})):
        dq, dkdv, steps = backward(spatial, window, **options)
        assert steps > tiles.BACKWARD_SHORT_WALK_STEPS and dq["tma"] and dkdv["tma"] and dkdv["wait_dk"], (spatial, window)


def test_narrow_heads_take_a_two_warp_key_major_pass():
    """16-bit heads of at most 32 channels run dK/dV's 64-token tiles with 2 warps (1.05-1.27x the
    backward on the H100); wider heads, and float32, keep 4; the tuning candidates hold the other
    choice. (A 31x31 window: on small ones narrow heads take small tiles, the test below.)"""
    def key_major_warps(head_dim, dtype, value_dim=None):
        q = torch.empty(8, 56, 56, 2, head_dim, dtype=dtype)
        v = torch.empty(8, 56, 56, 2, value_dim or head_dim, dtype=dtype)
        problem = build_problem(q, q, v, 31)
        return (tiles.default_config(problem)["dkdv"]["warps"],
                sorted({c["dkdv"]["warps"] for c in tiles.candidate_configs(problem)}))

    assert key_major_warps(32, torch.bfloat16) == (2, [1, 2, 4, 8])
    assert key_major_warps(16, torch.float16)[0] == 2
    assert key_major_warps(32, torch.bfloat16, value_dim=64)[0] == 4
    assert key_major_warps(64, torch.bfloat16) == (4, [1, 4, 8])
    assert key_major_warps(32, torch.float32)[0] == 4


def test_narrow_heads_take_small_tiles_on_small_windows():
    """16-bit heads of at most 32 channels on a 7x7 window: a one-warp forward on 16- or 32-query
    tiles (about half the computed pairs of 8x8 tiles) and a one-warp backward on 32-token tiles;
    DiNAT's dilated layer (walks of one tile) a packed two-warp forward on 32 queries, its
    backward on 64-token tiles; 64-channel heads and float32 keep 64-token tiles. The old
    default stays among the tuning candidates."""
    def config(head_dim, dtype, **options):
        q = torch.empty(8, 56, 56, 2, head_dim, dtype=dtype)
        problem = build_problem(q, q, q, 7, **options)
        return problem, tiles.default_config(problem)

    problem, narrow = config(32, torch.bfloat16)
    assert math.prod(narrow["fwd"]["q"]) in (16, 32) and narrow["fwd"]["warps"] == 1
    for kernel in ("dq", "dkdv"):
        assert math.prod(narrow[kernel]["q"]) == math.prod(narrow[kernel]["kv"]) == 32
        assert narrow[kernel]["warps"] == 1
    wide_queries = [c["fwd"] for c in tiles.candidate_configs(problem)
                    if math.prod(c["fwd"]["q"]) == 64 and c["fwd"]["warps"] == 4]
    assert wide_queries, "the 64-query four-warp forward is still a tuning candidate"
    assert tiles.forward_cost(problem, narrow["fwd"]["q"], narrow["fwd"]["kv"], 1.0) < 0.6 * tiles.forward_cost(
        problem, wide_queries[0]["q"], wide_queries[0]["kv"], 1.0)

    _, dilated = config(32, torch.float16, dilation=8)
    assert (math.prod(dilated["fwd"]["q"]), dilated["fwd"]["warps"]) == (32, 2) and dilated["fwd"]["pack"] > 1
    assert math.prod(dilated["dq"]["q"]) == 64 and dilated["dkdv"]["warps"] == tiles.NARROW_DKDV_WARPS

    for head_dim, dtype in ((64, torch.bfloat16), (32, torch.float32)):
        _, wide = config(head_dim, dtype)
        assert math.prod(wide["fwd"]["q"]) >= 64 and math.prod(wide["dq"]["q"]) >= 16, (head_dim, dtype)
        assert wide["fwd"]["warps"] >= 4, (head_dim, dtype)


@pytest.mark.parametrize("spatial,window,head_dim,small", [
    ((117, 114), (5, 3), 80, True), ((64, 64), 3, 128, True), ((8192,), 15, 128, True),
    ((32, 32), 5, 256, True), ((56, 56), 7, 64, False), ((16, 16, 16), (3, 5, 5), 128, False),
    ((64, 64), 13, 192, False), ((16, 32, 32), (5, 9, 9), 160, False),
    ((128, 128), 31, 128, False), ((16, 48, 48), (7, 15, 15), 128, False), ((56, 56), 7, 32, False)])
def test_small_windows_on_wider_heads_take_small_backward_tiles(monkeypatch, spatial, window, head_dim, small):
    """16-bit heads wider than 32 channels on small windows: the backward takes
    tiles.SMALL_WINDOW_BACKWARD_TILES (16 resident / 32 streamed tokens, 2 warps, by pointer)
    where the default's tiles cost SMALL_WINDOW_BACKWARD_RATIO times theirs, as on the measured
    winners; the measured losers, the benchmark's large windows and narrow heads (their own rule)
    keep theirs; the forward keeps its tiles either way."""
    q = torch.empty(2, *spatial, 4, head_dim, dtype=torch.bfloat16, device="meta")
    problem = build_problem(q, q, q, window)
    cfg = tiles.default_config(problem)
    tokens, streamed, warps = tiles.SMALL_WINDOW_BACKWARD_TILES
    taken = [(math.prod(cfg[k]["kv" if k == "dkdv" else "q"]), math.prod(cfg[k]["q" if k == "dkdv" else "kv"]),
              cfg[k]["warps"], cfg[k]["tma"]) for k in ("dq", "dkdv")]
    if small:
        assert taken == [(tokens, streamed, warps, False)] * 2
        assert not cfg["dkdv"]["wait_dk"]
    else:
        assert all(t[:3] != (tokens, streamed, warps) for t in taken), taken
    monkeypatch.setattr(tiles, "SMALL_WINDOW_BACKWARD_RATIO", math.inf)  # the default without the rule
    without = tiles.default_config.__wrapped__(problem)
    assert cfg["fwd"] == without["fwd"]
    assert (cfg["dq"] == without["dq"]) == (not small)


@pytest.mark.parametrize("spatial,window,options,head_dim,expected", [
    ((16, 32, 32), (5, 9, 9), {}, 160, "wide"), ((80, 80), 21, {"dilation": 2}, 144, "wide"),
    ((11, 56, 30), (6, 4, 17), {"causal": (False, False, True)}, 160, "wide"),  # small-window rule before
    ((15, 15, 38), 6, {}, 160, "wide"), ((64, 64), 3, {}, 160, "small"),
    ((96, 96), 13, {}, 192, "eight"), ((19082,), 625, {}, 192, "eight"),
    ((96, 96), 13, {}, 256, "wide"), ((16, 24, 24), (5, 7, 7), {"causal": (True, False, False)}, 256, "wide"),
    ((128, 128), 31, {}, 256, "eight"), ((8192,), 511, {}, 256, "eight"), ((32, 32), 5, {}, 256, "small")])
def test_wide_16bit_heads_take_their_backward_tiles(monkeypatch, spatial, window, options, head_dim, expected):
    """16-bit heads above 128 channels, as measured (RESULTS.md "Wide heads' backward tiles"):
    64 / 32-token tiles on 4 warps at 129-160 channels, dK/dV not waiting within its steps, unless
    the small-window rule weighed on them takes its own; 32 / 64 on 4 warps at 256 where they save
    enough pairs; 8 warps elsewhere (192, large windows at 256); float32 keeps its tiles."""
    q = torch.empty(2, *spatial, 8, head_dim, dtype=torch.bfloat16, device="meta")
    problem = build_problem(q, q, q, window, **options)
    cfg = tiles.default_config(problem)
    tokens = {k: (math.prod(cfg[k]["kv" if k == "dkdv" else "q"]), math.prod(cfg[k]["q" if k == "dkdv" else "kv"]),
                  cfg[k]["warps"]) for k in ("dq", "dkdv")}
    rule = tiles.WIDE_160_BACKWARD_TILES if head_dim <= 160 else tiles.WIDE_256_BACKWARD_TILES
    if expected == "wide":
        assert tokens == {"dq": rule, "dkdv": rule}, tokens
        assert cfg["dkdv"]["wait_dk"] == (head_dim > 160)
    elif expected == "small":
        assert tokens["dq"] == tiles.SMALL_WINDOW_BACKWARD_TILES, tokens
    else:
        assert tokens["dq"][2] == tokens["dkdv"][2] == 8, tokens
    float32 = build_problem(*(torch.empty_like(q, dtype=torch.float32),) * 3, window, **options)
    with_rules = tiles.default_config.__wrapped__(float32)
    monkeypatch.setattr(tiles, "WIDE_16BIT_BACKWARD_RULES", False)
    assert with_rules == tiles.default_config.__wrapped__(float32)


@pytest.mark.parametrize("pattern", ["neighborhood", "window"])
def test_key_major_cost_walks_every_query_that_sees_the_key_tile(pattern):
    """The host twin of the dK/dV kernel's walk (tiles._axis_query_steps) against the forward
    rule: on random axes, every query that sees a key of a key tile lies in the tiles its walk
    visits, the walk is no longer than those queries' span rounded up plus one tile, and the
    tiles counted inside the common range hold only queries that see every key of the tile."""
    from haloattn.geometry import Axis, key_range

    rng = torch.Generator().manual_seed(5)
    for _ in range(150):
        length, window = (int(x) for x in torch.randint(2, 60, (2,), generator=rng))
        window = min(window, length)
        causal = bool(torch.randint(0, 2, (1,), generator=rng))
        if pattern == "window":
            shift = int(torch.randint(0, window, (1,), generator=rng))
            axis = Axis(length, window, 1, 1, causal, shift=shift)
        else:
            axis = Axis(length, window, int(torch.randint(1, window + 1, (1,), generator=rng)), 1, causal)
        seen_by = [[i for i in range(length) if key_range(axis, pattern, i)[1] <= y < key_range(axis, pattern, i)[2]]
                   for y in range(length)]
        for kv_tile, q_tile in ((4, 4), (8, 2), (2, 8), (16, 16)):
            visited, inside = 0, 0
            for start in range(0, length, kv_tile):
                keys = range(start, min(start + kv_tile, length))
                queries = sorted({i for y in keys for i in seen_by[y]})
                every = set.intersection(*(set(seen_by[y]) for y in keys))
                (first, steps), inside_here = _walk_of_one_key_tile(axis, pattern, start, kv_tile, q_tile, length)
                visited += steps
                inside += len(inside_here)
                assert queries, (axis, start)  # every key is seen by some query
                span = queries[-1] - queries[0] + 1
                assert first <= queries[0] and queries[-1] < first + steps * q_tile, (axis, kv_tile, q_tile, start)
                assert steps <= -(-span // q_tile) + 1
                for t in inside_here:
                    block = set(range(max(t, 0), min(t + q_tile, length)))
                    assert block <= every, (axis, kv_tile, q_tile, start, t)
            assert (visited, inside) == tiles._axis_query_steps(axis, pattern, kv_tile, q_tile, True)


def _walk_of_one_key_tile(axis, pattern, start, kv_tile, q_tile, length):
    """((first query tile's start, steps), starts of the tiles inside the common range) of the
    dK/dV walk for the key tile at ``start``, as tiles._axis_query_steps counts it."""
    from haloattn.geometry import query_range, window_query_range

    inverse = window_query_range if pattern == "window" else query_range
    last = min(start + kv_tile, length) - 1
    lo, common_hi = inverse(axis, start, length)
    common_lo, hi = inverse(axis, last, length)
    first = tiles.walk_start(lo, hi, common_lo, common_hi, q_tile, True)
    steps = -(-(hi - first) // q_tile)
    inside = [first + j * q_tile for j in range(steps)
              if common_lo <= first + j * q_tile and first + (j + 1) * q_tile <= common_hi]
    assert len(inside) == tiles.tiles_inside(first, steps, q_tile, common_lo, common_hi)
    return (first, steps), inside


@pytest.mark.parametrize("spatial,window,options,head_dim,changes", [
    ((16, 32, 32), (5, 9, 9), {}, 64, True),  # a video layer: 1.45x fewer pairs for dK/dV
    ((16, 32, 32), (5, 9, 9), {"causal": (True, False, False)}, 64, True),
    ((16, 48, 48), (7, 15, 15), {}, 128, True),
    ((128, 128), 32, {"stride": 16}, 128, True),
    ((128, 128), 31, {}, 128, False),  # the forward's boxes are the dK/dV walk's cheapest too
    ((16, 32, 32), (5, 9, 9), {}, 160, False),  # wide heads keep their rule's tiles
    ((56, 56), 7, {}, 32, False),  # narrow heads: 32-token tiles on 1 warp
])
def test_key_major_boxes_take_the_cheapest_inverse_walk(monkeypatch, spatial, window, options, head_dim, changes):
    """Where the rule applies (16-bit heads of at most 128 channels on 64-token 4-warp tiles),
    dK/dV takes the boxes of least key_major_cost when they save at least KEY_MAJOR_MIN_SAVING,
    and keeps the forward's otherwise; the dQ kernel and float32 keep theirs."""
    q = torch.empty(2, *spatial, 4, head_dim, dtype=torch.bfloat16, device="meta")
    problem = build_problem(q, q, q, window, **options)
    cfg = tiles.default_config.__wrapped__(problem)
    monkeypatch.setattr(tiles, "KEY_MAJOR_BOXES", False)
    before = tiles.default_config.__wrapped__(problem)
    assert cfg["dq"] == before["dq"] and cfg["fwd"] == before["fwd"]
    if not changes:
        assert cfg["dkdv"] == before["dkdv"]
        return
    speed = tiles.KEY_MAJOR_STREAM_32_SPEED if math.prod(cfg["dkdv"]["q"]) == 32 else 1.0
    new = tiles.key_major_cost(problem, cfg["dkdv"]["kv"], cfg["dkdv"]["q"], speed)
    old = tiles.key_major_cost(problem, before["dkdv"]["kv"], before["dkdv"]["q"])
    assert old >= tiles.KEY_MAJOR_MIN_SAVING * new, (cfg["dkdv"], before["dkdv"])
    # (the Gluon kernel follows the tiles: it takes 64 x 64 ones only)
    assert {k: v for k, v in cfg["dkdv"].items() if k not in ("q", "kv", "gluon")} == \
        {k: v for k, v in before["dkdv"].items() if k not in ("q", "kv", "gluon")}
    # Tuning can still pick the forward's boxes (and the next cheapest after the rule's).
    monkeypatch.setattr(tiles, "KEY_MAJOR_BOXES", True)
    tiles.default_config.cache_clear()
    candidates = [(c["dkdv"]["kv"], c["dkdv"]["q"]) for c in tiles.candidate_configs(problem) if c["dq"] == cfg["dq"]]
    assert (before["dkdv"]["kv"], before["dkdv"]["q"]) in candidates
    assert len(set(map(str, candidates))) >= 3
    # ... and one more stage on the rule's boxes, its other knobs the default's.
    # (a Triton kernel's knob: the candidate names the Triton kernel)
    deeper = dict(cfg["dkdv"], stages=cfg["dkdv"]["stages"] + 1, gluon=False)
    assert dict(cfg, dkdv=deeper) in tiles.candidate_configs(problem)
    float32 = build_problem(*(torch.empty_like(q, dtype=torch.float32),) * 3, window, **options)
    with_rule = tiles.default_config.__wrapped__(float32)
    monkeypatch.setattr(tiles, "KEY_MAJOR_BOXES", False)
    assert tiles.default_config.__wrapped__(float32) == with_rule


@pytest.mark.parametrize("spatial,window,options", [
    ((8, 8, 16), (5, 3, 7), {"causal": (True, False, False)}),  # 32-token streamed boxes
    ((4, 8, 16), (3, 5, 5), {}),
])
def test_key_major_boxes_are_exact(spatial, window, options, token_thinness):
    """The backward with dK/dV on boxes of its own (tiles.KEY_MAJOR_BOXES: another shape than dQ's,
    streamed boxes of 32 tokens) against the oracle, with GQA and the bias's gradient. (Boxes of
    the token thin-box rule: under window-relative thinness the first problem's dK/dV boxes are
    dQ's.)"""
    gen = torch.Generator().manual_seed(22)
    q = torch.randn(1, *spatial, 4, 64, generator=gen)
    k, v = (torch.randn(1, *spatial, 2, 64, generator=gen) for _ in range(2))
    rpb = torch.randn(4, *(2 * w - 1 for w in window), generator=gen)
    cfg = tiles.default_config(build_problem(q.bfloat16(), k.bfloat16(), v.bfloat16(), window, rpb=rpb, **options))
    assert cfg["dkdv"]["kv"] != cfg["dq"]["q"] or cfg["dkdv"]["q"] != cfg["dq"]["kv"], cfg
    assert_backward_on_config_is_exact(q, k, v, rpb, torch.randn_like(q), window, options, cfg)


def assert_backward_on_config_is_exact(q, k, v, rpb, grad, window, options, cfg):
    """Every gradient of float32 data on ``cfg`` (a 16-bit problem's tiles) against the oracle's."""
    problem = build_problem(q, k, v, window, rpb=rpb, **options)
    leaves = [t.double().requires_grad_(True) for t in (q, k, v, rpb)]
    ref, _ = oracle.attention(*leaves[:3], window, rpb=leaves[3], **options)
    ref_grads = torch.autograd.grad(ref, leaves, grad.double())
    inputs = AttentionInputs(q, k, v, rpb)
    out, lse = launch.forward(problem, inputs, cfg)
    needs = (True, True, True, True, False, False, False)
    grads = [g for g in launch.backward(problem, inputs, out, lse, grad, None, needs, cfg) if g is not None]
    for g, rg in zip(grads, ref_grads):
        assert oracle.rel_error(g, rg) <= 1e-5


def test_small_window_backward_tiles_are_exact():
    """The backward on tiles.SMALL_WINDOW_BACKWARD_TILES (a 3x3 window at 64 channels takes them)
    against the oracle, with GQA and the bias's gradient."""
    gen = torch.Generator().manual_seed(21)
    q = torch.randn(1, 12, 14, 4, 64, generator=gen)
    k, v = (torch.randn(1, 12, 14, 2, 64, generator=gen) for _ in range(2))
    rpb, grad = torch.randn(4, 5, 5, generator=gen), torch.randn(1, 12, 14, 4, 64, generator=gen)
    problem = build_problem(q.bfloat16(), k.bfloat16(), v.bfloat16(), 3, rpb=rpb)
    cfg = tiles.default_config(problem)
    assert cfg["dq"]["warps"] == tiles.SMALL_WINDOW_BACKWARD_TILES[2], cfg["dq"]
    assert_backward_on_config_is_exact(q, k, v, rpb, grad, 3, {}, cfg)


def test_every_tuning_candidate_runs_forward_correctly():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 9, 10, 2, 16, generator=gen) for _ in range(3))
    problem = build_problem(q, k, v, (3, 5), stride=(1, 2))
    ref, ref_lse = oracle.attention(q, k, v, (3, 5), stride=(1, 2))
    for config in tiles.candidate_configs(problem):
        out, lse = launch.forward(problem, AttentionInputs(q, k, v), config)
        assert oracle.rel_error(out, ref) <= 1e-5, config
        assert (lse.double() - ref_lse).abs().max() <= 1e-4, config


def test_small_window_tuning_candidates_run_correctly():
    """Small windows above 32 channels: the tuning candidates include the small forward tiles
    (tiles.SMALL_TILE_FORWARD_CANDIDATES) and backwards (SMALL_TILE_BACKWARD_CANDIDATES); every
    one of them matches the oracle, forward and backward; a large window offers none."""
    gen = torch.Generator().manual_seed(9)
    q, k, v, grad = (torch.randn(1, 10, 12, 2, 48, generator=gen) for _ in range(4))
    problem = build_problem(q, k, v, 3, causal=(True, False))
    base = tiles.default_config(problem)
    small = [c for c in tiles.candidate_configs(problem) if c in tiles._small_tile_candidates(problem, base)]
    warps = {(math.prod(c["fwd"]["q"]), c["fwd"]["warps"]) for c in small if c["fwd"] != base["fwd"]}
    assert {(16, 1), (16, 2), (32, 4)} <= warps
    assert {c["dq"]["warps"] for c in small if c["dq"] != base["dq"]} == {2}
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref, ref_lse = oracle.attention(*leaves, 3, causal=(True, False))
    ref_grads = torch.autograd.grad(ref, leaves, grad.double())
    inputs = AttentionInputs(q, k, v)
    needs = (True, True, True, False, False, False, False)
    for config in small:
        out, lse = launch.forward(problem, inputs, config)
        assert oracle.rel_error(out, ref.detach()) <= 1e-5, config["fwd"]
        grads = [g for g in launch.backward(problem, inputs, out, lse, grad, None, needs, config) if g is not None]
        for g, rg in zip(grads, ref_grads):
            assert oracle.rel_error(g, rg) <= 1e-5, (config["dq"], config["dkdv"])
    big = torch.empty(1, 64, 64, 2, 48, device="meta", dtype=torch.bfloat16)
    large = build_problem(big, big, big, 31)
    assert tiles._small_tile_candidates(large, tiles.default_config(large)) == []


def test_every_tuning_candidate_runs_backward_correctly():
    gen = torch.Generator().manual_seed(4)
    q, k, v, grad = (torch.randn(1, 9, 10, 2, 16, generator=gen) for _ in range(4))
    problem = build_problem(q, k, v, (3, 5), dilation=(2, 1), causal=(False, True))
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref, _ = oracle.attention(*leaves, (3, 5), dilation=(2, 1), causal=(False, True))
    ref_grads = torch.autograd.grad(ref, leaves, grad.double())
    inputs = AttentionInputs(q, k, v)
    out, lse = launch.forward(problem, inputs)
    needs = (True, True, True, False, False, False, False)
    seen = set()
    for config in tiles.candidate_configs(problem):
        key = repr((config["dq"], config["dkdv"]))
        if key in seen:
            continue
        seen.add(key)
        grads = launch.backward(problem, inputs, out, lse, grad, None, needs, config)[:3]
        for g, rg in zip(grads, ref_grads):
            assert oracle.rel_error(g, rg) <= 1e-5, config


def test_heuristic_tiles_fit_the_grid():
    q = torch.randn(1, 3, 40, 5, 2, 16)
    problem = build_problem(q, q, q, (3, 5, 3), dilation=(1, 2, 1))
    cfg = tiles.default_config(problem)
    for kernel in cfg.values():
        for part in ("q", "kv"):
            shape = kernel[part]
            assert len(shape) == 3 and all(s & (s - 1) == 0 for s in shape)
            assert shape[0] <= 4 and shape[2] <= 8  # no longer than the (rounded) axis
            assert 16 <= shape[0] * shape[1] * shape[2]


# What an untuned launch asks tiles.default_config for, per product precision: the exact-float32
# default where float32 products carry float32's accuracy.
EXACT_WHERE_PRODUCTS_ARE = {"ieee": {"exact_float32": True}, "tf32x3": {"exact_float32": True},
                            "tf32": {"exact_float32": False}}


def defaults_asked_for(monkeypatch, launch_call) -> dict:
    """{precision: the keyword arguments ``launch_call()`` passes tiles.default_config}, with the
    launcher's precision set to each of EXACT_WHERE_PRODUCTS_ARE's in turn. Under the interpreter
    the launcher's precision is "interpret", so the tests that need another set it here."""
    class Asked(Exception):
        pass

    def record(problem, **kwargs):
        raise Asked(kwargs)

    monkeypatch.setattr(tiles, "default_config", record)
    asked = {}
    for precision in EXACT_WHERE_PRODUCTS_ARE:
        monkeypatch.setattr(launch, "_precision", lambda dtype, precision=precision: precision)
        with pytest.raises(Asked) as raised:
            launch_call()
        asked[precision] = raised.value.args[0]
    return asked


def exact_backward_kernels(problem):
    """(resident tokens, streamed tokens, warps) of the dQ and dK/dV kernels of the exact-float32
    default, as tiles.EXACT_FLOAT32_BACKWARD names them."""
    cfg = tiles.default_config(problem, exact_float32=True)
    dq, dkdv = cfg["dq"], cfg["dkdv"]
    return {"dq": (math.prod(dq["q"]), math.prod(dq["kv"]), dq["warps"]),
            "dkdv": (math.prod(dkdv["kv"]), math.prod(dkdv["q"]), dkdv["warps"])}


@pytest.mark.parametrize("head_dim,value_dim,expected", [
    (16, 8, {"dq": (16, 32, 1), "dkdv": (16, 32, 1)}), (24, 32, {"dq": (16, 32, 2), "dkdv": (16, 32, 4)}),
    (64, 48, {"dq": (16, 32, 2), "dkdv": (32, 32, 4)}), (128, 96, {"dq": (16, 32, 4), "dkdv": (16, 32, 4)}),
    (256, 160, {"dq": (16, 32, 4), "dkdv": (16, 16, 4)})])
def test_exact_float32_backward_tiles_by_width(head_dim, value_dim, expected):
    """The exact-float32 backward's tiles and warps per kernel follow the head's width (the wider
    of head and value dims), and its tiles the forward's own shapes."""
    q = torch.empty(1, 24, 40, 2, head_dim, device="meta")
    v = torch.empty(1, 24, 40, 2, value_dim, device="meta")
    problem = build_problem(q, q, v, (9, 13))
    assert exact_backward_kernels(problem) == expected
    cfg = tiles.default_config(problem, exact_float32=True)
    ext = tiles.group_extents(problem)
    assert cfg["dq"]["q"] == tiles.fit(cfg["fwd"]["q"], ext, expected["dq"][0])
    assert cfg["dkdv"]["q"] == tiles.fit(cfg["fwd"]["kv"], ext, expected["dkdv"][1])


def test_exact_float32_backward_takes_small_tiles(monkeypatch):
    """Float32 without tf32 multiplies as three TF32 products or on CUDA cores, where the
    backward's 64-token tiles spill: its default takes 16-32-token tiles
    (tiles.EXACT_FLOAT32_BACKWARD; the additional-token kernel 16-token resident and 32-token
    streamed ones), and the backward with them is still exact. Under the interpreter the
    launcher's precision is "interpret", so the test hands that config over itself and checks
    separately that the launcher asks for it exactly when its precision is "ieee" or "tf32x3"."""
    gen = torch.Generator().manual_seed(8)
    q, k, v, grad = (torch.randn(1, 11, 15, 2, 16, generator=gen) for _ in range(4))
    ak, av = (torch.randn(1, 3, 2, 16, generator=gen) for _ in range(2))
    problem = build_problem(q, k, v, (5, 7), dilation=(1, 2), additional_keys=ak, additional_values=av)
    cfg = tiles.default_config(problem, exact_float32=True)
    assert exact_backward_kernels(problem) == dict(tiles.EXACT_FLOAT32_BACKWARD)[16]
    assert tiles.extra_kernel_blocks(problem, exact_float32=True)[:2] == (tiles.EXACT_FLOAT32_STREAM,
                                                                           tiles.EXACT_FLOAT32_RESIDENT)
    # Tuning weighs it too, so a tuned float32 backward is never slower than the untuned one.
    assert any(c["dq"] == cfg["dq"] and c["dkdv"] == cfg["dkdv"] for c in tiles.candidate_configs(problem))
    leaves = [t.double().requires_grad_(True) for t in (q, k, v, ak, av)]
    ref, _ = oracle.attention(*leaves[:3], (5, 7), dilation=(1, 2), additional_keys=leaves[3],
                              additional_values=leaves[4])
    ref_grads = torch.autograd.grad(ref, leaves, grad.double())
    inputs = AttentionInputs(q, k, v, additional_keys=ak, additional_values=av)
    out, lse = launch.forward(problem, inputs)
    needs = (True, True, True, False, False, True, True)
    grads = [g for g in launch.backward(problem, inputs, out, lse, grad, None, needs, cfg) if g is not None]
    for g, rg in zip(grads, ref_grads):
        assert oracle.rel_error(g, rg) <= 1e-5

    # Without a config, the launcher asks for that default exactly when its products are exact.
    assert defaults_asked_for(monkeypatch, lambda: launch.backward(problem, inputs, out, lse, grad, None, needs)) \
        == EXACT_WHERE_PRODUCTS_ARE


@pytest.mark.parametrize("head_dim,value_dim,warps", [(160, 64, 4), (48, 256, 4), (128, 64, 2), (80, 96, 2),
                                                    (64, 16, 1), (8, 24, 1)])
def test_exact_float32_takes_its_own_forward_tiles(monkeypatch, head_dim, value_dim, warps):
    """Float32 without tf32: the forward takes tiles.EXACT_FLOAT32_FORWARD_TILES (16 queries, 32
    keys, by pointer: the 16-bit model's tiles spilled kilobytes a thread at wide heads), on 4
    warps above 128 channels, 2 from 65 to 128 and 1 up to 64; with tf32 allowed the 16-bit
    model's tiles stay; tuning weighs the exact default; the forward on its tiles matches the
    oracle; and the launcher asks for the exact default exactly when its products are exact."""
    gen = torch.Generator().manual_seed(11)
    q, k = (torch.randn(1, 9, 13, 2, head_dim, generator=gen) for _ in range(2))
    v = torch.randn(1, 9, 13, 2, value_dim, generator=gen)
    problem = build_problem(q, k, v, (5, 7), causal=(False, True))
    cfg = tiles.default_config(problem, exact_float32=True)
    fwd, plain = cfg["fwd"], tiles.default_config(problem)["fwd"]
    queries, keys = tiles.EXACT_FLOAT32_FORWARD_TILES
    assert (math.prod(fwd["q"]), math.prod(fwd["kv"]), fwd["warps"], fwd["tma"], fwd["pack"]) == (
        queries, keys, warps, False, 1)
    assert plain != fwd
    assert any(c["fwd"] == fwd for c in tiles.candidate_configs(problem))
    inputs = AttentionInputs(q, k, v)
    out, lse = launch.forward(problem, inputs, cfg)
    ref, ref_lse = oracle.attention(q.double(), k.double(), v.double(), (5, 7), causal=(False, True))
    assert oracle.rel_error(out, ref) <= oracle.TOLERANCE[torch.float32]
    assert (lse.double() - ref_lse).abs().max().item() <= oracle.LSE_TOLERANCE[torch.float32]
    assert defaults_asked_for(monkeypatch, lambda: launch.forward(problem, inputs)) == EXACT_WHERE_PRODUCTS_ARE


def test_float32_products_follow_the_tf32_switch(monkeypatch):
    """float32 without TF32 allowed: three TF32 products (float32's accuracy) unless the variable
    asks for CUDA-core IEEE products; a bad value is named; TF32 allowed: one TF32 product."""
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.delenv(launch.FLOAT32_PRODUCTS_ENV, raising=False)
    matmul = torch.backends.cuda.matmul
    allowed = matmul.allow_tf32  # a property of torch's module object: monkeypatch cannot undo it
    try:
        matmul.allow_tf32 = False
        assert launch._precision(torch.float32) == "tf32x3"
        assert launch._precision(torch.bfloat16) == "tf32"  # 16-bit products are exact either way
        monkeypatch.setenv(launch.FLOAT32_PRODUCTS_ENV, "ieee")
        assert launch._precision(torch.float32) == "ieee"
        monkeypatch.setenv(launch.FLOAT32_PRODUCTS_ENV, "fp64")
        with pytest.raises(ValueError, match="HALOATTN_TRITON_FLOAT32='fp64'.*'tf32x3'.*'ieee'"):
            launch._precision(torch.float32)
        matmul.allow_tf32 = True
        assert launch._precision(torch.float32) == "tf32"
    finally:
        matmul.allow_tf32 = allowed


@pytest.mark.parametrize(
    "spatial,window,options",
    [
        ((12,), 5, dict(heads=4, kv_heads=2, head_dim=20, value_dim=32, softcap=3.0)),
        ((9, 11), (3, 5), dict(stride=(1, 2), dilation=(2, 1), causal=(True, False), rpb=True, heads=4, kv_heads=2,
                               extra=5)),
        ((4, 5, 6), (3, 2, 3), dict(stride=(1, 2, 3), dilation=(1, 2, 1), causal=(True, False, False), kv_heads=1,
                                    rpb=True, extra=2)),
        ((9, 11), (3, 4), dict(pattern="window", shift=(1, 2), causal=(False, True), rpb=True)),
    ],
    ids=["1d-gqa-softcap", "2d-mixed-rpb-extra", "3d-mixed-rpb-extra", "2d-window-rpb"],
)
def test_opt_in_atomic_dq_backward(monkeypatch, spatial, window, options):
    """HALOATTN_DETERMINISTIC=0 and a config asking for it: one KV-major pass adds dQ with atomics
    (and writes the rpb dS buffer); dq_kernel is not launched, and every gradient matches the oracle."""
    monkeypatch.setenv("HALOATTN_DETERMINISTIC", "0")
    monkeypatch.setattr(tiles, "default_config", atomic_default(tiles.default_config))
    launched = record_launches(monkeypatch)
    check_against_oracle(spatial, window, **options)
    names = {name for name, _ in launched}
    assert "dkdv_kernel" in names and "dq_kernel" not in names, names


def test_atomic_dq_only_when_allowed_and_never_under_torch_determinism(monkeypatch):
    q = torch.randn(1, 9, 10, 2, 16)
    problem = build_problem(q, q, q, (3, 5))
    monkeypatch.delenv("HALOATTN_DETERMINISTIC", raising=False)
    assert not any(c["dkdv"].get("atomic_dq") for c in tiles.candidate_configs(problem))
    monkeypatch.setenv("HALOATTN_DETERMINISTIC", "0")
    assert [c["dkdv"]["warps"] for c in tiles.candidate_configs(problem) if c["dkdv"].get("atomic_dq")] == [4, 8]
    monkeypatch.setattr(tiles, "default_config", atomic_default(tiles.default_config))

    def dq_kernel_ran():
        launched = record_launches(monkeypatch)
        check_against_oracle((7, 9), (3, 5), rpb=True)
        return "dq_kernel" in {name for name, _ in launched}

    monkeypatch.delenv("HALOATTN_DETERMINISTIC", raising=False)
    assert not tiles.atomic_dq_allowed()
    assert dq_kernel_ran()  # a config asking for atomics is not enough
    monkeypatch.setenv("HALOATTN_DETERMINISTIC", "0")
    assert tiles.atomic_dq_allowed()
    assert not dq_kernel_ran()
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not tiles.atomic_dq_allowed()
        assert dq_kernel_ran()
    finally:
        torch.use_deterministic_algorithms(previous)


@pytest.mark.parametrize("options", [
    dict(heads=4, kv_heads=2, rpb=True, extra=3, softcap=5.0),
    dict(heads=2, stride=(2, 1), causal=(False, True), rpb=True, value_dim=24),
], ids=["gqa-rpb-extra", "stride-causal-rpb"])
def test_batches_beyond_one_grid_run_in_slices(monkeypatch, options):
    """A batch larger than a grid axis holds (65535 on a GPU; 2 here) runs as one launch per
    slice: every output and gradient, the bias gradient summed over slices, matches the oracle."""
    from haloattn.backends.triton import batch_slices

    monkeypatch.setattr(batch_slices, "MAX_GRID_BATCH", 2)
    launched = record_launches(monkeypatch)
    check_against_oracle((6, 7), (3, 5), batch=5, **options)
    names = [name for name, _ in launched]
    assert names.count("forward_kernel") == 3 and names.count("dq_kernel") == 3, names


def _pretend_gpu(monkeypatch, optin_bytes, capability):
    """torch.cuda as on a GPU whose blocks may opt in to ``optin_bytes`` of shared memory."""
    from types import SimpleNamespace

    from haloattn.backends.triton import device_limits

    properties = SimpleNamespace(shared_memory_per_block_optin=optin_bytes, major=capability[0], minor=capability[1])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)
    _forget_configs()
    return device_limits


def _forget_configs():
    """Configs and budgets are cached per problem and device: these tests change the device."""
    from haloattn.backends.triton import device_limits

    for cached in (tiles.default_config, tiles._best_forward, device_limits._cuda_tile_budget):
        cached.cache_clear()


@pytest.fixture
def forget_configs():
    yield
    _forget_configs()


@pytest.mark.parametrize("value_dim,extra,block", [(16, 0, 16), (32, 0, 32), (16, 3, 64), (32, 1, 64), (128, 1, 128)])
def test_value_tiles_of_problems_with_additional_tokens_are_at_least_64_wide(value_dim, extra, block):
    """Triton 3.6 miscompiles the additional-token loop on Hopper for value tiles of 16 or 32
    columns (test_triton_gpu.py::test_additional_tokens_with_narrow_values): every kernel of such a
    problem gets 64-column value tiles, and its shared-memory estimate counts them."""
    q = torch.empty(1, 8, 8, 2, 128, dtype=torch.bfloat16)
    v = torch.empty(1, 8, 8, 2, value_dim, dtype=torch.bfloat16)
    more = {}
    if extra:
        more = dict(additional_keys=torch.empty(1, extra, 2, 128, dtype=torch.bfloat16),
                    additional_values=torch.empty(1, extra, 2, value_dim, dtype=torch.bfloat16))
    problem = build_problem(q, q, v, 5, **more)
    assert tiles.value_block(problem) == block


@pytest.mark.parametrize("optin_kib,capability", [(99, (8, 6)), (163, (8, 0)), (227, (9, 0)),
                                                    (227, (10, 0)), (99, (12, 0))],
                         ids=["ada-ampere-consumer", "a100", "hopper", "blackwell-datacenter", "blackwell-consumer"])
def test_configs_fit_the_shared_memory_of_the_device(monkeypatch, forget_configs, optin_kib, capability):
    """Tiles chosen on a GPU with less shared memory than Hopper's must fit it (Triton would refuse
    the launch with OutOfResources): default and every tuning candidate, every kernel; and the
    default reads K/V through descriptors only where the GPU has a copy engine."""
    device_limits = _pretend_gpu(monkeypatch, optin_kib * 1024, capability)
    budget = device_limits.tile_shared_budget(torch.device("cuda", 0))
    assert budget == optin_kib * 1024 - device_limits.COMPILER_RESERVE
    for head_dim, dtype, spatial, window in ((64, torch.float16, (64, 64), 13), (128, torch.bfloat16, (128, 128), 31),
                                             (256, torch.float16, (4096,), 255), (128, torch.float32, (8, 24, 24), 7)):
        q = torch.empty(1, *spatial, 2, head_dim, dtype=dtype)
        problem = dataclasses.replace(build_problem(q, q, q, window), device=torch.device("cuda", 0))
        item = q.element_size()
        # Tiles measured with TMA loads only where there is a copy engine (Hopper and newer).
        # (From 64 channels where the descriptors are built on the host, as on these undilated problems.)
        expect_tma = item == 2 and head_dim >= 64 and capability >= (9, 0)
        assert tiles.default_config(problem)["fwd"]["tma"] == expect_tma, (capability, head_dim, dtype)
        # The backward's streamed tiles: descriptors for head dims 64-128 (measured there).
        expect_bwd_tma = item == 2 and 64 <= head_dim <= 128 and capability >= (9, 0)
        for kernel in ("dq", "dkdv"):
            assert tiles.default_config(problem)[kernel]["tma"] == expect_bwd_tma, (capability, head_dim, kernel)
        # dK/dV (and above head dim 128 dQ) wait for their last product per step where ptxas
        # would serialise their wgmmas.
        assert tiles.default_config(problem)["dkdv"]["wait_dk"] == ((expect_bwd_tma and head_dim > 64)
                                                                    or head_dim > 128)
        assert tiles.default_config(problem)["dq"]["wait_dq"] == (head_dim > 128)
        for config in [tiles.default_config(problem)] + tiles.candidate_configs(problem):
            for kernel, cfg in config.items():
                size = tiles._shared_bytes(kernel, math.prod(cfg["q"]), math.prod(cfg["kv"]), cfg["stages"],
                                           head_dim, head_dim, item)
                assert size <= budget, (optin_kib, head_dim, dtype, kernel, cfg)
    if optin_kib == 227:  # Hopper keeps the budget its tiles were measured with
        assert budget == 200 * 1024


def _reasons(monkeypatch, interpret, **kw):
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.randn(1, 8, 2, 16, dtype=kw.pop("dtype", torch.float32))
    explanation = haloattn.explain(q, q, q, 3, **kw)
    verdict = next(v for v in explanation.verdicts if v.name == "triton")
    return verdict.reasons, explanation.chosen


def test_reasons_for_what_it_does_not_run(monkeypatch):
    reasons, _ = _reasons(monkeypatch, True, dtype=torch.float64)
    assert reasons == ["float64 runs on the reference backend"]
    reasons, _ = _reasons(monkeypatch, True, score_mod=lambda s, b, h, q, k: s, mask_mod=lambda b, h, q, k: q >= k)
    assert reasons == []  # compiled into the kernels (tests/test_triton_mods.py)
    # A mod whose operators have no translation is named with the operator.
    reasons, _ = _reasons(monkeypatch, True, score_mod=lambda s, b, h, q, k: s + torch.erf(s))
    assert len(reasons) == 1 and "aten.erf" in reasons[0], reasons
    # The reasons may only point at backends that exist.
    registered = {v.name for v in haloattn.explain(torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16),
                                                   torch.randn(1, 8, 2, 16), 3).verdicts}
    for reason in reasons:
        words = reason.replace("(", " ").replace(")", " ").split()
        for i, word in enumerate(words):
            if word in ("backend", "backends"):
                # "the X backend", "the X or Y backend(s)"
                names = [words[i - 1]] + ([words[i - 3]] if i >= 3 and words[i - 2] in ("or", "and") else [])
                for name in names:
                    assert name in registered, f"{reason!r} names backend {name!r}; registered: {registered}"
    reasons, _ = _reasons(monkeypatch, True, kq_conv=torch.randn(2, 2, 3))
    assert reasons == []  # the fused kq_conv kernels (tests/test_triton_kq_conv.py)
    reasons, _ = _reasons(monkeypatch, True, kq_conv=torch.randn(2, 17, 3))
    assert any("c_q=17" in r for r in reasons)


@pytest.mark.parametrize("hip,capability,expected", [
    (None, (9, 0), None),
    (None, (7, 5), "CUDA capability 7.5 is below 8.0"),
    ("6.2.41133", (9, 4), "is an AMD GPU (torch built for ROCm 6.2.41133)"),
    ("6.2.41133", (9, 0), "is an AMD GPU"),  # gfx90a reports 9.0, like a Hopper
])
def test_gpu_reasons_tell_nvidia_capabilities_from_amd_ones(monkeypatch, hip, capability, expected):
    from types import SimpleNamespace

    from haloattn.backends.triton import plugin

    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    problem = SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16)
    reasons = plugin.device_and_dtype_reasons(problem)
    if expected is None:
        assert reasons == []
    else:
        assert len(reasons) == 1 and expected in reasons[0], reasons


@pytest.mark.parametrize("version,refused", [("3.1.0", True), ("3.5.1", True), ("3.6.0", False),
                                              ("3.7.0+git1a2b3c", False), ("4.0.0", False)])
def test_a_triton_older_than_the_tested_one_is_refused_by_name(monkeypatch, version, refused):
    """Both Triton backends decline a Triton older than the one their kernels are tested with,
    naming both versions, instead of failing inside Triton's compiler."""
    import triton

    monkeypatch.setattr(triton, "__version__", version)
    reasons, chosen = _reasons(monkeypatch, True)
    window = next(v for v in haloattn.explain(*(torch.randn(1, 8, 2, 16),) * 3, 4, pattern="window").verdicts
                  if v.name == "triton_window")
    if refused:
        assert len(reasons) == 1 and f"Triton {version} is older than 3.6" in reasons[0], reasons
        assert window.reasons == reasons and chosen != "triton"
    else:
        assert reasons == [] and window.reasons == [] and chosen == "triton"


def test_cpu_problems_stay_on_the_reference_without_the_interpreter(monkeypatch):
    reasons, chosen = _reasons(monkeypatch, False)
    assert any(r.startswith("device cpu: Triton runs on CUDA devices") or "no CUDA device" in r for r in reasons)
    assert chosen != "triton"
    reasons, chosen = _reasons(monkeypatch, True)
    assert reasons == [] and chosen == "triton"


def test_strided_views_are_read_in_place():
    """q, k, v as views of one packed [B, *spatial, 3, H, D] projection (no copies made) give the
    oracle's output and gradients."""
    gen = torch.Generator().manual_seed(4)
    qkv = torch.randn(1, 6, 7, 3, 2, 16, generator=gen).requires_grad_(True)
    q, k, v = qkv.unbind(-3)
    out = haloattn.attention(q, k, v, (3, 5), dilation=(2, 1), backend="triton")
    grad = torch.randn(out.shape, generator=gen)
    (g,) = torch.autograd.grad(out, qkv, grad)
    ref_qkv = qkv.detach().double().requires_grad_(True)
    ref, _ = oracle.attention(*ref_qkv.unbind(-3), (3, 5), dilation=(2, 1))
    (ref_g,) = torch.autograd.grad(ref, ref_qkv, grad.double())
    assert oracle.rel_error(out, ref) <= 1e-5
    assert oracle.rel_error(g, ref_g) <= 1e-5


def test_only_some_inputs_need_gradients():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 10, 2, 16, generator=gen) for _ in range(3))
    rpb = torch.randn(2, 5, generator=gen).requires_grad_(True)
    v.requires_grad_(True)
    out = haloattn.attention(q, k, v, 3, rpb=rpb, causal=True, backend="triton")
    grad = torch.randn(out.shape, generator=gen)
    g_v, g_rpb = torch.autograd.grad(out, (v, rpb), grad)
    leaves = [t.detach().double().requires_grad_(True) for t in (v, rpb)]
    ref, _ = oracle.attention(q.double(), k.double(), leaves[0], 3, rpb=leaves[1], causal=True)
    r_v, r_rpb = torch.autograd.grad(ref, leaves, grad.double())
    assert oracle.rel_error(g_v, r_v) <= 1e-5 and oracle.rel_error(g_rpb, r_rpb) <= 1e-5


@pytest.mark.parametrize("length,window,stride,causal", [(64, 31, 1, False), (50, 7, 3, False), (40, 9, 1, True)])
def test_cost_model_counts_a_dilation_group_like_an_undilated_axis(length, window, stride, causal):
    """Group 0 of an axis of length 2L with dilation 2 is an undilated axis of length L."""
    from haloattn.geometry import Axis

    for q_tile, kv_tile in ((8, 8), (16, 8), (4, 16)):
        dilated = tiles._axis_steps(Axis(2 * length, window, stride, 2, causal), "neighborhood", q_tile, kv_tile, True)
        plain = tiles._axis_steps(Axis(length, window, stride, 1, causal), "neighborhood", q_tile, kv_tile, True)
        assert dilated == plain


@pytest.mark.parametrize("magnitude", [0.5, 40.0])
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("fold", [True, False], ids=["folded-scale", "scaled-first"])
def test_both_rescaling_rules_match_the_oracle(lazy, magnitude, fold):
    # Lazy rescaling keeps stale row maxima until a tile raises one by more than 2^8: small scores
    # (magnitude 0.5) never trigger it after the first tile, large ones (40) trigger it on most
    # tiles, and keys that grow along the sequence make every tile raise the maxima a little.
    # Both ways of applying the scale (folded into the exponent, the default here, or applied to
    # each score first) keep their maxima in different units, so each meets both rules.
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(1, 40, 2, 16, generator=gen) * magnitude
    k = torch.randn(1, 40, 2, 16, generator=gen) + torch.linspace(0, 3, 40)[None, :, None, None]
    v = torch.randn(1, 40, 2, 16, generator=gen)
    problem = build_problem(q, k, v, 33)
    config = {"fwd": {"q": [16], "kv": [16], "lazy_rescale": lazy, "fold_scale": fold}}
    out, lse = launch.forward(problem, AttentionInputs(q, k, v), config)
    ref, ref_lse = oracle.attention(q.double(), k.double(), v.double(), 33)
    assert oracle.rel_error(out, ref) <= 1e-5
    assert (lse.double() - ref_lse).abs().max() <= 1e-4 * max(1.0, ref_lse.abs().max().item())


@pytest.mark.parametrize("chunk", [launch.RPB_GRADIENT_CHUNK, 1], ids=["all-heads", "head-by-head"])
@pytest.mark.parametrize(
    "spatial, window, options",
    [((9, 11), (3, 5), dict(dilation=(2, 1), causal=(True, False))), ((5, 6, 7), (3, 3, 5), {}),
     ((40,), 7, dict(stride=3)), ((10, 9), (4, 3), dict(pattern="window", shift=(2, 1))),
     # A long axis with a large window: a dense [L, K, 2K-1] one-hot matrix would take 69 GB.
     ((4096,), 1023, {})],
)
def test_bias_gradient_equals_a_scatter_add(spatial, window, options, chunk, monkeypatch):
    """The bias gradient's per-axis contractions (whole or head by head) equal a plain
    scatter-add of every (query, slot) score gradient into its table entry. Slots whose entry
    falls outside the table lie past their query's count, where the kernels' dS is zero: zero
    here too."""
    from haloattn.geometry import key_range, unravel

    monkeypatch.setattr(launch, "RPB_GRADIENT_CHUNK", chunk)
    H = 3
    q = torch.randn(2, *spatial, H, 8)
    wins = window if isinstance(window, tuple) else (window,)
    rpb = torch.randn(H, *(2 * w - 1 for w in wins))
    problem = build_problem(q, q, q, window, rpb=rpb, **options)
    ds = torch.randn(2, H, problem.tokens, math.prod(problem.window))
    coords = unravel(torch.arange(problem.tokens), problem.spatial)
    entry = torch.zeros(problem.tokens, *problem.window, dtype=torch.long)
    inside = torch.ones(problem.tokens, *problem.window, dtype=torch.bool)
    for a, axis in enumerate(problem.axes):
        _, lo, _ = key_range(axis, problem.pattern, coords[a])
        rel = (lo - coords[a] // axis.dilation + axis.window - 1)[:, None] + torch.arange(axis.window)[None, :]
        shape = [problem.tokens] + [1] * problem.rank
        shape[1 + a] = axis.window
        entry = entry * (2 * axis.window - 1) + rel.clamp(0, 2 * axis.window - 2).view(shape)
        inside = inside & ((rel >= 0) & (rel <= 2 * axis.window - 2)).view(shape)
    ds = ds * inside.reshape(1, 1, problem.tokens, -1)
    expected = torch.zeros(H, rpb[0].numel(), dtype=torch.float64)
    expected.index_add_(1, entry.flatten(), ds.sum(0).double().reshape(H, -1))
    got = launch.rpb_gradient(problem, ds, rpb)
    assert got.dtype == rpb.dtype and got.shape == rpb.shape
    assert oracle.rel_error(got, expected.view(rpb.shape)) <= 1e-6


# From the range's low end with one mask for all axes; anchored with one mask; anchored with
# masks per crossed axis.
WALKS = {"aligned": dict(anchor=False, axis_masks=False), "anchored": dict(anchor=True, axis_masks=False),
         "axis-masks": dict(anchor=True, axis_masks=True)}


def _anchored_walks(problem, q_tile, kv_tile):
    """(walks that start below coordinate 0, walks the anchor moved) over every query tile of
    group 0 on every axis, by the host twin of the kernels' tile_start."""
    from haloattn.geometry import key_range

    below = moved = 0
    for axis, tq, tk in zip(problem.axes, q_tile, kv_tile):
        for start in range(0, axis.group_length(0), tq):
            last = min(start + tq, axis.group_length(0)) - 1
            _, lo, common_hi = key_range(axis, problem.pattern, start * axis.dilation)
            _, common_lo, hi = key_range(axis, problem.pattern, last * axis.dilation)
            first = tiles.walk_start(lo, hi, common_lo, common_hi, tk, True)
            below += first < 0
            moved += first != lo
    return below, moved


WALK_PROBLEMS = {
    "1d": ((37,), 11, [8], [4], dict(causal=False)),
    "1d-stride-causal": ((30,), 9, [4], [4], dict(stride=3, causal=True)),
    "2d-dilated-causal": ((13, 22), (11, 7), [4, 4], [4, 4],
                          dict(dilation=(1, 2), causal=(False, True), rpb=True, softcap=5.0)),
    "3d-causal-time": ((5, 9, 10), (3, 7, 7), [2, 2, 4], [1, 4, 4], dict(causal=(True, False, False), rpb=True)),
    "2d-window-shift": ((12, 10), (8, 5), [4, 4], [4, 4], dict(pattern="window", shift=(3, 0), rpb=True)),
}
# The 3-D problem takes the interpreter about 3.5 minutes per walk: the walk from the low end (the
# one every other test exercises) is left out there.
WALK_CASES = [(problem, walk) for problem in WALK_PROBLEMS for walk in WALKS
              if not (problem.startswith("3d") and walk == "aligned")]


@pytest.mark.parametrize("problem,walk", WALK_CASES, ids=[f"{p}-{w}" for p, w in WALK_CASES])
def test_every_tile_walk_matches_the_oracle(problem, walk):
    """Forward, LSE and every gradient (rpb included) with the streamed tiles walked from the low
    end of their range or anchored at the common range (starting below coordinate 0, so the
    loads must drop those rows), masked all at once or per crossed axis: the same as the oracle.
    Small tiles make the anchor move on every neighbourhood problem (asserted, so the test cannot
    pass without exercising it); a window of the "window" pattern is one tile-aligned box, so
    there the walk never moves, and that case checks that nothing else changes."""
    spatial, window, q_tile, kv_tile, options = WALK_PROBLEMS[problem]
    gen = torch.Generator().manual_seed(len(spatial) + len(walk))
    options = dict(options)
    heads = 2
    wins = window if isinstance(window, tuple) else (window,)
    q, k, v = (torch.randn(1, *spatial, heads, 16, generator=gen) for _ in range(3))
    rpb = torch.randn(heads, *(2 * w - 1 for w in wins), generator=gen) * 0.5 if options.pop("rpb", False) else None
    problem = build_problem(q, k, v, window, rpb=rpb, **options)
    below, moved = _anchored_walks(problem, q_tile, kv_tile)
    if problem.pattern == "neighborhood":
        assert moved > 0 and (below > 0 or any(problem.causal))
    knobs = dict(WALKS[walk], warps=4, stages=2)
    config = {"fwd": dict(q=q_tile, kv=kv_tile, **knobs), "dq": dict(q=q_tile, kv=kv_tile, **knobs),
              "dkdv": dict(q=kv_tile, kv=q_tile, **knobs)}
    inputs = AttentionInputs(q, k, v, rpb=rpb)
    out, lse = launch.forward(problem, inputs, config)
    grad = torch.randn(out.shape, generator=gen)
    needs = (True, True, True, rpb is not None, False, False, False)
    grads = launch.backward(problem, inputs, out, lse, grad, None, needs, config)

    leaves = [t.double().requires_grad_(True) for t in (q, k, v) + ((rpb,) if rpb is not None else ())]
    ref, ref_lse = oracle.attention(*leaves[:3], window, rpb=leaves[3] if rpb is not None else None, **options)
    ref_grads = torch.autograd.grad(ref, leaves, grad.double())
    assert oracle.rel_error(out, ref) <= 1e-5
    assert (lse.double() - ref_lse).abs().max() <= 1e-4
    for got, expected in zip(grads, ref_grads):
        assert oracle.rel_error(got, expected) <= 1e-5


def test_anchored_descriptor_loads_equal_pointer_loads():
    """Tiles starting below coordinate 0 read through tensor descriptors (out-of-bounds rows come
    back as zeros) give bit for bit what the masked pointer loads give."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 13, 22, 2, 32, generator=gen).bfloat16() for _ in range(3))
    problem = build_problem(q, k, v, (11, 7), dilation=(1, 2))
    assert _anchored_walks(problem, [4, 4], [4, 4])[0] > 0
    inputs = AttentionInputs(q, k, v)
    grad = torch.randn(q.shape, generator=gen).bfloat16()
    needs = (True, True, True, False, False, False, False)
    results = []
    for tma in (False, True):
        knobs = dict(warps=4, stages=2, tma=tma, anchor=True, axis_masks=True)
        config = {"fwd": dict(q=[4, 4], kv=[4, 4], **knobs), "dq": dict(q=[4, 4], kv=[4, 4], **knobs),
                  "dkdv": dict(q=[4, 4], kv=[4, 4], **knobs)}
        out, lse = launch.forward(problem, inputs, config)
        results.append((out, lse) + launch.backward(problem, inputs, out, lse, grad, None, needs, config)[:3])
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "spatial,window,options,head_dim",
    [
        ((40,), 17, dict(kv_heads=2, causal=True), 32),
        ((10, 12), (5, 7), dict(stride=(2, 1), rpb=True), 48),
        ((5, 6, 7), (3, 5, 3), dict(causal=(True, False, False), kv_heads=1), 32),
    ],
    ids=["1d-gqa-causal", "2d-stride-rpb-tail", "3d-merged-heads-mqa"],
)
def test_host_descriptors_equal_device_descriptors(monkeypatch, spatial, window, options, head_dim):
    """K/V, Q/dO and statistics tiles through descriptors built once on the host (coordinates name
    the batch element and head; at rank 3 heads and channels share one axis) give bit for bit what
    descriptors built by every program give, forward and every gradient, and match the oracle."""
    from haloattn.backends.triton import fast_launch, host_descriptors

    gen = torch.Generator().manual_seed(head_dim + len(spatial))
    kv_heads = options.pop("kv_heads", 2)
    q = torch.randn(2, *spatial, 2, head_dim, generator=gen).bfloat16()
    k, v = (torch.randn(2, *spatial, kv_heads, head_dim, generator=gen).bfloat16() for _ in range(2))
    rpb = None
    if options.pop("rpb", False):
        rpb = torch.randn(2, *(2 * w - 1 for w in window), generator=gen).bfloat16()
    problem = build_problem(q, k, v, window, rpb=rpb, **options)
    inputs = AttentionInputs(q, k, v, rpb=rpb)
    config = descriptor_config(problem)
    heads = launch.head_block_constexprs(problem, config["fwd"], "ieee")
    assert host_descriptors.host_descriptors_fit(len(spatial), [1] * 3, k, heads["BLOCK_D"], heads["TAIL_D"])
    grad = torch.randn(q.shape, generator=gen).bfloat16()
    needs = (True, True, True, rpb is not None, False, False, False)
    results = []
    for host in (False, True):
        monkeypatch.setattr(host_descriptors, "HOST_DESCRIPTORS", host)
        fast_launch.clear_plans()  # plans of other tests in this process
        out, lse = launch.forward(problem, inputs, config)
        grads = launch.backward(problem, inputs, out, lse, grad, None, needs, config)[:4]
        results.append((out, lse) + tuple(g for g in grads if g is not None))
        forward_plans = [plan[2].launch for plan in launch._FORWARD_PLANS.values()]
        backward_plans = [entry[0].launch for plan in launch._BACKWARD_PLANS.values() for entry in plan[2]]
        # forward: K, V (and tails); dQ: the same; dK/dV: Q, dO (and tails), statistics rows
        assert [len(p.descriptors) > 0 for p in forward_plans + backward_plans] == [host] * 3
    fast_launch.clear_plans()
    for a, b in zip(*results):
        assert torch.equal(a, b)
    ref, _ = oracle.attention(q.double(), k.double(), v.double(), window, rpb=rpb, **options)
    assert oracle.rel_error(results[1][0], ref) <= oracle.TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize(
    "spatial,window,options",
    [((37,), 9, dict(causal=True)), ((9, 11), (5, 3), dict(kv_heads=1)),
     ((3, 5, 6), (3, 3, 5), dict(stride=(1, 2, 1)))],
    ids=["1d-causal", "2d-mqa", "3d-strided"],
)
def test_query_boxes_equal_pointers(monkeypatch, spatial, window, options):
    """The forward's query tile read, and its output written, through host descriptors of
    query-tile boxes (launch.HOST_QUERY_BOXES, each half alone and both) give bit for bit what
    pointer loads and stores give, on grids that end in partial tiles (rows past the grid read as
    zeros and are not written), on a plan's first call and on a later call's tensors, and match
    the oracle."""
    from haloattn.backends.triton import fast_launch

    gen = torch.Generator().manual_seed(len(spatial) + 40)
    kv_heads = options.pop("kv_heads", 2)

    def tensors():
        q = torch.randn(2, *spatial, 2, 32, generator=gen).bfloat16()
        return (q,) + tuple(torch.randn(2, *spatial, kv_heads, 32, generator=gen).bfloat16() for _ in range(2))

    calls = [tensors(), tensors()]
    problem = build_problem(*calls[0], window, **options)
    config = descriptor_config(problem)
    outputs = {}
    for query, output in ((False, False), (True, False), (False, True), (True, True)):
        monkeypatch.setattr(launch, "HOST_QUERY_BOXES", {"query": query, "output": output})
        fast_launch.clear_plans()
        outputs[query, output] = [launch.forward(problem, AttentionInputs(*qkv), config) for qkv in calls]
        plan = next(iter(launch._FORWARD_PLANS.values()))[2]
        assert len(plan.launch.descriptors) == 2 + query + output  # K, V and the boxes
    fast_launch.clear_plans()
    for variant in outputs.values():
        for (out, lse), (want_out, want_lse) in zip(variant, outputs[False, False]):
            assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    for (out, _), (q, k, v) in zip(outputs[True, True], calls):
        ref, _ = oracle.attention(q.double(), k.double(), v.double(), window, **options)
        assert oracle.rel_error(out, ref) <= oracle.TOLERANCE[torch.bfloat16]


def test_host_descriptors_follow_each_calls_tensors():
    """A launch plan keeps its descriptors' shapes, strides and boxes but not their tensors: a
    later call on other tensors of the same layout reads those, packed programs included, even
    where the building call passed one tensor as q, k and v."""
    gen = torch.Generator().manual_seed(4)
    window = (5, 5)
    same = torch.randn(3, 7, 9, 4, 32, generator=gen).bfloat16()
    tensors = [[same] * 3] + [[torch.randn(3, 7, 9, 4, 32, generator=gen).bfloat16() for _ in range(3)]
                              for _ in range(2)]
    problem = build_problem(*tensors[0], window)
    base = descriptor_config(problem)
    for pack in (1, 4):
        config = dict(base, fwd=dict(base["fwd"], pack=pack))
        for q, k, v in tensors:
            out, _ = launch.forward(problem, AttentionInputs(q, k, v), config)
            plan = launch._FORWARD_PLANS[next(key for key in launch._FORWARD_PLANS if key[1] == id(config))][2]
            assert len(plan.launch.descriptors) == 2 + launch.HOST_QUERY_BOXES["output"]  # K, V (and the output)
            ref, _ = oracle.attention(q.double(), k.double(), v.double(), window)
            assert oracle.rel_error(out, ref) <= oracle.TOLERANCE[torch.bfloat16]


def test_host_descriptors_only_where_one_describes_every_program():
    from haloattn.backends.triton.host_descriptors import host_descriptors_fit

    packed = torch.randn(1, 4, 5, 6, 3, 64).bfloat16()  # rank 3: heads and channels merge
    assert host_descriptors_fit(3, [1, 1, 1], packed, 64, 0)
    narrow = torch.randn(1, 4, 5, 6, 3, 48).bfloat16()
    assert host_descriptors_fit(3, [1, 1, 1], narrow, 32, 16)  # a head block and a tail, no padding
    assert not host_descriptors_fit(3, [1, 1, 1], narrow, 64, 0)  # a padded column would read the next head
    assert not host_descriptors_fit(3, [1, 1, 1], packed[..., :48], 32, 16)  # heads not back to back
    assert not host_descriptors_fit(3, [1, 2, 1], packed, 64, 0)  # dilation: one group a program
    assert host_descriptors_fit(2, [1, 1, 1], packed[0, ..., :48], 64, 0)  # rank 2: padding reads zeros
    assert not host_descriptors_fit(2, [1, 1, 2], packed[0], 64, 0)


def test_anchoring_never_adds_steps():
    """The host twin of the kernels' walk: on random axes and tiles, the anchored walk visits as
    many tiles as the walk from the range's low end, covers the same range, and has at least as
    many tiles inside the common range."""
    from haloattn.geometry import Axis

    rng = torch.Generator().manual_seed(2)
    for _ in range(300):
        length, window = (int(x) for x in torch.randint(2, 70, (2,), generator=rng))
        window = min(window, length)
        stride = int(torch.randint(1, window + 1, (1,), generator=rng))
        causal = bool(torch.randint(0, 2, (1,), generator=rng))
        axis = Axis(length, window, stride, 1, causal)
        for q_tile, kv_tile in ((4, 4), (8, 4), (2, 8), (16, 16)):
            aligned = tiles._axis_steps(axis, "neighborhood", q_tile, kv_tile, False)
            anchored = tiles._axis_steps(axis, "neighborhood", q_tile, kv_tile, True)
            assert anchored[0] == aligned[0] and anchored[1] >= aligned[1], (axis, q_tile, kv_tile)


def test_tile_choice_counts_the_masks_of_crossing_tiles(monkeypatch):
    """With masks priced (MASKED_AXIS_COST > 0) the chooser takes key tiles that cross the common
    window on fewer axes per step than the tiles it takes on computed pairs alone, for a 3-D window
    whose 16-token axes no 16-wide tile fits (7x15x15, the benchmark's 3-D problem)."""
    q = torch.empty(1, 16, 48, 48, 2, 128, device="meta", dtype=torch.bfloat16)
    problem = build_problem(q, q, q, (7, 15, 15))

    def crossings_per_step(q_tile, kv_tile):
        per_axis = [tiles._axis_steps(a, problem.pattern, t, u, True) for a, t, u in zip(problem.axes, q_tile, kv_tile)]
        return sum(1 - inside / visited for visited, inside in per_axis)

    chosen = {}
    for cost in (0.0, 0.2):
        monkeypatch.setattr(tiles, "MASKED_AXIS_COST", cost)
        tiles._best_forward.cache_clear()
        chosen[cost] = tiles._best_forward(problem, False)[:2]
    tiles._best_forward.cache_clear()
    assert crossings_per_step(*chosen[0.2]) < crossings_per_step(*chosen[0.0]) - 0.2, chosen


@pytest.mark.parametrize("kernel,part,atomic", [("forward_kernel", "fwd", False), ("dkdv_kernel", "dkdv", False),
                                                ("dkdv_kernel", "dkdv", True)])
def test_kernels_compiled_too_large_are_refitted(kernel, part, atomic, monkeypatch):
    """A kernel whose compiled shared memory exceeds the GPU's (Triton's OutOfResources at its
    first launch: the tile estimate leaves out what the compiler adds, e.g. float32 D=256 needed
    279040 bytes of an H200's 232448) runs again with tiles refitted to the overshoot, gives the
    oracle's results, and the smaller tiles stay in the plan for later calls."""
    from triton.runtime.errors import OutOfResources

    from haloattn.backends.triton import fast_launch

    largest, refused = 16, []
    original = fast_launch.Launch.__call__

    def pretend_small_gpu(self, *tensors):
        args = dict(zip(self.kernel.arg_names, self.arguments))
        if self.kernel.__name__ == kernel:
            tokens = math.prod(args[f"{'TN' if part == 'dkdv' else 'TM'}{a}"] for a in range(3))
            if tokens > largest:
                refused.append(tokens)
                raise OutOfResources(200_000 + 1000 * tokens, 200_000, "shared memory")
        return original(self, *tensors)

    monkeypatch.setattr(fast_launch.Launch, "__call__", pretend_small_gpu)
    if atomic:  # the opt-in backward that adds dQ into a float32 sum: refits restart that sum
        monkeypatch.setenv(tiles.DETERMINISTIC_ENV, "0")
        atomic_config, configs = atomic_default(tiles.default_config), {}
        # One dict per problem, as the dispatcher hands out (plans are keyed by the config's identity).
        monkeypatch.setattr(tiles, "default_config", lambda p, **kw: configs.setdefault(p, atomic_config(p, **kw)))
    fast_launch.clear_plans()
    check_against_oracle((9, 11), (5, 3), dtype=torch.float32, heads=2, head_dim=16, seed=5)
    assert refused, "the resident tiles were never larger than the pretended limit"
    refused.clear()
    check_against_oracle((9, 11), (5, 3), dtype=torch.float32, heads=2, head_dim=16, seed=6)
    assert not refused, f"the refitted plan was not kept: refused again at {refused}"
    fast_launch.clear_plans()


def test_additional_token_kernel_fits_the_shared_memory():
    """The additional-token dK/dV kernel's blocks shrink with the head dim: at float32 and head
    dim 256 its fixed 64 x 64 tiles in two stages compiled to 279040 bytes of shared memory on an
    H200, more than the 232448 it has."""
    for dtype, head_dim in ((torch.float32, 256), (torch.float32, 128), (torch.bfloat16, 256), (torch.float16, 64)):
        q = torch.empty(1, 40, 2, head_dim, dtype=dtype)
        extra = torch.empty(1, 7, 2, head_dim, dtype=dtype)
        problem = build_problem(q, q, q, 9, additional_keys=extra, additional_values=extra)
        queries, tokens, stages = tiles.extra_kernel_blocks(problem)
        size = tiles._shared_bytes("dkdv", queries, tokens, stages, head_dim, head_dim, q.element_size())
        assert size <= tiles.tile_shared_budget(problem.device), (dtype, head_dim, queries, tokens, stages)
        assert min(queries, tokens) >= tiles.MIN_TILE
    check_against_oracle((40,), 9, dtype=torch.float32, heads=2, head_dim=256, extra=3, seed=3)


def test_a_plan_whose_kernel_needs_scratch_sets_the_allocator_in_every_thread(monkeypatch):
    """Triton asks a per-thread allocator for the buffer of on-device tensor descriptors. A plan
    built and first run in one thread (where use_descriptors set the allocator) and run again in
    a fresh thread must give that thread an allocator before the kernel starts (GPU test:
    test_triton_gpu.py::test_plans_built_in_one_thread_run_in_another)."""
    import threading

    from haloattn.backends.triton import descriptor_scratch, fast_launch

    class Built:
        n_regs, n_spills = 128, 0

        def __init__(self, scratch_bytes):
            self.metadata = type("Metadata", (), {"global_scratch_size": scratch_bytes})()

    def stand_in_for(scratch_bytes, seen):
        class Kernel:  # resolve(kernel): records whether the launching thread had an allocator
            def __getitem__(self, grid):
                return lambda *args, **options: seen.append(descriptor_scratch.has_allocator()) or Built(scratch_bytes)
        return Kernel()

    kernel = launch.forward_kernel
    x = torch.zeros(4)
    args = {name: (x if name in ("Q", "K", "V", "O", "LSE", "RPB", "AK", "AV") else 1) for name in kernel.arg_names}

    def in_fresh_thread(fn):
        worker = threading.Thread(target=fn)
        worker.start()
        worker.join()

    for scratch_bytes, wanted in ((128, [True]), (0, [False])):
        seen = []
        monkeypatch.setattr(fast_launch, "resolve", lambda fn: stand_in_for(scratch_bytes, seen))
        plan = fast_launch.Launch(kernel, (1,), [], args)
        in_fresh_thread(lambda: plan(*[x] * len(plan.slots)))  # the building thread: first call
        seen.clear()
        in_fresh_thread(lambda: plan(*[x] * len(plan.slots)))  # a thread that never set one
        assert seen == wanted, (scratch_bytes, seen)


def test_kernels_built_with_few_registers_and_the_rest_spilled_are_rebuilt_capped(monkeypatch):
    """ptxas sometimes builds a kernel that needs more than 255 registers with 32-40 and the rest
    in local memory (6-320 KB of spill stores a thread on sm_80 and sm_89: tests/test_arch_compile.py
    builds such a case): a launch plan whose first build came out so rebuilds it (without running
    it) with ``maxnreg`` 255 and launches that from then on; builds that merely spill, or that a
    launcher capped itself, stay as they are."""
    from haloattn.backends.triton import device_limits, fast_launch

    assert device_limits.built_degenerately(32, 8936)
    assert not device_limits.built_degenerately(255, 2444)  # spills, but with every register in use
    assert not device_limits.built_degenerately(40, 0)

    class Built:
        def __init__(self, registers, local_words):
            self.n_regs, self.n_spills = registers, local_words

    class Kernel:
        """Stands in for resolve(kernel): what its launches and warm-ups were given."""
        def __init__(self, first_build):
            self.first_build, self.launched, self.warmed = first_build, [], []

        def __getitem__(self, grid):
            return lambda *args, **options: self.launched.append(options) or self.first_build

        def warmup(self, *args, grid, **options):
            self.warmed.append(options)
            return Built(255, 600)

    kernel = launch.forward_kernel
    x = torch.zeros(4)
    args = {name: (x if name in ("Q", "K", "V", "O", "LSE", "RPB", "AK", "AV") else 1) for name in kernel.arg_names}

    def first_calls(first_build, **options):
        stand_in = Kernel(first_build)
        monkeypatch.setattr(fast_launch, "resolve", lambda fn: stand_in)
        plan = fast_launch.Launch(kernel, (1,), [], dict(args, **options))
        plan(*[x] * len(plan.slots))
        plan(*[x] * len(plan.slots))
        return stand_in

    degenerate = first_calls(Built(32, 8936 // 4), num_warps=4)
    assert degenerate.warmed == [{"num_warps": 4, "maxnreg": 255}]
    assert degenerate.launched == [{"num_warps": 4}, {"num_warps": 4, "maxnreg": 255}]
    spilling = first_calls(Built(255, 600), num_warps=4)
    assert spilling.warmed == [] and spilling.launched == [{"num_warps": 4}] * 2
    capped = first_calls(Built(32, 8936 // 4), num_warps=4, maxnreg=128)
    assert capped.warmed == [] and capped.launched == [{"num_warps": 4, "maxnreg": 128}] * 2


def _computed_over_attended(problem, q_tile, kv_tile) -> float:
    """Pairs the forward computes on these boxes (the cost model's walk, no mask surcharge) per
    pair the problem attends, from the oracle's key ranges."""
    from haloattn.geometry import key_range
    steps = math.prod(visited for visited, _ in tiles._axis_walks(problem, q_tile, kv_tile))
    computed = steps * math.prod(q_tile) * math.prod(kv_tile)
    attended = 1
    for axis in problem.axes:
        _, lo, hi = key_range(axis, problem.pattern, torch.arange(axis.length))
        attended *= int((hi - lo).sum())
    return computed / attended


# Axial and per-frame attention: a window of 1 on some axes (each query sees its own row, column
# or frame there). Boxes one token deep on those axes compute no pair across them. (spatial,
# window, options, most pairs computed per attended pair by the default forward: before the
# thin-box rule left window-1 axes out, the 2-D rows took boxes 4 deep, 4.6-5.2x; the temporal
# window's short axis holds 64 queries of one column only, and a causal 9-key window wastes most.)
WINDOW_ONE_AXES = [((128, 128), (1, 63), {}, 2.1), ((128, 128), (63, 1), {"causal": (True, False)}, 2.1),
                   ((64, 96), (1, 31), {"dilation": (1, 2)}, 1.4), ((16, 48, 48), (1, 15, 15), {}, 2.1),
                   ((64, 24, 24), (9, 1, 1), {"causal": (True, False, False)}, 7.6)]


@pytest.mark.parametrize("spatial,window,options,most", WINDOW_ONE_AXES,
                         ids=["row", "column-causal", "row-dilated", "per-frame", "temporal-causal"])
def test_axes_of_window_one_take_boxes_one_token_deep(spatial, window, options, most):
    """Every kernel's boxes are one token deep on the window-1 axes (the thin-box rule does not
    count those axes), and the forward computes at most ``most`` pairs per attended pair."""
    q = torch.empty(1, *spatial, 8, 128, device="meta", dtype=torch.bfloat16)
    problem = build_problem(q, q, q, window, **options)
    config = tiles.normalise(None, problem)
    ones = [i for i, w in enumerate(window) if w == 1]
    for kernel in ("fwd", "dq", "dkdv"):
        for part in ("q", "kv"):
            assert all(config[kernel][part][i] == 1 for i in ones), (kernel, part, config[kernel])
    assert _computed_over_attended(problem, config["fwd"]["q"], config["fwd"]["kv"]) <= most


def test_thin_box_rule_still_keeps_thin_boxes_out_where_windows_are_wide():
    """Where no axis has window 1 the rule is as before: no box more than 8x longer on one axis
    than on another (the 2-D 31x31 issue problem: no 1 x 64 or 2 x 32 boxes)."""
    q = torch.empty(1, 128, 128, 8, 128, device="meta", dtype=torch.bfloat16)
    problem = build_problem(q, q, q, 31)
    for tokens in (64, 128):
        shapes = tiles._shapes(problem, tokens)
        assert shapes and all(max(s) <= 8 * min(s) for s in shapes), shapes


def _record_default_configs(monkeypatch) -> list:
    """A list that every config tiles.default_config returns from now on (for this test) is
    appended to: the configs a call through the backend ran on."""
    chosen = []
    default_config = tiles.default_config

    def recording(problem, **kwargs):
        chosen.append(default_config(problem, **kwargs))
        return chosen[-1]

    monkeypatch.setattr(tiles, "default_config", recording)
    return chosen


@pytest.mark.parametrize(
    "spatial,window,options",
    [((3, 64), (1, 7), dict(heads=2, kv_heads=1)), ((64, 3), (5, 1), dict(causal=(True, False), rpb=True)),
     ((2, 2, 128), (1, 1, 9), dict(dilation=(1, 1, 2), softcap=3.0))],
    ids=["row", "column-causal-rpb", "3d-row-dilated"],
)
def test_window_one_axes_on_their_own_boxes_match_the_oracle(spatial, window, options, monkeypatch):
    """The kernels on boxes one token deep on the window-1 axes (as the default picks them for
    axial attention), forward, LSE and every gradient against the float64 oracle."""
    chosen = _record_default_configs(monkeypatch)
    check_against_oracle(spatial, window, dtype=torch.float32, **options)
    ones = [i for i, w in enumerate(window) if w == 1]
    assert chosen and all(config[kernel][part][i] == 1 for config in chosen for kernel in ("fwd", "dq", "dkdv")
                          for part in ("q", "kv") for i in ones), chosen


@pytest.mark.parametrize("spatial,window,options", [
    ((96, 2), (12, 2), {}), ((64, 1, 2), (2, 1, 2), dict(stride=(2, 1, 2))),
    ((4096, 2), (65, 2), dict(causal=(True, False))), ((2, 300), (2, 31), dict(dilation=(1, 3))),
])
@pytest.mark.parametrize("dtype,head_dim", [(torch.bfloat16, 128), (torch.float32, 16)])
def test_grids_with_an_axis_of_two_have_boxes(spatial, window, options, dtype, head_dim):
    """An axis of 2 tokens with a window of 2 leaves only boxes 16 or more times longer than deep;
    the thin-box rule then keeps the least thin instead of none (the default config raised a
    TypeError there before 2026-12-07)."""
    q = torch.empty(1, *spatial, 2, head_dim, device="meta", dtype=dtype)
    problem = build_problem(q, q, q, window, **options)
    config = tiles.normalise(None, problem)
    for kernel in ("fwd", "dq", "dkdv"):
        assert all(t <= max(2, e) for part in ("q", "kv") for t, e in zip(config[kernel][part], spatial)), config


def test_a_grid_with_an_axis_of_two_matches_the_oracle():
    check_against_oracle((70, 2), (9, 2), dtype=torch.float32, causal=(False, True), rpb=True)




def test_window_relative_thinness_admits_boxes_shaped_like_the_window(window_relative_thinness):
    """With THIN_RELATIVE_TO_WINDOW a box as long as the window on each axis is not thin, however
    many tokens longer it is on one axis: under a 3 x 63 window the 2 x 32 and 1 x 64 boxes are
    candidates and the default computes fewer pairs than on the boxes the token rule allows; boxes
    the token rule keeps stay (31 x 31: the same boxes with the flag on or off)."""
    q = torch.empty(1, 128, 128, 8, 128, device="meta", dtype=torch.bfloat16)
    anisotropic = build_problem(q, q, q, (3, 63))
    assert {(2, 32), (1, 64)} <= set(tiles._shapes(anisotropic, 64))
    relative = tiles.default_config(anisotropic)["fwd"]
    square = build_problem(q, q, q, 31)
    with_flag = tiles._shapes(square, 64)
    tiles.THIN_RELATIVE_TO_WINDOW = False
    window_relative_thinness()  # the caches, dropped
    assert tiles._shapes(square, 64) == with_flag
    tokens = tiles.default_config(anisotropic)["fwd"]
    assert max(relative["q"]) > 8 * min(relative["q"]) or max(relative["kv"]) > 8 * min(relative["kv"])
    assert (_computed_over_attended(anisotropic, relative["q"], relative["kv"])
            < _computed_over_attended(anisotropic, tokens["q"], tokens["kv"]))


def test_window_shaped_boxes_match_the_oracle(window_relative_thinness, monkeypatch):
    """The kernels on the window-shaped boxes that window-relative thinness admits (a 3 x 33
    window on a 6 x 128 grid: boxes 16x or more longer than deep), forward, LSE and every gradient
    against the float64 oracle."""
    chosen = _record_default_configs(monkeypatch)
    check_against_oracle((6, 128), (3, 33), dtype=torch.float32, causal=(True, False), rpb=True)
    assert chosen and any(max(c[k][p]) >= 16 * min(c[k][p]) for c in chosen for k in ("fwd", "dq", "dkdv")
                          for p in ("q", "kv")), chosen


def _random_meta_problem(rng):
    """A random problem on meta tensors: every rank, pattern, dtype and head width, axes of 1-513
    tokens, windows up to the axis, dilations, strides, causal axes and shifts."""
    rank = rng.choice((1, 2, 3))
    spatial = [rng.choice((1, 2, 3, 4, 5, 7, 8, 16, 33, 64, 70, 96, 128, 200, 513)) for _ in range(rank)]
    if rank == 3:
        spatial = [min(s, 64) for s in spatial]
    pattern = rng.choice(("neighborhood", "neighborhood", "window"))
    window = [rng.randint(1, s) for s in spatial]
    dilation = [1] * rank
    for a in range(rank):
        d = rng.randint(2, 4)
        if rng.random() < 0.25 and spatial[a] // d >= window[a]:
            dilation[a] = d
    options = dict(pattern=pattern, dilation=tuple(dilation))
    if pattern == "neighborhood" and rng.random() < 0.3:
        options["stride"] = tuple(rng.randint(1, w) for w in window)
    if rng.random() < 0.3:
        options["causal"] = tuple(rng.random() < 0.5 for _ in range(rank))
    if pattern == "window" and rng.random() < 0.4:
        options["shift"] = tuple(rng.randint(0, w - 1) for w in window)
    dtype = rng.choice((torch.bfloat16, torch.float16, torch.float32))
    head_dim = rng.choice((8, 16, 24, 32, 48, 64, 72, 80, 96, 128, 144, 160, 192, 256))
    value_dim = rng.choice((head_dim, head_dim, 32, 64))
    heads = rng.choice((1, 2, 4, 8, 16))
    kv_heads = rng.choice([h for h in (1, 2, 4, 8, 16) if heads % h == 0])
    batch = rng.choice((1, 2, 7))
    q = torch.empty(batch, *spatial, heads, head_dim, device="meta", dtype=dtype)
    k = torch.empty(batch, *spatial, kv_heads, head_dim, device="meta", dtype=dtype)
    v = torch.empty(batch, *spatial, kv_heads, value_dim, device="meta", dtype=dtype)
    return build_problem(q, k, v, tuple(window), **options)


def test_every_problem_has_a_default_config_and_tuning_candidates():
    """300 random problems (_random_meta_problem): the default config, the Gluon forward's tiling
    and the tuning candidates exist, and every box is a power-of-two box of 16-256 tokens (16 at
    least: tl.dot's smallest operand, however small the grid). (A 96 x 2 grid with a window of 2
    on its short axis once had no box.)"""
    rng = random.Random(20261207)
    for _ in range(300):
        problem = _random_meta_problem(rng)
        config = tiles.default_config.__wrapped__(problem)
        tiles.gluon_forward_boxes(problem)
        assert tiles.candidate_configs(problem)
        for kernel in ("fwd", "dq", "dkdv"):
            for part in ("q", "kv"):
                box = config[kernel][part]
                assert len(box) == problem.rank and all(t & (t - 1) == 0 for t in box), (problem, config[kernel])
                assert 16 <= math.prod(box) <= 256, (problem, config[kernel])


def test_launch_plans_of_random_problems_on_each_gpu(monkeypatch):
    """150 random problems (_random_meta_problem) through the launch code, forward and backward,
    on meta tensors with the launches captured (benchmarks/sm90_compile.py) and the device limits
    of an A100, an H100 or an RTX 5090 (the interpreter off, as on a GPU): every plan is made
    (tiles fitted to the device's shared memory, descriptors or pointers, packing, batch slices)
    and launches its kernels."""
    monkeypatch.delenv("TRITON_INTERPRET")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from sm90_compile import GPUS, captured_launches

    rng = random.Random(1207)
    needs = (True, True, True, False, False, False, False)
    for _ in range(150):
        problem = _random_meta_problem(rng)
        gpu = GPUS[rng.choice((80, 90, 120))]
        q, k, v = (torch.empty(problem.batch, *problem.spatial, heads, dim, device="meta", dtype=problem.dtype)
                   for heads, dim in ((problem.heads, problem.head_dim), (problem.kv_heads, problem.head_dim),
                                      (problem.kv_heads, problem.value_dim)))
        with captured_launches(launch, gpu) as launched:
            inputs = AttentionInputs(q, k, v)
            out, lse = launch.forward(problem, inputs, None)
            forward_launches = len(launched)
            launch.backward(problem, inputs, out, lse, torch.empty_like(out), None, needs, None)
        assert forward_launches >= 1 and len(launched) > forward_launches, (gpu.name, problem)
