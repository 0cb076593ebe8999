"""Upper bounds on the neighbourhood benchmark's efficiency that follow from the problem alone,
without a GPU: what any box-tiled kernel must compute, and what any kernel must move.

Efficiency (benchmarks/RESULTS.md) = effective TFLOP/s over attended pairs / dense cuDNN TFLOP/s.
Two ceilings bound it:

* work: a kernel whose query tiles are boxes computes, per query tile, the union of its queries'
  neighbourhoods rounded up to whole key tiles. ``pairs computed / pairs attended`` for the
  backend's default tiles (and the best 64- or 128-query box) divides whatever fraction of
  cuDNN's rate the inner loop reaches;
* memory: q, k, v read once and out written once (bf16), at the device's copy bandwidth. When
  that time exceeds the attended FLOPs at cuDNN's rate, efficiency cannot exceed their ratio.

It also reports the share of a query tile's key-tile steps that need no per-score mask, with key
tiles aligned to the key box (as the triton kernel walked them until 2026-11-25) and anchored at
the tile's common window (as the cuda Hopper kernel did until 2026-11-27), for the same number of
tiles or one more per axis. Both backends now anchor only where that adds no step
(``tiles.walk_start``; cuda's ``key_tiles.cuh``), so on the 2-D problems they get the anchored
share.

    python benchmarks/efficiency_bounds.py [--dense-tflops 630] [--bandwidth-tbs 3.0]
    python benchmarks/efficiency_bounds.py --measured runs/2026-11-29_h200_neighborhood_flex_0539.json
    python benchmarks/efficiency_bounds.py --forward-backward
    python benchmarks/efficiency_bounds.py --gluon

``--forward-backward`` bounds the forward + backward efficiency of a Triton kernel on the
backend's default tiles: each kernel's computed pairs (forward, dQ, dK/dV) at the best rate
Triton reached on dense attention in bench_triton_ceiling.py (TRITON_CEILING), against cuDNN's
dense forward + backward.

``--gluon`` gives the pairs the Gluon forward computes per attended pair on each of its tilings
(both consumers on the box's whole walk; the split walk on 128- and 64-key tiles), dilated rows
on their regrouping (gluon_regroup.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_neighborhood import BATCH, HEADS, PROBLEMS, attended_pairs  # noqa: E402

import torch  # noqa: E402

from haloattn.backends.triton import tiles  # noqa: E402
from haloattn.geometry import key_range  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402


def computed_pairs(problem, q_tile, kv_tile) -> int:
    """Pairs a box-tiled forward computes: per axis and dilation group, key tiles visited per query
    tile; the pattern is an AND over axes, so the counts multiply."""
    total = 1
    for axis, tq, tk in zip(problem.axes, q_tile, kv_tile):
        per_axis = 0
        for group in range(axis.dilation):
            length = axis.group_length(group)
            for start in range(0, length, tq):
                last = min(start + tq, length) - 1
                lo = key_range(axis, problem.pattern, start * axis.dilation + group)[1]
                hi = key_range(axis, problem.pattern, last * axis.dilation + group)[2]
                per_axis += min(tq, length - start) * (-(-(hi - lo) // tk) * tk)
        total *= per_axis
    return total * problem.batch


def unmasked_share(problem, q_tile, kv_tile, anchored: bool) -> float:
    """Share of the (query tile, key tile) steps a box-tiled forward visits whose key tile lies
    inside every query's window of the tile (the steps that need no per-score mask). Key tiles
    start at the union box's low end (``anchored=False``, the triton kernel's former walk) or are shifted so
    that one starts where the tile's common window does (``anchored=True``, the cuda Hopper
    kernel's key_tiles.cuh before 2026-11-27), covering the same box. Per axis and query tile the counts are
    independent, so the shares multiply over axes."""
    share = 1.0
    for axis, tq, tk in zip(problem.axes, q_tile, kv_tile):
        visited = inside = 0
        for group in range(axis.dilation):
            length = axis.group_length(group)
            for start in range(0, length, tq):
                last = min(start + tq, length) - 1
                _, lo, common_hi = key_range(axis, problem.pattern, start * axis.dilation + group)
                _, common_lo, hi = key_range(axis, problem.pattern, last * axis.dilation + group)
                first = lo
                if anchored and common_hi > common_lo:
                    first = common_lo - -(-(common_lo - lo) // tk) * tk
                steps = -(-(hi - first) // tk)
                visited += steps
                inside += tiles.tiles_inside(first, steps, tk, common_lo, common_hi)
        share *= inside / visited
    return share


# Head dim -> (forward, backward) rate of the best Triton loop as a fraction of cuDNN's, and cuDNN's
# dense (forward, backward) TFLOP/s, the backward counted at 2.5x the forward's work; H100, bf16,
# B=1, L=16384, H=16, bench_triton_ceiling.py. Forward: 05:43 UTC 2026-12-05, on the tiles these
# problems take (64 x 64, 4 warps, 3 stages: 0.80 at D=128, 0.87 at D=64); backward: 18:41 UTC,
# the `triton` backend's own dense backward, which beat every plain two-kernel config (0.72 /
# 0.77 against 0.68 / 0.72). runs/2026-12-05_h100_{0543,0544,1841}_triton_ceiling_*.
TRITON_CEILING = {128: ((0.80, 0.72), (612.0, 557.0)), 64: ((0.87, 0.77), (462.0, 466.0))}
# Matrix products a pair of each backward kernel: dQ recomputes S and dP and forms dQ; dK/dV
# recomputes S and dP and forms dK and dV.
DQ_PRODUCTS, DKDV_PRODUCTS = 3, 4


def key_major_pairs(problem, kv_tile, q_tile) -> int:
    """Pairs the dK/dV kernel computes: resident key tiles walking query tiles by the inverse rule
    (tiles._axis_query_steps, group 0 of each axis, times the dilation)."""
    total = problem.batch
    for axis, tk, tq in zip(problem.axes, kv_tile, q_tile):
        visited, _ = tiles._axis_query_steps(axis, problem.pattern, tk, tq, tiles.ANCHOR_TILES)
        total *= visited * axis.dilation * tk * tq
    return total


def forward_backward_bound(problem, head_dim):
    """(forward, dQ, dK/dV) computed per attended pair on the default tiles, and the forward +
    backward efficiency a Triton kernel at TRITON_CEILING's rates would reach on them."""
    (r_fwd, r_bwd), (c_fwd, c_bwd) = TRITON_CEILING[head_dim]
    config = tiles.default_config(problem)
    attended = attended_pairs(problem)
    waste_fwd = computed_pairs(problem, config["fwd"]["q"], config["fwd"]["kv"]) / attended
    waste_dq = computed_pairs(problem, config["dq"]["q"], config["dq"]["kv"]) / attended
    waste_dkdv = key_major_pairs(problem, config["dkdv"]["kv"], config["dkdv"]["q"]) / attended
    waste_bwd = (DQ_PRODUCTS * waste_dq + DKDV_PRODUCTS * waste_dkdv) / (DQ_PRODUCTS + DKDV_PRODUCTS)
    # time per attended pair, in units of one forward pair's work: cuDNN's against the kernel's
    dense = 1 / c_fwd + 2.5 / c_bwd
    kernel = waste_fwd / (r_fwd * c_fwd) + 2.5 * waste_bwd / (r_bwd * c_bwd)
    return waste_fwd, waste_dq, waste_dkdv, dense / kernel


