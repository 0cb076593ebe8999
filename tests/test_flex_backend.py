"""The flex backend's own logic on a CPU: token order, lookup-table mask, BlockMask classes, mods,
gathers and scatters, against the float64 oracle (tests/oracle.py) and brute force.

torch's FlexAttention compiles only for CUDA here, so these tests run it unfused
(``HALOATTN_FLEX_COMPILE=0``: torch's reference implementation of Flex, dense scores per head)
and let torch's Flex differentiate on a CPU (it refuses CPU tensors that require grad, because its
*compiled* CPU kernel has no backward; its unfused path is plain autograd). What they check is
haloattn's side, which is the same compiled or not; tests/test_flex_gpu.py runs the compiled
kernels on a GPU.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import haloattn
from haloattn.geometry import Axis, attends
from haloattn.problem import build_problem

import oracle
from test_reference_oracle import make_inputs, mask_odd_heads, mask_sparse, problems, score_bias_by_head, score_distance

pytest.importorskip("torch.nn.attention.flex_attention")

from haloattn.backends.flex import masks, run, token_order  # noqa: E402
from haloattn.backends.flex.plugin import FlexBackend, flex_unavailable_reason, head_dim_rule  # noqa: E402

_FLEX_UNUSABLE = flex_unavailable_reason()
if _FLEX_UNUSABLE:  # this torch's Flex lacks what the backend builds on (torch 2.5)
    pytest.skip(_FLEX_UNUSABLE, allow_module_level=True)


@pytest.fixture
def unfused_flex(monkeypatch):
    import torch.nn.attention.flex_attention as flex_module

    monkeypatch.setenv("HALOATTN_FLEX_COMPILE", "0")
    monkeypatch.delenv("HALOATTN_BACKEND", raising=False)
    # Flex's device check refuses CPU tensors; torch 2.5 has no such function
    monkeypatch.setattr(flex_module, "_validate_device", lambda *args: None, raising=False)
    run.clear_plans()
    yield
    run.clear_plans()


def _flex_dim(dim: int) -> int:
    """``dim``, or the next dim this torch's Flex takes where it takes a fixed list (torch 2.6)."""
    supported = head_dim_rule()
    while supported is not None and not supported(dim):
        dim += 1
    return dim


def _flex_spec(spec):
    spec = dict(spec)
    spec["kq_conv"] = None  # refused by the backend (test_refusals)
    spec["head_dim"], spec["value_dim"] = _flex_dim(spec["head_dim"]), _flex_dim(spec["value_dim"])
    return spec


def _leaves(tensors, kw):
    extra = [kw.get(n) for n in ("rpb", "additional_keys", "additional_values")]
    return [t for t in list(tensors.values()) + extra if t is not None]


@pytest.mark.usefixtures("unfused_flex")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.booleans())
# an ill-conditioned additional-key gradient (softcap 0.7, scale -1.5) that CI once drew
@example(dict(spatial=(3,), batch=2, heads=2, kv_heads=1, head_dim=4, value_dim=1, window=(1,), rpb=True,
              kw=dict(stride=[1], dilation=(1,), causal=(False,), pattern="neighborhood", shift=(0,)),
              softcap=0.7, scale=-1.5, extra=1, score_mod=score_bias_by_head, mask_mod=mask_odd_heads,
              kq_conv=None, seed=2147483647), False)
# a key gradient of float32 rounding where rows attend one key (CI drew it, 2026-11-27)
@example(dict(spatial=(4,), batch=1, heads=1, kv_heads=1, head_dim=1, value_dim=5, window=(1,), rpb=False,
              kw=dict(stride=[1], dilation=(1,), causal=(False,), pattern="neighborhood", shift=(0,)),
              softcap=None, scale=None, extra=1, score_mod=None, mask_mod=mask_sparse, kq_conv=None,
              seed=4203), False)
# a query gradient that is rounding alone: rows that attend one key (CI drew it, 2026-12-02)
@example(dict(spatial=(5,), batch=1, heads=1, kv_heads=1, head_dim=5, value_dim=2, window=(1,), rpb=False,
              kw=dict(stride=[1], dilation=(1,), causal=(False,), pattern="neighborhood", shift=(0,)),
              softcap=None, scale=-1.5, extra=1, score_mod=score_distance, mask_mod=mask_sparse, kq_conv=None,
              seed=208), False)
