"""The triton forward under a set of forced tile configs against its default, per problem.

Written for narrow (64-channel) heads: on an H100 (2026-12-05, bench_triton_ceiling.py) a plain
dense Triton forward with 128 x 64 tiles on 8 warps and 3 stages ran dense attention at 0.94 of
cuDNN's rate at 64 channels, where the backend's default for that 1-D problem (128 x 128 tiles,
8 warps, 2 stages) ran 0.72; at 128 channels the two were level (0.80). Which tiles do the
backend's narrow forwards want, on 1-D and on 2-D / 3-D windows?

Per problem and config: the forward's median time (``do_bench``), its speed-up over the default
and its output's relative error against the reference backend in float32 on the GPU. Every
config is the default's forward with the query / key tiles refitted to the given sizes
(``tiles.fit``: the same box shapes the cost model would take), warps, stages and load path.

    python benchmarks/bench_forward_configs.py --set narrow_1d [--only 0,2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_wide_forward_tiles import bf16_problem, time_forward  # noqa: E402

from triton.testing import do_bench  # noqa: E402

from haloattn.backends.triton import launch, tiles  # noqa: E402

# (name, spatial, window, options, heads, kv_heads, head_dim, batch)
SETS = {
    "narrow_1d": [
        ("1-D 16384, window 16384 (dense)", (16384,), 16384, {}, 16, 16, 64, 1),
        ("1-D 32768, window 2047", (32768,), 2047, {}, 16, 16, 64, 1),
        ("1-D 16384, causal window 4096, GQA 32/8", (16384,), 4096, {"causal": True}, 32, 8, 64, 1),
        ("1-D 8192, window 511, B=4", (8192,), 511, {}, 12, 12, 64, 4),
        ("1-D 4096, window 255 dilation 4, B=4", (4096,), 255, {"dilation": 4}, 16, 16, 64, 4),
        ("1-D 8192, causal window 1024, D=32, B=4", (8192,), 1024, {"causal": True}, 16, 16, 32, 4),
    ],
    "narrow_nd": [
        ("2-D 128x128, 31x31, D=64", (128, 128), 31, {}, 16, 16, 64, 1),
        ("2-D 128x128, 63x63, D=64", (128, 128), 63, {}, 16, 16, 64, 1),
        ("2-D 96x96, 21x21 dilation 2, D=64, B=2", (96, 96), 21, {"dilation": 2}, 16, 16, 64, 2),
        ("3-D 16x48x48, 7x15x15, D=64", (16, 48, 48), (7, 15, 15), {}, 16, 16, 64, 1),
        ("2-D 64x64, 17x17, D=64, B=4", (64, 64), 17, {}, 16, 16, 64, 4),
    ],
    # problems whose default tiles.NARROW_128_BLOCK_RULE changed, and two it leaves (added
    # 2026-12-05 after the narrow_1d run)
    "narrow_rule": [
        ("1-D 32768, window 2047, D=64", (32768,), 2047, {}, 16, 16, 64, 1),
        ("1-D 16384, causal window 4096, GQA 32/8, D=64", (16384,), 4096, {"causal": True}, 32, 8, 64, 1),
        ("1-D 8192, causal window 1024, D=32, B=4", (8192,), 1024, {"causal": True}, 16, 16, 32, 4),
        ("1-D 16384, window 16384 (dense), D=64", (16384,), 16384, {}, 16, 16, 64, 1),
        ("1-D 4096, window 1023 dilation 2, D=64, B=4", (4096,), 1023, {"dilation": 2}, 16, 16, 64, 4),
        ("1-D 2048, window 128 stride 128, D=64, B=8", (2048,), 128, {"stride": 128}, 16, 16, 64, 8),
        ("2-D 256x256, 127x127, D=64", (256, 256), 127, {}, 8, 8, 64, 1),
        ("1-D 32768, window 4095, D=16, B=2", (32768,), 4095, {}, 8, 8, 16, 2),
        ("1-D 65536, causal window 8192, GQA 8/1, D=64", (65536,), 8192, {"causal": True}, 8, 1, 64, 1),
        ("2-D 128x128, 31x31, D=64 (unchanged: control)", (128, 128), 31, {}, 16, 16, 64, 1),
    ],
    # Narrow heads' short walks that left the 128 x 128 block with tiles.NARROW_128_KEEP_MAX_STEPS
    # (2026-12-06): "before" is the default with the short-walk threshold of before (4 steps).
    "narrow_short": [
        ("2-D 128x128, 16x16 stride 16, D=64, B=2", (128, 128), 16, {"stride": 16}, 16, 16, 64, 2),
        ("2-D 128x128, 16x16 stride 16, D=32, B=4", (128, 128), 16, {"stride": 16}, 8, 8, 32, 4),
        ("3-D 8x32x32, 4x8x8 stride 4x8x8, D=64, B=2", (8, 32, 32), (4, 8, 8), {"stride": (4, 8, 8)}, 16, 16, 64, 2),
        ("1-D 16384, window 256 stride 256, D=64, B=2", (16384,), 256, {"stride": 256}, 16, 16, 64, 2),
        ("1-D 4096, window 384 stride 128, D=64, B=8", (4096,), 384, {"stride": 128}, 16, 16, 64, 8),
        ("1-D 2048, window 128 stride 128, D=64, B=8 (unchanged: control)", (2048,), 128, {"stride": 128}, 16, 16,
         64, 8),
    ],
    # Narrow heads' walks of one 128 x 128 tile, which keep that block, packed (2026-12-06)
    "narrow_one_tile": [
        ("1-D 2048, window 128 stride 128, D=64, B=8", (2048,), 128, {"stride": 128}, 16, 16, 64, 8),
        ("1-D 8192, window 128 stride 128, D=64, B=2", (8192,), 128, {"stride": 128}, 16, 16, 64, 2),
        ("3-D 32x32x32, 2x8x8 stride 2x8x8, D=64", (32, 32, 32), (2, 8, 8), {"stride": (2, 8, 8)}, 8, 8, 64, 1),
        ("2-D 64x64, 8x16 stride 8x16, D=64, B=4", (64, 64), (8, 16), {"stride": (8, 16)}, 8, 8, 64, 4),
        ("1-D 4096, window 100 stride 100, D=64, B=4", (4096,), 100, {"stride": 100}, 16, 16, 64, 4),
    ],
    # Blocked windows (stride = window) and the overlapping ones under 128-query tiles whose
    # boxes the cost model picks (added 2026-12-06): do twice the queries per key tile, halving
    # the keys' and values' trips from L2, pay where the 64-query forward waits on L2?
    "blocked": [
        ("2-D 128x128, 16x16 stride 16, D=128", (128, 128), 16, {"stride": 16}, 16, 16, 128, 1),
        ("2-D 128x128, 16x16 stride 16, D=64, B=2", (128, 128), 16, {"stride": 16}, 16, 16, 64, 2),
        ("2-D 112x112, 14x14 stride 14, D=64, B=2 (SAM-style)", (112, 112), 14, {"stride": 14}, 12, 12, 64, 2),
        ("3-D 8x32x32, 4x8x8 stride 4x8x8, D=128, B=2", (8, 32, 32), (4, 8, 8), {"stride": (4, 8, 8)}, 8, 8, 128, 2),
        ("1-D 16384, window 256 stride 256, D=128", (16384,), 256, {"stride": 256}, 16, 16, 128, 1),
        ("2-D 128x128, 32x32 stride 32, D=128", (128, 128), 32, {"stride": 32}, 16, 16, 128, 1),
        ("2-D 128x128, 32x32 stride 16, D=128 (issue)", (128, 128), 32, {"stride": 16}, 16, 16, 128, 1),
        ("2-D 128x128, 31x31, D=128 (issue)", (128, 128), 31, {}, 16, 16, 128, 1),
        ("2-D 128x128, 63x63, D=128 (issue)", (128, 128), 63, {}, 16, 16, 128, 1),
        ("3-D 16x48x48, 7x15x15, D=128 (issue)", (16, 48, 48), (7, 15, 15), {}, 16, 16, 128, 1),
    ],
    # the Gluon forward (tiles.gluon_forward_chosen) against the Triton forward, both ways: the
    # issue's 128-channel rows, off-list problems the rule gives it, and ones it leaves (the
    # cost model within 0.77-0.98 of it)
    "gluon": [
        ("2-D 128x128, 31x31 (issue)", (128, 128), 31, {}, 16, 16, 128, 1),
        ("2-D 128x128, 63x63 (issue)", (128, 128), 63, {}, 16, 16, 128, 1),
        ("2-D 128x128, 31x31 causal axis 0 (issue)", (128, 128), 31, {"causal": (True, False)}, 16, 16, 128, 1),
        ("3-D 16x48x48, 7x15x15 (issue)", (16, 48, 48), (7, 15, 15), {}, 16, 16, 128, 1),
        ("1-D 32768, window 2047 (issue)", (32768,), 2047, {}, 16, 16, 128, 1),
        ("2-D 128x128, 16x16 stride 16 (issue)", (128, 128), 16, {"stride": 16}, 16, 16, 128, 1),
        ("2-D 128x128, 32x32 stride 16 (issue)", (128, 128), 32, {"stride": 16}, 16, 16, 128, 1),
        ("1-D 16384, causal window 4096, GQA 32/8", (16384,), 4096, {"causal": True}, 32, 8, 128, 1),
        ("1-D 8192, window 511, B=4", (8192,), 511, {}, 12, 12, 128, 4),
        ("1-D 4096, window 255, B=4", (4096,), 255, {}, 16, 16, 128, 4),
        ("2-D 200x200, 41x41", (200, 200), 41, {}, 8, 8, 128, 1),
        ("2-D 96x96, 21x21, B=2", (96, 96), 21, {}, 8, 8, 128, 2),
        ("3-D 12x40x36, 5x17x15 causal time, stride 1x2x1, B=2", (12, 40, 36), (5, 17, 15),
         {"causal": (True, False, False), "stride": (1, 2, 1)}, 8, 8, 128, 2),
        ("2-D 90x75, 13x21, GQA 8/2, B=2", (90, 75), (13, 21), {}, 8, 2, 128, 2),
    ],
    # the Gluon forward at 64 channels, plain and with each exp2 split, against the default Triton
    # forward (off in the backend until this set has run: tiles.GLUON_FORWARD_HEAD_DIMS,
    # GLUON_EXP2_SPLIT, which main() switches on for it)
    "gluon_narrow": [
        ("2-D 128x128, 31x31, D=64 (issue)", (128, 128), 31, {}, 16, 16, 64, 1),
        ("2-D 128x128, 63x63, D=64", (128, 128), 63, {}, 16, 16, 64, 1),
        ("1-D 32768, window 2047, D=64", (32768,), 2047, {}, 16, 16, 64, 1),
        ("2-D 128x128, 31x31 causal axis 0, D=64", (128, 128), 31, {"causal": (True, False)}, 16, 16, 64, 1),
        ("3-D 16x48x48, 7x15x15, D=64", (16, 48, 48), (7, 15, 15), {}, 16, 16, 64, 1),
        ("2-D 64x64, 17x17, D=64, B=4", (64, 64), 17, {}, 16, 16, 64, 4),
        ("1-D 16384, causal window 4096, GQA 32/8, D=64", (16384,), 4096, {"causal": True}, 32, 8, 64, 1),
    ],
    # problems the rule's two constants (tiles.GLUON_FORWARD_SPEED, GLUON_PROGRAM_STEPS) were not
    # fitted on, either side of its choice
    "gluon_check": [
        ("2-D 160x160, 25x25", (160, 160), 25, {}, 8, 8, 128, 1),
        ("1-D 8192, causal window 1023, B=2", (8192,), 1023, {"causal": True}, 16, 16, 128, 2),
        ("3-D 8x32x32, 5x11x11, B=2", (8, 32, 32), (5, 11, 11), {}, 8, 8, 128, 2),
        ("2-D 64x128, 15x31, B=2, GQA 16/4", (64, 128), (15, 31), {}, 16, 4, 128, 2),
        ("1-D 2048, window 511, B=8", (2048,), 511, {}, 16, 16, 128, 8),
        ("2-D 48x48, 11x23, B=4", (48, 48), (11, 23), {}, 8, 8, 128, 4),
        ("2-D 64x64, 17x17, B=4", (64, 64), 17, {}, 16, 16, 128, 4),
        ("3-D 32x64x64, 3x9x9", (32, 64, 64), (3, 9, 9), {}, 8, 8, 128, 1),
    ],
}
# The blocked D=128 rows again, for the packed forward (two programs' walks in one) on 2 stages:
# compiled for sm_90 it takes 106 KiB and 249 registers, so two programs share a multiprocessor,
# where the 3-stage packed candidates timed 2026-11-27 had one (and ran 1.3-1.55x slower).
SETS["blocked_packed"] = [SETS["blocked"][i] for i in (0, 3, 4, 5)]
# (queries, keys, warps, stages, descriptor loads[, programs packed into one: 1 unless given])
VARIANTS = {
    "narrow_1d": [(128, 64, 8, 3, True), (128, 64, 8, 3, False), (128, 64, 8, 2, True), (64, 64, 4, 3, True),
                  (128, 128, 8, 2, True), (64, 128, 4, 2, True)],
    "narrow_nd": [(64, 64, 4, 3, True), (64, 64, 4, 3, False), (128, 64, 8, 3, True), (128, 64, 8, 3, False),
                  (64, 64, 4, 2, False), (64, 128, 4, 2, False)],
    "narrow_rule": [(128, 64, 8, 3, False), (64, 64, 4, 3, True), (128, 128, 8, 2, False)],
    "narrow_short": [],
    "gluon": [],
    "gluon_narrow": [],
    "gluon_check": [],
    "narrow_one_tile": [(64, 64, 4, 3, False), (64, 64, 4, 3, True), (128, 64, 8, 3, False), (128, 128, 8, 2, False)],
    "blocked": [(64, 64, 4, 3, False), (64, 64, 4, 3, True), (128, 64, 8, 3, False), (128, 64, 8, 3, True),
                (128, 64, 8, 2, False), (128, 128, 8, 2, False)],
    "blocked_packed": [(64, 64, 4, 2, False, 2), (64, 64, 4, 2, True, 2), (64, 64, 4, 3, False, 2),
                       (64, 64, 4, 2, False)],
}
# Sets whose variants take the cost model's cheapest boxes for their token counts
# (tiles._cheapest_boxes) instead of the default's boxes refitted by tiles.fit: refitted, a
# blocked problem's 4x16 query box grows to 4x32 and straddles two windows.
COST_MODEL_BOXES = {"blocked", "blocked_packed", "narrow_one_tile"}


def default_with(problem, name, value):
    """The default with ``tiles.<name>`` set to ``value`` (restored after)."""
    kept = getattr(tiles, name)
    setattr(tiles, name, value)
    tiles._best_forward.cache_clear()
    try:
        return tiles.normalise(tiles.default_config.__wrapped__(problem), problem)
    finally:
        setattr(tiles, name, kept)
        tiles._best_forward.cache_clear()


def default_before_narrow_rule(problem):
    """The default of before tiles.NARROW_128_BLOCK_RULE (2026-12-05)."""
    return default_with(problem, "NARROW_128_BLOCK_RULE", False)


def default_before_short_walk_threshold(problem):
    """The default of before tiles.NARROW_128_KEEP_MAX_STEPS (2026-12-06): narrow heads kept the
    128 x 128 block on walks of up to SHORT_WALK_STEPS tiles."""
    return default_with(problem, "NARROW_128_KEEP_MAX_STEPS", tiles.SHORT_WALK_STEPS)


def default_before_one_tile_walks(problem):
    """The default of before one-tile walks left the block (2026-12-06): narrow heads kept the
    128 x 128 block on walks of up to PACK_MAX_STEPS tiles, packed."""
    return default_with(problem, "NARROW_128_KEEP_MAX_STEPS", tiles.PACK_MAX_STEPS)


def default_other_forward(problem):
    """The default with the other of the Gluon and Triton forwards (tiles.gluon_forward_chosen)."""
    default = tiles.normalise(None, problem)
    return dict(default, fwd=dict(default["fwd"], gluon=not default["fwd"]["gluon"]))


def gluon_exp2_splits(problem):
    """The Gluon forward with one exp2 in four and in two on the FMA pipe (exp2_split.py)."""
    default = tiles.normalise(None, problem)
    return [(f"gluon exp2/{every}", dict(default, fwd=dict(default["fwd"], gluon=True, exp2_split=every)))
            for every in (4, 2)]


# Configs a set times besides its default, "before" and VARIANTS: (label, config) pairs.
EXTRA_CONFIGS = {"gluon_narrow": gluon_exp2_splits}

BEFORE = {"narrow_short": default_before_short_walk_threshold, "narrow_one_tile": default_before_one_tile_walks,
          "gluon": default_other_forward, "gluon_narrow": default_other_forward,
          "gluon_check": default_other_forward}


def time_backward(problem, inputs, config):
    """Median ms of the backward (every gradient) on ``config``, from its own forward's output."""
    out, lse = launch.forward(problem, inputs, config)
    go = torch.randn_like(out)
    needs = (True, True, True, False, False, False, False)
    return do_bench(lambda: launch.backward(problem, inputs, out, lse, go, None, needs, config), warmup=25, rep=100,
                    return_mode="median")