def forward_backward_table() -> None:
    print("| problem | computed / attended: forward, dQ, dK/dV | forward bound | forward + backward bound |")
    print("|---|---|---|---|")
    for name, spatial, window, options, D in PROBLEMS:
        if D not in TRITON_CEILING:
            continue
        q = torch.empty(BATCH, *spatial, HEADS, D, dtype=torch.bfloat16, device="meta")
        problem = build_problem(q, q, q, window, **options)
        waste_fwd, waste_dq, waste_dkdv, bound = forward_backward_bound(problem, D)
        forward = TRITON_CEILING[D][0][0] / waste_fwd
        print(f"| {name} | {waste_fwd:.2f}, {waste_dq:.2f}, {waste_dkdv:.2f} | {forward:.2f} | {bound:.2f} |")


def best_box(problem):
    """The 64- or 128-query box (with key tiles of 64 tokens) that computes the fewest pairs."""
    best = None
    for tokens in (64, 128):
        for q in tiles._shapes(problem, tokens):
            for kv in tiles._shapes(problem, 64):
                pairs = computed_pairs(problem, q, kv)
                if best is None or pairs < best[0]:
                    best = (pairs, q, kv)
    return best


def measured_rates(path: str) -> None:
    """From a ``bench_neighborhood.py --json`` file: per problem, the forward's efficiency (do_bench
    / CUDA graph), the default tiles' computed pairs per attended pair, their product (the kernel's
    rate on the pairs it computes, as a fraction of cuDNN's dense rate) and the ceiling those tiles
    leave a kernel running at cuDNN's own rate (1 / computed per attended). Blocked problems timed
    beside dense SDPA over their windows also get the rate against that."""
    with open(path) as f:
        rows = {r["problem"]: r for r in json.load(f)["rows"]}
    print("| problem | forward efficiency (do_bench / graph) | computed / attended | rate on computed pairs / cuDNN's "
          "| ceiling at cuDNN's rate with these tiles | against dense SDPA over the windows |")
    print("|---|---|---|---|---|---|")
    for name, spatial, window, options, D in PROBLEMS:
        row = rows.get(name)
        if row is None or "fwd_efficiency" not in row:
            continue
        q = torch.empty(BATCH, *spatial, HEADS, D, dtype=torch.bfloat16, device="meta")
        problem = build_problem(q, q, q, window, **options)
        fwd = tiles.default_config(problem)["fwd"]
        waste = computed_pairs(problem, fwd["q"], fwd["kv"]) / attended_pairs(problem)
        eff = (row["fwd_efficiency"], row.get("fwd_graph_efficiency", float("nan")))
        windows = [row.get(f"windows_{n}_fwd_graph_tflops") for n in ("cudnn", "flash")]
        best = max((w for w in windows if w), default=None)
        against = f"{row['triton_fwd_graph_tflops'] / best:.2f}" if best else "-"
        print(f"| {name} | {eff[0]:.2f} / {eff[1]:.2f} | {waste:.2f} | {eff[0] * waste:.2f} / {eff[1] * waste:.2f} "
              f"| {1 / waste:.2f} | {against} |")


