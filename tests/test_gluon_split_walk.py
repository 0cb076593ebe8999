"""The Gluon forward's split walk (backends/triton/gluon_split_walk.py) on CPU: its device functions
run in Triton's interpreter for every query box of random problems (each rank, both patterns,
strides, shifts, causal axes; 64- and 128-key tiles; every cut axis), and the stream they give
the producer and each consumer is checked against ``haloattn.geometry``'s key ranges:

* no tile of the box's walk is streamed twice, and every streamed tile lies in the walk;
* every key tile that holds a key some query of a half attends is computed by that half;
* the exclusive tiles come first, the halves' own tiles alternating while both have some;
* tiles.py's cost model counts the same tile rows on the cut axis (``_axis_split_steps``).

The Gluon kernel itself, which calls these functions, runs on the GPU against the float64 oracle
(test_gluon_forward_gpu.py)."""

import itertools
import math
import random

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from haloattn.backends.triton import interpreter_compat, tiles  # noqa: E402
from haloattn.backends.triton.gluon_split_walk import (exclusive_coords, exclusive_tile, split_stream,  # noqa: E402
                                                       stream_coords)
from haloattn.backends.triton.index_math import key_walk, split3  # noqa: E402
from haloattn.backends.triton.launch import _pad3  # noqa: E402
from haloattn.geometry import key_range  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

MAX_STREAM = 512
OWNER_SHARED = 2


@triton.jit
def _store7(row, a, b, c, d, e, f, g):
    """Seven values into consecutive slots of ``row``."""
    tl.store(row, a)
    tl.store(row + 1, b)
    tl.store(row + 2, c)
    tl.store(row + 3, d)
    tl.store(row + 4, e)
    tl.store(row + 5, f)
    tl.store(row + 6, g)


@triton.jit
def _stream_kernel(out, walks, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, NT1, NT2, C0: tl.constexpr,
                   C1: tl.constexpr, C2: tl.constexpr, WINDOW: tl.constexpr, TQ0: tl.constexpr, TQ1: tl.constexpr,
                   TQ2: tl.constexpr, TK0: tl.constexpr, TK1: tl.constexpr, TK2: tl.constexpr, SPLIT: tl.constexpr,
                   SPLIT_CAUSAL: tl.constexpr, SPLIT_WALK: tl.constexpr, MAX: tl.constexpr):
    """Per query box (program): its walk (start, steps per axis) into ``walks``, and its stream
    into ``out``: per position the producer's (j0, j1, j2), the owner (0, 1; 2 for shared) and,
    for exclusive tiles, the owner consumer's own (j0, j1, j2) from its exclusive index."""
    box = tl.program_id(0)
    t0, t1, t2 = split3(box, NT1, NT2)
    xs0, xs1, xs2 = t0 * TQ0, t1 * TQ1, t2 * TQ2
    st0, n0, _, _ = key_walk(xs0, L0, K0, S0, F0, C0, WINDOW, TQ0, TK0, True)
    st1, n1, _, _ = key_walk(xs1, L1, K1, S1, F1, C1, WINDOW, TQ1, TK1, True)
    st2, n2, _, _ = key_walk(xs2, L2, K2, S2, F2, C2, WINDOW, TQ2, TK2, True)
    E: tl.constexpr = (TQ0 if SPLIT == 0 else (TQ1 if SPLIT == 1 else TQ2)) // 2
    TN: tl.constexpr = TK0 if SPLIT == 0 else (TK1 if SPLIT == 1 else TK2)
    exclusive0, exclusive1, own0, shared_lo, shared, own1_lo, own1 = split_stream(
        xs0, xs1, xs2, L0, L1, L2, K0, K1, K2, S0, S1, S2, F0, F1, F2, st0, st1, st2, n0, n1, n2, E, TN,
        SPLIT_CAUSAL, WINDOW, SPLIT, SPLIT_WALK)
    across = n0 * n1 * n2 // (n0 if SPLIT == 0 else (n1 if SPLIT == 1 else n2))
    count = exclusive0 + exclusive1 + shared * across
    _store7(walks + box * 7, st0, st1, st2, n0, n1, n2, count)
    for t in range(count):
        j0, j1, j2 = stream_coords(t, exclusive0, exclusive1, own0, shared_lo, shared, own1_lo, own1, n0, n1, n2,
                                   SPLIT)
        owner = 2
        c0, c1, c2 = j0, j1, j2
        if t < exclusive0 + exclusive1:
            owner, index = exclusive_tile(t, exclusive0, exclusive1)
            c0, c1, c2 = exclusive_coords(owner, index, own0, own1_lo, own1, n0, n1, n2, SPLIT)
        _store7(out + (box * MAX + t) * 7, j0, j1, j2, owner, c0, c1, c2)


