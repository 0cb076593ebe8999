"""Steps that mask_mod empties are skipped, and steps it keeps whole are walked without it
(backends/triton/live_steps.py), in Triton's interpreter.

Two oracles: the lists of live steps, each with its full flag, against a brute-force walk in
Python (the pattern from haloattn.geometry.attends, mask_mod on every pair of every step; exact),
and whole problems
(output, LSE, every gradient) against the float64 oracle with tiles small enough that the masks
below leave many steps without a pair."""

import itertools
import math

import pytest
import torch

pytest.importorskip("triton")

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import launch, tiles  # noqa: E402
from haloattn.backends.triton.live_steps import live_steps  # noqa: E402
from haloattn.geometry import attends, neighborhood_range, query_range, window_query_range, window_range  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

import oracle  # noqa: E402


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _segments(length, pieces, seed):
    """Ids of ``pieces`` consecutive runs of random lengths covering ``length`` tokens."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(length - 1, generator=g)[:pieces - 1].sort().values + 1
    ids = torch.zeros(length, dtype=torch.int64)
    ids[cuts] = 1
    return ids.cumsum(0)


def documents(length, pieces=5, seed=0):
    """Packed documents: a token sees only its own document's tokens (reads neither b nor h)."""
    doc = _segments(length, pieces, seed)
    return lambda b, h, q, kv: doc[q] == doc[kv]


def batch_documents(batch, length, pieces=4, seed=1):
    """Each batch entry packs its own documents (reads b)."""
    doc = torch.stack([_segments(length, pieces, seed + i) for i in range(batch)])
    return lambda b, h, q, kv: doc[b, q] == doc[b, kv]


def head_documents(length, pieces=4, seed=2):
    """Documents, and each head sees every other key of them (reads h)."""
    doc = _segments(length, pieces, seed)
    return lambda b, h, q, kv: (doc[q] == doc[kv]) & ((kv + h) % 2 == 0)