def gluon_tilings_table() -> None:
    """Per problem of 128 channels: the Gluon forward's tiling (query box, key box, cut axis) and
    its computed / attended pairs, on the whole walk and on the split walk with 128- and 64-key
    tiles (bench_gluon_split_walk.py's TILINGS, as the cost model picks them)."""
    from bench_gluon_split_walk import TILINGS, computed_pairs as gluon_pairs

    saved = tiles.gluon_forward_tiling()
    labels = [label for label in TILINGS if not label.endswith("3")]  # (ring depth: same pairs)
    print("| problem | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for name, spatial, window, options, D in PROBLEMS:
        if D != tiles.GLUON_FORWARD_HEAD_DIM:
            continue
        q = torch.empty(BATCH, *spatial, HEADS, D, dtype=torch.bfloat16, device="meta")
        problem = build_problem(q, q, q, window, **options)
        cells = []
        for label in labels:
            tiles.use_gluon_tiling(label)
            tiling = tiles.gluon_forward_boxes(problem)
            ratio = gluon_pairs(problem, tiling) / (attended_pairs(problem) * HEADS)
            cells.append(f"{list(tiling.q)} / {list(tiling.kv)} cut {tiling.split}: {ratio:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    tiles.set_gluon_forward_tiling(*saved)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dense-tflops", type=float, default=630.0, help="dense cuDNN forward rate (H100: 610-680)")
    parser.add_argument("--bandwidth-tbs", type=float, default=3.0, help="device copy bandwidth (H100 HBM3: ~3.0)")
    parser.add_argument("--measured", metavar="JSON", help="a bench_neighborhood.py --json file: the kernel's rate on "
                                                           "the pairs it computes, per problem")
    parser.add_argument("--forward-backward", action="store_true",
                        help="the forward + backward bound of a Triton kernel on the default tiles")
    parser.add_argument("--gluon", action="store_true",
                        help="pairs the Gluon forward computes per attended pair on each of its tilings")
    args = parser.parse_args()
    if args.forward_backward:
        forward_backward_table()
        return
    if args.gluon:
        gluon_tilings_table()
        return
    if args.measured:
        measured_rates(args.measured)
        return
    print("| problem | default tiles | computed / attended | best box | computed / attended | memory-bound ceiling "
          "| unmasked steps, box-aligned / anchored key tiles |")
    print("|---|---|---|---|---|---|---|")
    for name, spatial, window, options, D in PROBLEMS:
        q = torch.empty(BATCH, *spatial, HEADS, D, dtype=torch.bfloat16, device="meta")
        problem = build_problem(q, q, q, window, **options)
        attended = attended_pairs(problem)
        fwd = tiles.default_config(problem)["fwd"]
        waste = computed_pairs(problem, fwd["q"], fwd["kv"]) / attended
        best_pairs, best_q, best_kv = best_box(problem)
        flops_s = 4 * BATCH * HEADS * D * attended / (args.dense_tflops * 1e12)
        bytes_s = 4 * BATCH * HEADS * D * problem.tokens * 2 / (args.bandwidth_tbs * 1e12)
        memory = min(1.0, flops_s / bytes_s)
        aligned = unmasked_share(problem, fwd["q"], fwd["kv"], anchored=False)
        anchored = unmasked_share(problem, fwd["q"], fwd["kv"], anchored=True)
        print(f"| {name} | {fwd['q']} / {fwd['kv']} | {waste:.2f} | {best_q} / {best_kv} | "
              f"{best_pairs / attended:.2f} | {memory:.2f} | {aligned:.2f} / {anchored:.2f} |")


if __name__ == "__main__":
    main()