def _random_case(rng: random.Random):
    """(problem, query box, key box, cut axis) of a random problem of any rank and pattern."""
    rank = rng.choice((1, 2, 3))
    pattern = rng.choice(("neighborhood", "neighborhood", "window"))
    spatial = {1: [rng.randint(100, 600)], 2: [rng.randint(8, 40) for _ in range(2)],
               3: [rng.randint(4, 14) for _ in range(3)]}[rank]
    window = [rng.randint(1 if pattern == "window" else 2, L) for L in spatial]
    options = dict(causal=tuple(rng.random() < 0.3 for _ in spatial))
    if pattern == "window":
        options.update(pattern="window", shift=tuple(rng.randint(0, K - 1) for K in window))
    else:
        options["stride"] = tuple(rng.randint(1, K) for K in window)
    q = torch.empty(1, *spatial, 1, 128, device="meta", dtype=torch.bfloat16)
    problem = build_problem(q, q, q, tuple(window), **options)
    boxes = [b for b in itertools.product(*[[1 << i for i in range(8)]] * rank) if math.prod(b) == 128]
    q_box = rng.choice([b for b in boxes if all(t <= 2 * L for t, L in zip(b, spatial))] or boxes)
    keys = rng.choice((64, 128))
    kv_box = rng.choice([b for b in itertools.product(*[[1 << i for i in range(8)]] * rank) if math.prod(b) == keys])
    split = rng.choice([a for a in range(rank) if q_box[a] >= 2])
    return problem, q_box, kv_box, split