def bands(width, rows):
    """2-D: a token sees the tokens of its band of ``rows`` image rows."""
    return lambda b, h, q, kv: (q // width) // rows == (kv // width) // rows


def clips(frame_tokens, frames):
    """3-D video: a token sees the tokens of its clip of ``frames`` frames."""
    return lambda b, h, q, kv: (q // frame_tokens) // frames == (kv // frame_tokens) // frames


# --- the lists against a brute-force walk ------------------------------------------------------


def _axis_walk(axis, pattern, group, first, resident, streamed, anchor, key_major):
    """(start, steps) of one axis' walk for the resident tile [first, first + resident) of a
    dilation group: the host's statement of index_math.key_walk / query_walk."""
    group_len = axis.group_length(group)
    if key_major:
        rule = window_query_range if pattern == "window" else query_range
    else:
        rule = window_range if pattern == "window" else neighborhood_range
    last = min(first + resident, group_len) - 1
    lo, common_hi = (int(v) for v in rule(axis, first, group_len))
    common_lo, hi = (int(v) for v in rule(axis, last, group_len))
    start = tiles.walk_start(lo, hi, common_lo, common_hi, streamed, anchor)
    return start, -(-(hi - start) // streamed)


def expected_lists(problem, cfg, key_major, batches, heads_of):
    """Per (batch, list head, resident tile): the live steps' list entries (2 * step + full), by
    brute force."""
    axes, spatial = problem.axes, problem.spatial
    resident, streamed = (cfg["kv"], cfg["q"]) if key_major else (cfg["q"], cfg["kv"])
    per_axis_tiles = [-(-a.group_length(0) // t) for a, t in zip(axes, resident)]
    lists = {}
    for b, (list_head, heads) in itertools.product(range(batches), heads_of.items()):
        # Resident tiles in the kernels' order: per axis (group, tile), row-major over the axes.
        for tile_id, coords in enumerate(itertools.product(*(range(a.dilation * n) for a, n in zip(axes, per_axis_tiles)))):
            groups = [c // n for c, n in zip(coords, per_axis_tiles)]
            firsts = [(c % n) * t for c, n, t in zip(coords, per_axis_tiles, resident)]
            walks = [_axis_walk(a, problem.pattern, g, f, r, s, cfg["anchor"], key_major)
                     for a, g, f, r, s in zip(axes, groups, firsts, resident, streamed)]
            live = []
            for step, js in enumerate(itertools.product(*(range(n) for _, n in walks))):
                res = [range(f, f + r) for f, r in zip(firsts, resident)]
                stm = [range(start + j * s, start + (j + 1) * s) for (start, _), j, s in zip(walks, js, streamed)]
                queries, keys = (stm, res) if key_major else (res, stm)
                kept = _kept_pairs(problem, groups, queries, keys, b, heads)
                if any(any(k) for k in kept):
                    live.append(2 * step + all(all(k) for k in kept))
            lists[b, list_head, tile_id] = live
    return lists


def _tokens(axes, groups, coordinate_ranges):
    """Grid coordinates of the tokens of a box of group coordinates (inside the grid only)."""
    per_axis = [[g + a.dilation * x for x in xs if 0 <= x < a.group_length(g)]
                for a, g, xs in zip(axes, groups, coordinate_ranges)]
    return list(itertools.product(*per_axis))


def _kept_pairs(problem, groups, queries, keys, b, heads):
    """Per pair of the step that the pattern admits: whether mask_mod keeps it, for each head."""
    axes = problem.axes
    kept = []
    for i in _tokens(axes, groups, queries):
        for j in _tokens(axes, groups, keys):
            if all(attends(a, problem.pattern, x, y) for a, x, y in zip(axes, i, j)):
                qf, kf = (torch.tensor(_flat(t, problem.spatial)) for t in (i, j))
                kept.append([bool(problem.mask_mod(torch.tensor(b), torch.tensor(h), qf, kf)) for h in heads])
    return kept


def _flat(coords, spatial):
    flat = 0
    for c, n in zip(coords, spatial):
        flat = flat * n + c
    return flat


LIST_CASES = [
    # (spatial, window, options, q tile, kv tile, mask maker)
    ((40,), (13,), {}, [8], [8], lambda: documents(40, 5, 0)),
    ((40,), (9,), dict(dilation=2), [4], [8], lambda: documents(40, 4, 3)),
    ((36,), (11,), dict(causal=True, stride=2), [8], [4], lambda: documents(36, 4, 4)),
    ((40,), (8,), dict(pattern="window", shift=3), [8], [4], lambda: documents(40, 6, 5)),
    ((12, 10), (5, 7), {}, [4, 4], [2, 4], lambda: bands(10, 3)),
    ((4, 6, 6), (3, 3, 5), dict(causal=(True, False, False)), [2, 2, 2], [1, 2, 4], lambda: clips(36, 2)),
]


@pytest.mark.parametrize("case", range(len(LIST_CASES)))
@pytest.mark.parametrize("key_major", [False, True])
def test_lists_match_a_brute_force_walk(case, key_major):
    spatial, window, options, q_tile, kv_tile, make_mask = LIST_CASES[case]
    q = torch.randn(1, *spatial, 2, 16)
    problem = build_problem(q, q, q, window, mask_mod=make_mask(), **options)
    cfg = dict(q=q_tile, kv=kv_tile, anchor=True)
    mods = launch.fused_mods(problem)
    live = live_steps(problem, mods, launch.geometry(problem), cfg, key_major, False,
                      launch._tile_constexprs(cfg["q"], cfg["kv"], problem.rank), q.device)
    lists = live.compute(launch.mod_tensors(mods, q))
    assert live.strides[:2] == (0, 0)  # reads neither b nor h: one list serves all
    expected = expected_lists(problem, cfg, key_major, 1, {0: [0]})
    skipped = 0
    kinds = set()  # full (1) and cut (0) steps met
    for (_, _, tile_id), steps in expected.items():
        row = lists[0, 0, tile_id]
        assert row[0].item() == len(steps), (tile_id, row, steps)
        assert row[1:1 + len(steps)].tolist() == steps, (tile_id, row, steps)
        skipped += lists.shape[-1] - 1 - len(steps)
        kinds |= {entry % 2 for entry in steps}
    assert skipped > 0, "the mask should have emptied some steps"
    # Documents cross some steps and fill others; image bands of 3 rows cross every live step of
    # these tiles; clips of 2 frames never cross a 2-frame query tile walking 1-frame key tiles,
    # while key-major walks of 2-frame query tiles (anchored) straddle clips.
    expected_kinds = {4: {0}, 5: {0, 1} if key_major else {1}}.get(case, {0, 1})
    assert kinds == expected_kinds, kinds


@pytest.mark.parametrize("key_major", [False, True])
def test_lists_per_batch_entry_and_head(key_major):
    """A mask that reads b gets a list per batch entry; one that reads h a list per head, or
    key-major per kv head with the steps live for any of its G query heads."""
    batch, heads, kv_heads, length = 2, 4, 2, 32
    q = torch.randn(batch, length, heads, 16)
    kv = torch.randn(batch, length, kv_heads, 16)
    cfg = dict(q=[8], kv=[8], anchor=True)
    for mask, per_batch in ((batch_documents(batch, length), True), (head_documents(length), False)):
        problem = build_problem(q, kv, kv, (11,), mask_mod=mask)
        mods = launch.fused_mods(problem)
        live = live_steps(problem, mods, launch.geometry(problem), cfg, key_major, False,
                      launch._tile_constexprs(cfg["q"], cfg["kv"], problem.rank), q.device)
        lists = live.compute(launch.mod_tensors(mods, q))
        if per_batch:
            heads_of = {0: [0]}
        elif key_major:
            heads_of = {g: [g * 2, g * 2 + 1] for g in range(kv_heads)}
        else:
            heads_of = {h: [h] for h in range(heads)}
        expected = expected_lists(problem, cfg, key_major, batch if per_batch else 1, heads_of)
        for (b, head, tile_id), steps in expected.items():
            row = lists[b, head, tile_id]
            assert row[0].item() == len(steps) and row[1:1 + len(steps)].tolist() == steps, (b, head, tile_id)


# --- whole problems against the float64 oracle --------------------------------------------------

PROBLEM_CASES = [
    # (spatial, window, options, q tile, kv tile, mask maker, heads, kv heads)
    ((48,), (17,), {}, [8], [8], lambda: documents(48, 5, 7), 2, 2),
    ((48,), (17,), dict(causal=True), [8], [16], lambda: batch_documents(2, 48, 4, 8), 2, 1),
    ((40,), (11,), dict(dilation=2, rpb=True), [4], [8], lambda: head_documents(40, 4, 9), 4, 2),
    ((10, 12), (5, 5), dict(extra=3), [4, 4], [4, 4], lambda: bands(12, 3), 2, 2),
    ((4, 6, 6), (3, 3, 3), dict(causal=(True, False, False)), [2, 2, 2], [2, 2, 2], lambda: clips(36, 2), 2, 1),
]


@pytest.mark.parametrize("case", range(len(PROBLEM_CASES)))
def test_problems_with_skipped_steps_match_the_oracle(case):
    spatial, window, options, q_tile, kv_tile, make_mask, heads, kv_heads = PROBLEM_CASES[case]
    options = dict(options)
    torch.manual_seed(100 + case)
    batch, dim = 2, 16
    leaves = [torch.randn(batch, *spatial, heads, dim, dtype=torch.float64),
              torch.randn(batch, *spatial, kv_heads, dim, dtype=torch.float64),
              torch.randn(batch, *spatial, kv_heads, dim, dtype=torch.float64)]
    names = []
    if options.pop("rpb", False):
        leaves.append(torch.randn(heads, *(2 * w - 1 for w in window), dtype=torch.float64) * 0.5)
        names.append("rpb")
    extra = options.pop("extra", 0)
    if extra:
        leaves += [torch.randn(batch, extra, kv_heads, dim, dtype=torch.float64) for _ in range(2)]
        names += ["additional_keys", "additional_values"]
    mask = make_mask()
    grad_out = torch.randn(batch, *spatial, heads, dim, dtype=torch.float64)

    ours = [t.float() for t in leaves]
    named = dict(zip(names, ours[3:]))
    problem = build_problem(*ours[:3], window, mask_mod=mask, return_lse=True, **named, **options)
    inputs = AttentionInputs(*ours[:3], rpb=named.get("rpb"), additional_keys=named.get("additional_keys"),
                             additional_values=named.get("additional_values"))
    config = {part: dict(cfg, q=q_tile, kv=kv_tile) for part, cfg in tiles.default_config(problem).items()}
    out, lse = launch.forward(problem, inputs, config)
    needs = (True, True, True, "rpb" in names, False, bool(extra), bool(extra))
    grads = launch.backward(problem, inputs, out, lse, grad_out.float(), None, needs, config)

    theirs = [t.clone().requires_grad_(True) for t in leaves]
    ref_out, ref_lse = oracle.attention(*theirs[:3], window, mask_mod=mask, **dict(zip(names, theirs[3:])), **options)
    (ref_out * grad_out).sum().backward()
    assert oracle.rel_error(out, ref_out) < 1e-5
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse.double() - ref_lse)[finite].abs().max() < 1e-4
    mine = [g for g in grads if g is not None]
    references = [theirs[i].grad for i in range(3)] + [t.grad for t in theirs[3:]]
    assert len(mine) == len(references)
    for g, ref in zip(mine, references):
        assert oracle.rel_error(g, ref) < 1e-5


def test_the_kernels_walk_the_lists(monkeypatch):
    """Emptied lists leave the forward nothing to walk (every row 0, LSE -inf), and the backward
    no gradient: the kernels take their steps from the lists, not from their own walk."""
    from haloattn.backends.triton import live_steps as module

    compute = module.LiveSteps.compute
    monkeypatch.setattr(module.LiveSteps, "compute", lambda self, tensors: compute(self, tensors).fill_(0))
    q, k, v = (torch.randn(1, 32, 2, 16) for _ in range(3))
    problem = build_problem(q, k, v, (9,), mask_mod=documents(32, 3, 11), return_lse=True)
    inputs = AttentionInputs(q, k, v)
    out, lse = launch.forward(problem, inputs)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    grads = launch.backward(problem, inputs, out, lse, torch.randn_like(out), None, (True,) * 3 + (False,) * 4)
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads[:3])


def test_the_kernels_skip_mask_mod_on_full_steps(monkeypatch):
    """Lists whose every step is flagged full make the kernels ignore mask_mod: with a mask that
    empties no step (a checkerboard) but refuses half the pairs, output and gradients then equal
    the oracle's without the mask. So the flag is read, and where it is set the mask is not run."""
    from haloattn.backends.triton import live_steps as module

    compute = module.LiveSteps.compute

    def flagged_full(self, tensors):
        lists = compute(self, tensors)
        lists[..., 1:] |= 1
        return lists

    monkeypatch.setattr(module.LiveSteps, "compute", flagged_full)
    torch.manual_seed(5)
    leaves = [torch.randn(1, 6, 7, 2, 16, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    grad_out = torch.randn(1, 6, 7, 2, 16, dtype=torch.float64)
    ours = [t.detach().float() for t in leaves]
    checkerboard = lambda b, h, q, kv: (q + kv) % 2 == 0  # noqa: E731
    problem = build_problem(*ours, (3, 5), mask_mod=checkerboard, return_lse=True)
    config = {part: dict(cfg, q=[2, 4], kv=[2, 4]) for part, cfg in tiles.default_config(problem).items()}
    inputs = AttentionInputs(*ours)
    out, lse = launch.forward(problem, inputs, config)
    grads = launch.backward(problem, inputs, out, lse, grad_out.float(), None, (True,) * 3 + (False,) * 4, config)
    ref_out, _ = oracle.attention(*leaves, (3, 5))
    (ref_out * grad_out).sum().backward()
    assert oracle.rel_error(out, ref_out) < 1e-5
    for g, leaf in zip(grads[:3], leaves):
        assert oracle.rel_error(g, leaf.grad) < 1e-5