def test_flex_matches_oracle(spec, through_lse):
    """Outputs, LSE and every gradient (q, k, v, rpb, additional tokens) in float32 against the
    float64 oracle, over every pattern parameter, GQA, D_v != D, scale, softcap, rpb, mods and
    additional tokens."""
    spec = _flex_spec(spec)
    tensors, kw = make_inputs(spec, torch.float32, requires_grad=True)
    out, lse = haloattn.attention(*tensors.values(), spec["window"], return_lse=True, backend="flex", **kw)
    ref_out, ref_lse = oracle.attention(*tensors.values(), spec["window"], **kw)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32 and out.shape == ref_out.shape
    assert oracle.rel_error(out, ref_out) <= oracle.TOLERANCE[torch.float32], spec
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), "empty rows differ"
    finite = torch.isfinite(ref_lse)
    if finite.any():
        scale = max(1.0, ref_lse[finite].abs().max().item())
        assert (lse.double() - ref_lse)[finite].abs().max().item() <= oracle.LSE_TOLERANCE[torch.float32] * scale
    if not finite.all():
        assert (out.movedim(-1, 0)[:, ~finite] == 0).all()  # empty rows: output 0
        return  # the oracle's logsumexp has no gradient on empty rows
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64)
    gl = torch.randn(lse.shape, generator=g, dtype=torch.float64) if through_lse else None

    def loss(o, l):
        return (o.double() * go).sum() + ((l.double() * gl).sum() if gl is not None else 0)

    leaves = _leaves(tensors, kw)
    grads = torch.autograd.grad(loss(out, lse), leaves)
    ref_grads = torch.autograd.grad(loss(ref_out, ref_lse), leaves)
    floor_out, floor_lse = oracle.attention(*tensors.values(), spec["window"], compute_dtype=torch.float32, **kw)
    floor_grads = torch.autograd.grad(loss(floor_out, floor_lse), leaves)
    # What rounding of the backward's usual form, dS = P (dP - rowsum(dO * O)), leaves where the
    # exact dS cancels (rows whose softmax holds one key: seed 4203 gives 2.5e-5 from flex's float32,
    # 0.2x this model; seed 208 3.8e-4, 0.7x), which the plain float32 run may round to 0 exactly
    model_grads = oracle.gradient_rounding_floor(*tensors.values(), spec["window"], go, gl, leaves,
                                                 seed=spec["seed"], **kw)
    for leaf, a, b, f, m in zip(leaves, grads, ref_grads, floor_grads, model_grads):
        assert a.dtype == torch.float32
        err = oracle.rel_error(a, b)
        # An rpb entry sums score gradients that cancel (each softmax row's sum to zero without
        # an lse seed), so float32 rounding is larger relative to it; 1e-3 still catches any
        # misplaced or missing bias (errors of order 1).
        tolerance = 1e-3 if leaf is kw.get("rpb") else oracle.TOLERANCE[torch.float32]
        # Other gradients can be small sums of cancelling terms too (an additional key seen by
        # every query through a saturated softcap: seed 2147483647 gives 2e-5 from flex and from
        # a plain float32 run alike): allow a few times what float32 misses by on these inputs,
        # measured and modelled; a wrong gradient is still off by order 1.
        tolerance = max(tolerance, 3 * oracle.rel_error(f, b), 4 * oracle.rounding_share(m, b))
        assert err <= tolerance, f"gradient of a {tuple(leaf.shape)} input: rel error {err:.3g} for {spec}"