def _stream(problem, q_box, kv_box, split, split_walk=True):
    """Per box: (box origin, walk starts, walk steps, stream rows) from the interpreted kernel."""
    rank = problem.rank
    axes = problem.axes
    lengths = _pad3([a.length for a in axes], 1)
    tq, tk = _pad3(q_box, 1), _pad3(kv_box, 1)
    cut = split + 3 - rank
    nt = [-(-n // t) for n, t in zip(lengths, tq)]
    programs = math.prod(nt)
    out = torch.full((programs, MAX_STREAM, 7), -1, dtype=torch.int32)
    walks = torch.zeros((programs, 7), dtype=torch.int32)
    causal = _pad3([a.causal for a in axes], False)
    interpreter_compat.kernel(_stream_kernel)[(programs, )](
        out, walks, *lengths, *_pad3([a.window for a in axes], 1), *_pad3([a.stride for a in axes], 1),
        *_pad3([a.shift for a in axes], 0), nt[1], nt[2], C0=causal[0], C1=causal[1], C2=causal[2],
        WINDOW=problem.pattern == "window", TQ0=tq[0], TQ1=tq[1], TQ2=tq[2], TK0=tk[0], TK1=tk[1], TK2=tk[2],
        SPLIT=cut, SPLIT_CAUSAL=causal[cut], SPLIT_WALK=split_walk, MAX=MAX_STREAM)
    result = []
    for box in range(programs):
        origin = [t * e for t, e in zip(split3_host(box, nt[1], nt[2]), tq)]
        st, n, count = walks[box, :3].tolist(), walks[box, 3:6].tolist(), int(walks[box, 6])
        assert count <= MAX_STREAM
        result.append((origin, st, n, out[box, :count].tolist()))
    return result, tq, tk, cut, lengths


def split3_host(t, e1, e2):
    return t // (e1 * e2), (t // e2) % e1, t % e2


def _half_key_union(problem, origin, tq, cut, half, lengths):
    """Per kernel axis, the keys [lo, hi) some query of the half sees (None: the half holds no
    query on the grid); ranges are monotone, so the union runs from the first query's low end
    to the last one's high end."""
    rank = problem.rank
    spans = []
    for a in range(3):
        first = origin[a] + (half * tq[a] // 2 if a == cut else 0)
        extent = tq[a] // 2 if a == cut else tq[a]
        last = min(first + extent, lengths[a]) - 1
        if first > last:
            return None
        if a < 3 - rank:
            spans.append((0, 1))
            continue
        axis = problem.axes[a - (3 - rank)]
        spans.append((key_range(axis, problem.pattern, first)[1], key_range(axis, problem.pattern, last)[2]))
    return spans


def _check_box(problem, origin, st, n, rows, tq, tk, cut, lengths):
    streamed = [tuple(r[:3]) for r in rows]
    assert len(set(streamed)) == len(streamed), "a tile streamed twice"
    for j in streamed:
        assert all(0 <= j[a] < n[a] for a in range(3)), (j, n)
    computed = {0: set(), 1: set()}
    for r in rows:
        j, owner, own = tuple(r[:3]), r[3], tuple(r[4:7])
        if owner == OWNER_SHARED:
            computed[0].add(j)
            computed[1].add(j)
        else:
            assert own == j, "the owner's own count and the producer disagree on a tile"
            computed[owner].add(j)
    for half in (0, 1):
        spans = _half_key_union(problem, origin, tq, cut, half, lengths)
        if spans is None:
            continue
        for j in itertools.product(*[range(k) for k in n]):
            tile = [(st[a] + j[a] * tk[a], st[a] + (j[a] + 1) * tk[a]) for a in range(3)]
            needed = all(lo < t_hi and t_lo < hi for (t_lo, t_hi), (lo, hi) in zip(tile, spans))
            if needed:
                assert j in computed[half], f"half {half} needs tile {j} of box {origin}"
    # the exclusive tiles first, alternating while both halves have some
    owners = [r[3] for r in rows]
    exclusive = [o for o in owners if o != OWNER_SHARED]
    assert owners[:len(exclusive)] == exclusive
    both = min(exclusive.count(0), exclusive.count(1))
    assert exclusive[:2 * both] == [0, 1] * both


@pytest.mark.parametrize("seed", range(12))
def test_every_needed_tile_is_computed_by_its_half_once(seed):
    problem, q_box, kv_box, split = _random_case(random.Random(900 + seed))
    boxes, tq, tk, cut, lengths = _stream(problem, q_box, kv_box, split)
    for origin, st, n, rows in boxes:
        _check_box(problem, origin, st, n, rows, tq, tk, cut, lengths)


def test_without_the_split_the_stream_is_the_whole_walk_in_order():
    problem, q_box, kv_box, split = _random_case(random.Random(77))
    boxes, *_ = _stream(problem, q_box, kv_box, split, split_walk=False)
    for _, _, n, rows in boxes:
        assert [tuple(r[:3]) for r in rows] == list(itertools.product(*[range(k) for k in n]))
        assert {r[3] for r in rows} == {OWNER_SHARED}


@pytest.mark.parametrize("seed", range(6))
def test_the_cost_model_counts_the_kernels_rows(seed):
    """tiles._axis_split_steps (host) against the streamed tiles: on a 1-D problem the mean of the
    halves' computed tiles, summed over the boxes, is the visited count the cost model uses."""
    rng = random.Random(300 + seed)
    while True:
        problem, q_box, kv_box, split = _random_case(rng)
        if problem.rank == 1:
            break
    boxes, *_ = _stream(problem, q_box, kv_box, split)
    kernel = 0.0
    for _, _, _, rows in boxes:
        kernel += sum(2 if r[3] == OWNER_SHARED else 1 for r in rows) / 2
    host, _ = tiles._axis_split_steps(problem.axes[0], problem.pattern, q_box[0], kv_box[0], tiles.ANCHOR_TILES)
    assert kernel == pytest.approx(host)


def test_a_wrong_half_range_is_caught():
    """The check above fails when a half's needed rows are cut short (the test can fail)."""
    problem, q_box, kv_box, split = _random_case(random.Random(901))
    boxes, tq, tk, cut, lengths = _stream(problem, q_box, kv_box, split)
    failures = 0
    for origin, st, n, rows in boxes:
        shared = [r for r in rows if r[3] == OWNER_SHARED]
        if not shared:
            continue
        broken = [r for r in rows if r is not shared[-1]]
        try:
            _check_box(problem, origin, st, n, broken, tq, tk, cut, lengths)
        except AssertionError:
            failures += 1
    assert failures > 0