def forced(problem, default, bm, bn, warps, stages, tma, pack=1, cheapest=False):
    ext = tiles.group_extents(problem)
    if cheapest:
        _, q, kv = tiles._cheapest_boxes(problem, bm, bn)
        q, kv = list(q), list(kv)
    else:
        q, kv = tiles.fit(default["fwd"]["q"], ext, bm), tiles.fit(default["fwd"]["kv"], ext, bn)
    fwd = dict(default["fwd"], q=q, kv=kv, warps=warps, stages=stages, tma=tma, pack=pack)
    return tiles.normalise(dict(default, fwd=fwd), problem)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(SETS), required=True)
    parser.add_argument("--only")
    parser.add_argument("--json")
    parser.add_argument("--backward", action="store_true",
                        help="also time the backward (dQ, dK, dV) of the default and the 'before' config")
    args = parser.parse_args()
    problems = SETS[args.set]
    if args.set == "gluon_narrow":
        # what the set measures: the Gluon forward at 64 channels and with each exp2 split, which
        # the backend leaves off until this run and the GPU tests say otherwise
        tiles.GLUON_FORWARD_HEAD_DIMS, tiles.GLUON_EXP2_SPLIT = (64, 128), True
    rows = []
    only = range(len(problems)) if args.only is None else [int(i) for i in args.only.split(",")]
    for index in only:
        name, problem, inputs, ref = bf16_problem(problems[index], index)
        default = tiles.normalise(None, problem)
        print(f"# {name}: default {default['fwd']}", flush=True)
        if args.set in ("gluon", "gluon_narrow"):
            print(f"#   gluon boxes {tiles.gluon_forward_boxes(problem)}", flush=True)
        base_ms = None
        seen = []
        before = BEFORE.get(args.set, default_before_narrow_rule)(problem)
        for label, config in [("default", default), ("before", before)] + [
                (f"{bm}x{bn} w{w} s{s} {'desc' if t else 'ptr'}{f' pack{pack[0]}' if pack else ''}",
                 forced(problem, default, bm, bn, w, s, t, *pack, cheapest=args.set in COST_MODEL_BOXES))
                for bm, bn, w, s, t, *pack in VARIANTS[args.set]] + EXTRA_CONFIGS.get(args.set, list)(problem):
            if config["fwd"] in seen:
                continue
            seen.append(config["fwd"])
            ms, err = time_forward(problem, inputs, config, ref)
            base_ms = base_ms or ms
            row = dict(problem=name, variant=label, fwd=config["fwd"], ms=ms, error=err, speedup=base_ms / ms)
            rows.append(row)
            print(f"  {label} {config['fwd']['q']}x{config['fwd']['kv']}: {ms:.3f} ms, rel error {err:.1e}, "
                  f"{base_ms / ms:.2f}x the default", flush=True)
            if args.backward and label in ("default", "before"):
                row["backward ms"] = time_backward(problem, inputs, config)
                row["dq"], row["dkdv"] = config["dq"], config["dkdv"]
                print(f"    backward ({config['dq']['q']}/{config['dq']['kv']} {config['dq']['warps']}w): "
                      f"{row['backward ms']:.3f} ms", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "set": args.set, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