def _random_axes(rng, rank, pattern):
    axes = []
    for _ in range(rank):
        L = int(rng.integers(1, {1: 700, 2: 45, 3: 14}[rank]))
        Dl = int(rng.integers(1, min(L, 3) + 1))
        K = int(rng.integers(1, max(1, L // Dl) + 1))
        S = int(rng.integers(1, K + 1)) if pattern == "neighborhood" else 1
        shift = int(rng.integers(0, K)) if pattern == "window" else 0
        axes.append(Axis(L, K, S, Dl, bool(rng.integers(0, 2)), shift))
    return tuple(axes)


@pytest.mark.parametrize("seed", range(24))
def test_block_classes_are_exact(seed):
    """Every (query tile, key tile) block is listed empty / partial / full exactly as its pairs
    are none / some / all attended; padding keys never sit in a full block (full blocks skip the
    mask, so a wrong 'full' would be a silent wrong answer); the lookup-table mask equals the
    rule pair by pair."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rank = seed % 3 + 1
    pattern = "window" if seed % 4 == 3 else "neighborhood"
    axes = _random_axes(rng, rank, pattern)
    spatial = tuple(a.length for a in axes)
    q = torch.zeros(1, *spatial, 1, 16)
    problem = build_problem(
        q, q, q, tuple(a.window for a in axes), stride=tuple(a.stride for a in axes),
        dilation=tuple(a.dilation for a in axes), causal=tuple(a.causal for a in axes),
        pattern=pattern, shift=tuple(a.shift for a in axes),
    )
    order = token_order.TokenOrder(problem)
    P, Bs = order.positions, token_order.BLOCK
    exact = torch.ones(P, P, dtype=torch.bool)
    for axis, c in zip(problem.axes, order.coords):
        exact &= attends(axis, pattern, c[:, None], c[None, :])
    exact &= order.valid[None, :]  # padding is never a key
    tables = masks.axis_tables(problem, order, "cpu")
    lookup = torch.ones(P, P, dtype=torch.bool)
    for t in tables:
        code = t.code[:P].long()
        lookup &= (t.lo[:P, None] <= code[None, :]) & (code[None, :] < t.hi[:P, None])
    real = order.valid[:, None]  # padding queries' rows are never written
    assert torch.equal(lookup & real, exact & real)
    nonempty, full = masks.grid_block_classes(problem, order)
    per_block = exact.reshape(P // Bs, Bs, P // Bs, Bs)
    rows_real = order.valid.reshape(P // Bs, Bs)[:, :, None, None]
    some = (per_block & rows_real).any(3).any(1)
    every = (per_block | ~rows_real).all(3).all(1)
    assert torch.equal(nonempty, some)
    assert torch.equal(full, every & some)
    padded_key_blocks = ~order.valid.reshape(P // Bs, Bs).all(1)
    assert not full[:, padded_key_blocks].any()


@pytest.mark.parametrize(
    "spatial, dilation, expected",
    [((128,), (1,), (128,)), ((64, 64), (1, 1), (8, 16)), ((16, 48, 48), (1, 1, 1), (2, 8, 8)),
     ((96, 8), (1, 1), (16, 8)), ((40, 40), (1, 2), (16, 8)), ((1, 33, 16), (1, 1, 1), (1, 8, 16))],
)
def test_tile_shape_pads_least(spatial, dilation, expected):
    """The tile is the 128-token box with the least padding, the compact preferred shape among
    equals; the order visits every grid token exactly once."""
    axes = tuple(Axis(L, 1, 1, d) for L, d in zip(spatial, dilation))
    tile = token_order.choose_tile(axes)
    assert tile == expected
    least = min(
        token_order.padded_positions(axes, t)
        for t in [(a, b, c)[: len(axes)] for a in (1, 2, 4, 8, 16, 32, 64, 128) for b in (1, 2, 4, 8, 16, 32, 64, 128)
                  for c in (1, 2, 4, 8, 16, 32, 64, 128)]
        if math.prod(t) == 128 and len(t) == len(axes)
    )
    assert token_order.padded_positions(axes, tile) == least
    q = torch.zeros(1, *spatial, 1, 8)
    order = token_order.TokenOrder(build_problem(q, q, q, 1, dilation=dilation))
    assert torch.equal(order.source[order.place], torch.arange(math.prod(spatial)))
    assert order.positions % token_order.BLOCK == 0


@pytest.mark.usefixtures("plain_cpu_environment")
def test_refusals(monkeypatch):
    monkeypatch.delenv("HALOATTN_FLEX_COMPILE", raising=False)
    backend = FlexBackend()
    q = torch.randn(1, 6, 2, 8, dtype=torch.float64)
    reasons = " ".join(backend.not_supported_reasons(build_problem(q, q, q, 3, kq_conv=torch.randn(2, 1, 3))))
    assert "kq_conv" in reasons and "float64" in reasons and "head_dim 8 is below 16" in reasons
    wide = torch.randn(1, 6, 2, 320)
    assert "head_dim 320 in float32" in " ".join(backend.not_supported_reasons(build_problem(wide, wide, wide, 3)))
    assert not any("320" in r for r in backend.not_supported_reasons(build_problem(wide.half(), wide.half(), wide.half(), 3)))
    if not torch.cuda.is_available():
        assert "compiled FlexAttention runs fused on CUDA" in reasons
        explanation = haloattn.explain(q.float(), q.float(), q.float(), 3, verbose=False)
        assert explanation.chosen == "reference"


@pytest.mark.usefixtures("unfused_flex")
def test_plans_are_reused_and_rpb_tracks_the_call():
    """A second call reuses the plan (no new tables, no new BlockMask); the bias is the call's own
    tensor, not the one the plan was built with."""
    q, k, v = (torch.randn(1, 9, 10, 2, 8) for _ in range(3))
    rpb = torch.randn(2, 5, 5)
    first = haloattn.attention(q, k, v, 3, rpb=rpb, backend="flex")
    plan = run.plan_for(build_problem(q, k, v, 3, rpb=rpb))
    other = torch.randn(2, 5, 5)
    second = haloattn.attention(q, k, v, 3, rpb=other, backend="flex")
    assert run.plan_for(build_problem(q, k, v, 3, rpb=rpb)) is plan
    ref = haloattn.attention(q, k, v, 3, rpb=other, backend="reference")
    assert oracle.rel_error(second, ref) <= 1e-5 and oracle.rel_error(first, ref) > 1e-3


def test_a_flex_without_sequence_lengths_is_refused_by_name(monkeypatch):
    """torch 2.5's BlockMask.from_kv_blocks takes no seq_lengths, which the block masks need: the
    backend says so (and explain() with it) instead of failing inside a call."""
    from torch.nn.attention.flex_attention import BlockMask

    def from_kv_blocks(kv_num_blocks, kv_indices, full_kv_num_blocks=None, full_kv_indices=None, BLOCK_SIZE=128,
                       mask_mod=None):
        raise AssertionError("not to be called")

    monkeypatch.setattr(BlockMask, "from_kv_blocks", staticmethod(from_kv_blocks))
    reasons = FlexBackend().available()
    assert len(reasons) == 1 and "from_kv_blocks(seq_lengths=...)" in reasons[0] and torch.__version__ in reasons[0]


@pytest.mark.usefixtures("unfused_flex")
def test_a_flex_of_listed_head_dims_refuses_others_by_name(monkeypatch):
    """torch 2.6's Flex takes the head dims of a fixed list only (its _supported_head_dim): the
    backend refuses the others, naming the dim, the torch and the list, instead of failing inside Flex."""
    import torch.nn.attention.flex_attention as flex_module

    monkeypatch.setattr(flex_module, "_supported_head_dim", lambda n: n in (2, 4, 8, 16, 32), raising=False)
    q, v = torch.randn(1, 9, 2, 16), torch.randn(1, 9, 2, 24)
    assert FlexBackend().not_supported_reasons(build_problem(q, q, v, 3)) == [
        f"value head_dim (D_v) 24: torch {torch.__version__}'s FlexAttention takes only 2, 4, 8, 16, 32"]
    assert FlexBackend().not_supported_reasons(build_problem(q, q, q, 3)) == []


def test_recompile_limit_is_raised_and_fails_loudly():
    """Each problem shape compiles its own Flex graph; past torch's default limit of 8 Flex would
    otherwise run unfused (N x N scores) without a word."""
    import torch._dynamo

    config = torch._dynamo.config
    with run._recompile_limits():
        if hasattr(config, "recompile_limit"):
            assert config.recompile_limit >= 1024
            assert config.fail_on_recompile_limit_hit is True
        else:  # torch 2.5's names; it cannot be told to fail
            assert config.cache_size_limit >= 1024 and config.accumulated_cache_size_limit >= 4096


def test_shared_memory_overflow_retries_smaller_tiles(monkeypatch):
    """A config that overflows shared memory moves to the next smaller tiles, which the plan keeps;
    any other error propagates untouched."""
    calls = []

    def fake(q, k, v, score_mod, block_mask, scale, options):
        calls.append(options)
        if options is None:
            raise RuntimeError("No valid triton configs. OutOfMemoryError: out of resource: Required: 248832 Hardware limit:232448")
        return "ran"

    monkeypatch.setattr(run, "_call_flex_once", fake)
    plan = type("P", (), {"kernel_options": None, "block_mask": None})()
    assert run._call_flex(plan, None, None, None, None, 1.0) == "ran"
    assert calls == [None, run.SMALLER_TILES[0]] and plan.kernel_options is run.SMALLER_TILES[0]
    calls.clear()
    assert run._call_flex(plan, None, None, None, None, 1.0) == "ran" and calls == [run.SMALLER_TILES[0]]

    def broken(*args):
        raise ValueError("a bug")

    monkeypatch.setattr(run, "_call_flex_once", broken)
    with pytest.raises(ValueError, match="a bug"):
        run._call_flex(type("P", (), {"kernel_options": None, "block_mask": None})(), None, None, None, None, 1.0)


def score_with_value_branch(score, b, h, q_idx, kv_idx):
    # fine on the reference's broadcast tensors, impossible for Flex's per-score vmap
    return score * 2 if bool((score > 0).all()) else score


def score_with_shape(score, b, h, q_idx, kv_idx):
    return score + torch.linspace(0, 1, q_idx.shape[1], dtype=score.dtype).view(1, -1, 1, 1)


@pytest.mark.usefixtures("unfused_flex")
@pytest.mark.parametrize("mod", [score_with_value_branch, score_with_shape])
def test_mods_flex_cannot_trace_go_to_the_reference(mod):
    """A mod written for the reference's broadcast call (value branches, shape arithmetic) is
    refused with the probe's error, so the dispatcher picks the reference instead of failing."""
    q, k, v = (torch.randn(1, 6, 7, 2, 16) for _ in range(3))
    explanation = haloattn.explain(q, k, v, 3, score_mod=mod, verbose=False)
    verdicts = {v.name: v for v in explanation.verdicts}
    assert not verdicts["flex"].can_run and "vmapped over scalars" in " ".join(verdicts["flex"].reasons)
    assert explanation.chosen != "flex"
    assert FlexBackend().not_supported_reasons(build_problem(q, k, v, 3, score_mod=oracle_free_mod)) == []


def oracle_free_mod(score, b, h, q_idx, kv_idx):
    return score + 0.1 * h - 0.01 * (q_idx - kv_idx)


@pytest.mark.usefixtures("unfused_flex")
def test_kept_graph_and_recomputed_backward_agree():
    """Eager calls differentiate the forward's kept Flex graph (also twice, with retain_graph);
    under torch.compile the custom op's backward recomputes the forward. Same gradients."""
    q, k, v = (torch.randn(2, 7, 9, 4, 16, requires_grad=True) for _ in range(3))
    rpb = torch.randn(4, 5, 7, requires_grad=True)
    kw = dict(rpb=rpb, score_mod=oracle_free_mod, backend="flex", return_lse=True)

    def loss(fn):
        out, lse = fn(q, k, v, (3, 4), **kw)
        return (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum() + 0.5 * lse.sum()

    eager = loss(haloattn.attention)
    first = torch.autograd.grad(eager, (q, k, v, rpb), retain_graph=True)
    again = torch.autograd.grad(eager, (q, k, v, rpb))
    compiled = torch.autograd.grad(loss(torch.compile(haloattn.attention, fullgraph=True)), (q, k, v, rpb))
    for a, b, c in zip(first, again, compiled):
        assert oracle.rel_error(b, a) <= 1e-6  # (rpb's gradient is a scatter-add: order may vary)
        assert oracle.rel_error(c, a) <= 1e-5


@pytest.mark.usefixtures("unfused_flex")
def test_backward_overflow_moves_to_smaller_tiles(monkeypatch):
    """Flex compiles its backward kernel on first use: a shared-memory overflow there (forward
    fine) recomputes with the next smaller tiles, kept for the problem; gradients still right."""
    q, k, v = (torch.randn(1, 6, 7, 2, 16, requires_grad=True) for _ in range(3))
    original = run._gradients
    failures = []

    def overflow_once(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise RuntimeError("No valid triton configs. OutOfMemoryError: out of resource: Required: 9 Hardware limit: 8")
        return original(*args, **kwargs)

    monkeypatch.setattr(run, "_gradients", overflow_once)
    out = haloattn.attention(q, k, v, 3, score_mod=oracle_free_mod, backend="flex")
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert failures and run.plan_for(build_problem(q, k, v, 3, score_mod=oracle_free_mod)).kernel_options is run.SMALLER_TILES[0]
    ref = haloattn.attention(q, k, v, 3, score_mod=oracle_free_mod, backend="reference")
    for a, b in zip(grads, torch.autograd.grad(ref.sum(), (q, k, v))):
        assert oracle.rel_error(a, b) <= 1e-5


MULTI_TILE = [
    ((20, 37), (5, 7), dict(dilation=(2, 1), causal=(False, True)), 0),
    ((5, 9, 13), (3, 5, 3), dict(stride=(1, 2, 1)), 3),
    ((700,), 33, dict(stride=3, causal=True), 130),
    ((24, 30), (6, 6), dict(pattern="window", shift=(3, 2)), 0),
]


@pytest.mark.usefixtures("unfused_flex")
@pytest.mark.parametrize("with_mask_mod", [False, True], ids=["pattern-only", "mask_mod"])
@pytest.mark.parametrize("spatial, window, options, extra", MULTI_TILE)
def test_multi_tile_problems_match_the_reference(spatial, window, options, extra, with_mask_mod):
    """Grids of several 128-token tiles with padded edges and (130) additional tokens over two key
    blocks, with and without a user mask_mod: outputs, LSE and gradients against the reference
    backend in float64 (itself checked against the oracle). Unfused Flex evaluates the mask on
    every pair, so which blocks are listed full is checked by test_block_classes_are_exact (and
    by the compiled kernels in tests/test_flex_gpu.py)."""
    torch.manual_seed(len(spatial) + extra)
    B, H, Hkv, D, Dv = 2, 4, 2, 16, _flex_dim(24)
    wins = window if isinstance(window, tuple) else (window,)
    base = dict(query=torch.randn(B, *spatial, H, D, dtype=torch.float64),
                key=torch.randn(B, *spatial, Hkv, D, dtype=torch.float64),
                value=torch.randn(B, *spatial, Hkv, Dv, dtype=torch.float64),
                rpb=torch.randn(H, *(2 * w - 1 for w in wins), dtype=torch.float64))
    if extra:
        base["additional_keys"] = torch.randn(B, extra, Hkv, D, dtype=torch.float64)
        base["additional_values"] = torch.randn(B, extra, Hkv, Dv, dtype=torch.float64)
    kw = dict(options, softcap=6.0, score_mod=oracle_free_mod, mask_mod=mask_every_fifth if with_mask_mod else None)
    results = {}
    for backend, dtype in (("flex", torch.float32), ("reference", torch.float64)):
        leaves = {n: t.to(dtype).requires_grad_() for n, t in base.items()}
        named = dict(leaves)
        q, k, v = named.pop("query"), named.pop("key"), named.pop("value")
        out, lse = haloattn.attention(q, k, v, window, backend=backend, return_lse=True, **named, **kw)
        loss = (out.double() * torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view(out.shape)).sum()
        grads = torch.autograd.grad(loss + 0.25 * lse.double().sum(), list(leaves.values()))
        results[backend] = (out, lse, grads)
    (out, lse, grads), (ref_out, ref_lse, ref_grads) = results["flex"], results["reference"]
    assert oracle.rel_error(out, ref_out) <= 1e-5
    assert (lse.double() - ref_lse).abs().max().item() <= 1e-4
    for name, a, b in zip(base, grads, ref_grads):
        assert oracle.rel_error(a, b) <= (1e-3 if name == "rpb" else 1e-5), name


def mask_every_fifth(b, h, q_idx, kv_idx):
    return ((q_idx * 7 + kv_idx + h) % 5) != 0
