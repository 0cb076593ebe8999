"""Kernel variants of backend ``triton`` side by side on the neighbourhood benchmark's problems:
every distinct forward config and every distinct backward (dQ, dK/dV) config of
``tiles.candidate_configs`` (tile shapes, warps, stages, tiles through tensor descriptors or not),
with dense cuDNN SDPA over the same tokens timed in the same run for the forward efficiency
column. Each variant's result is checked against the default config's.

    python benchmarks/bench_kernel_variants.py [--only 0,1,5] [--no-backward] [--tma-only] [--rescale-only] [--fold-only] [--exp2-only] [--atomic-only]
        [--walk-only] [--backward-loads-only] [--small-only] [--graph] [--extra] [--rounds 5]
        [--json FILE]

``--extra`` appends problems shaped like the models people run (small windows, small head
dims, a causal sliding window) to the issue's ten, as indices 10 and up, so a default chosen on
the benchmark problems is checked on shapes it was not chosen on.

``--compile-only`` runs each variant once without timing, so several processes (one per problem)
can fill the Triton cache in parallel before one timing run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_neighborhood import BATCH, HEADS, PROBLEMS, attended_pairs, bench, make_inputs  # noqa: E402

# Not the problems: NAT/DiNAT-like 2-D stages (7x7 and 13x13 windows, head dims 32 and
# 64, one dilated), a video-like 3-D window and a causal sliding window over a long sequence.
EXTRA_PROBLEMS = [
    ("2-D 56x56, 7x7, D=32", (56, 56), 7, {}, 32),
    ("2-D 64x64, 13x13 dilation 2, D=64", (64, 64), 13, {"dilation": 2}, 64),
    ("3-D 8x32x32, 3x7x7, D=64", (8, 32, 32), (3, 7, 7), {}, 64),
    ("1-D 16384, causal window 1024, D=128", (16384,), 1024, {"causal": True}, 128),
    # A short 1-D walk (five 64-key tiles a query tile): sliding windows of long-sequence models.
    ("1-D 32768, window 255, D=128", (32768,), 255, {}, 128),
    # Narrow heads on long walks, where the softmax's exp2s rather than the products set the pace
    # (exp2_split.py): ViT-style 64-channel heads, 1-D and 2-D.
    ("1-D 32768, window 2047, D=64", (32768,), 2047, {}, 64),
    ("2-D 128x128, 63x63, D=64", (128, 128), 63, {}, 64),
    # Axial and per-frame windows (window 1 on some axes), whose boxes are one token deep there
    # (tiles._shapes): 2.0 computed pairs per attended pair on the axial rows, 4.6 before.
    ("2-D 128x128, axial 1x63", (128, 128), (1, 63), {}, 128),
    ("3-D 16x48x48, per-frame 1x15x15", (16, 48, 48), (1, 15, 15), {}, 128),
    ("2-D 128x128, axial 31x1 causal, D=64", (128, 128), (31, 1), {"causal": (True, False)}, 64),
    # Anisotropic windows, where boxes shaped like the window are thin in tokens
    # (tiles.THIN_RELATIVE_TO_WINDOW): with window-relative thinness the Triton forward computes
    # 1.69 pairs per attended pair on 3x63 instead of 3.05, 2.06 on 3x3x31 (2.29), 1.21 on 15x127
    # causal (1.40).
    ("2-D 128x128, 3x63", (128, 128), (3, 63), {}, 128),
    ("3-D 16x32x64, 3x3x31", (16, 32, 64), (3, 3, 31), {}, 128),
    ("2-D 64x256, 15x127 causal, D=64", (64, 256), (15, 127), {"causal": (True, False)}, 64),
]

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import launch, tiles  # noqa: E402


def graph_bench(fn) -> float:
    """Median ms of CUDA-graph replays of ``fn``: device time, for problems whose kernels are
    shorter than their host-side launch."""
    fn()  # compile and build launch plans outside the capture
    return do_bench_cudagraph(fn, rep=60, return_mode="median")


def write_json(path, results):
    """Rewritten after every problem, so a run cut short keeps what it measured."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


def dense_tflops(tokens, head_dim, device, dtype):
    q, k, v = (torch.randn(BATCH, HEADS, tokens, head_dim, device=device, dtype=dtype) for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ms = bench(lambda: F.scaled_dot_product_attention(q, k, v))
    return 4 * BATCH * HEADS * head_dim * tokens * tokens / ms / 1e9


def relative_difference(a, b):
    return max(((x.float() - y.float()).norm() / y.float().norm()).item() for x, y in zip(a, b) if y is not None)


def time_variants(configs, part, run, reference, flops=None, dense=None, compile_only=False, rounds=1):
    """One row per distinct ``part`` of ``configs``: median ms, and the difference from ``reference``
    (with ``compile_only``, each variant runs once: it fills the Triton cache for a later run).
    With several ``rounds`` the variants are timed in turn, round after round, and each keeps the
    median of its rounds: clock drift during the run then falls on every variant alike."""
    rows, seen, runs = [], set(), []
    for cfg in configs:
        key = json.dumps({name: cfg[name] for name in part}, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        try:
            difference = relative_difference(run(cfg), reference)
        except Exception as exc:  # a variant that does not compile is a row, not the end of the run
            rows.append({"config": json.loads(key), "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            continue
        rows.append({"config": json.loads(key), "rel_diff": difference, "default": not runs})
        runs.append((rows[-1], lambda cfg=cfg: run(cfg)))
    times = {id(row): [] for row, _ in runs}
    for _ in range(0 if compile_only else rounds):
        for row, fn in runs:
            times[id(row)].append(bench(fn))
    for row, _ in runs:
        ms = statistics.median(times[id(row)]) if times[id(row)] else float("nan")
        row["ms"] = ms
        if len(times[id(row)]) > 1:
            row["ms_rounds"] = times[id(row)]
        if flops:
            row["efficiency"] = flops / ms / 1e9 / dense
    timed = [r for r in rows if "ms" in r]
    base = next((r["ms"] for r in timed if r["default"]), None)
    for r in timed:
        r["default_over_this"] = base / r["ms"] if base else float("nan")
    return sorted(rows, key=lambda r: r.get("ms", 1e9))


def descriptor_configs(configs):
    """The default and the candidates whose forward reads tiles through tensor descriptors."""
    return configs[:1] + [c for c in configs[1:] if c["fwd"].get("tma")]


def rescale_configs(configs):
    """The default and the default forward with the other rescaling rule (lazy or every tile)."""
    fwd = configs[0]["fwd"]
    return [configs[0], dict(configs[0], fwd=dict(fwd, lazy_rescale=not fwd.get("lazy_rescale", False)))]


def fold_configs(configs):
    """The default and the default forward with the scale applied before the mask and the row
    maxima (an FMUL per score) instead of folded into the exp2's FFMA."""
    fwd = configs[0]["fwd"]
    return [configs[0], dict(configs[0], fwd=dict(fwd, fold_scale=not fwd.get("fold_scale", True)))]


def exp2_configs(configs):
    """The default and its forward with every other exp2 split (exp2_split.py), each with both
    rescaling rules: lazy rescaling also drops the per-tile exp2s of the row maxima."""
    fwd = configs[0]["fwd"]
    variants = [dict(fwd, exp2_split=every, lazy_rescale=lazy) for every in tiles.EXP2_SPLIT_CHOICES
                for lazy in (False, True)]
    return configs[:1] + [dict(configs[0], fwd=f) for f in variants if f != fwd]


def atomic_configs(configs, problem):
    """The default and the default with dQ added by atomics in the KV-major pass (opt-in mode):
    bulk (TMA) and element-wise, and with 128-key resident tiles (half the dQ traffic per pair)."""
    dkdv = configs[0]["dkdv"]
    wide = dict(dkdv, kv=tiles.fit(dkdv["kv"], tiles.group_extents(problem), 128), warps=8, atomic_dq=True)
    return [configs[0], dict(configs[0], dkdv=dict(dkdv, atomic_dq=True)),
            dict(configs[0], dkdv=dict(dkdv, atomic_dq=True, tma_dq=False)), dict(configs[0], dkdv=wide)]


def backward_load_configs(configs):
    """The default and the default with the backward's streamed tiles read the other way
    (tensor descriptors or pointer loads)."""
    base = configs[0]
    flipped = {name: dict(cfg, tma=not cfg.get("tma", False)) for name, cfg in base.items() if name != "fwd"}
    return [base, dict(base, **flipped)]


# (query tokens, key tokens, warps, stages) of the small-tile variants: below 64 queries a tile's
# key box shrinks towards its window (7x7 windows: 14x14 keys for an 8x8 query tile, 10x10 for
# 4x4), at the price of smaller matrix products (mma.sync instead of wgmma).
SMALL_BLOCKS = ((16, 16, 1, 2), (16, 32, 1, 2), (32, 16, 1, 2), (32, 32, 1, 2), (32, 32, 2, 2), (32, 64, 2, 3),
                (64, 32, 4, 3), (16, 64, 1, 3))


def small_tile_configs(configs, problem):
    """The default and every kernel with the query and key tiles of SMALL_BLOCKS (the backward's
    resident tile takes the query tile's shape, its streamed tile the key tile's)."""
    base = configs[0]
    ext = tiles.group_extents(problem)
    q_shape, kv_shape = base["fwd"]["q"], base["fwd"]["kv"]
    out = [base]
    for bm, bn, warps, stages in SMALL_BLOCKS:
        q, kv = tiles.fit(q_shape, ext, bm), tiles.fit(kv_shape, ext, bn)
        knobs = dict(warps=warps, stages=stages)
        out.append(dict(fwd=dict(base["fwd"], q=q, kv=kv, **knobs), dq=dict(base["dq"], q=q, kv=kv, **knobs),
                        dkdv=dict(base["dkdv"], q=kv, kv=q, **knobs)))
    return out


def with_walk(config, anchor, axis_masks):
    return {name: dict(cfg, anchor=anchor, axis_masks=axis_masks) for name, cfg in config.items()}


def unmasked_era_default(problem):
    """The default config as it was before anchored walks: tiles chosen by computed pairs alone
    (no mask cost), walked from the range's low end with one mask over all axes."""
    saved = tiles.MASKED_AXIS_COST, tiles.ANCHOR_TILES, tiles.AXIS_MASKS_MAX_HEAD_DIM
    tiles.MASKED_AXIS_COST, tiles.ANCHOR_TILES, tiles.AXIS_MASKS_MAX_HEAD_DIM = 0.0, False, 0
    for cache in (tiles._best_forward, tiles.default_config):
        cache.cache_clear()
    try:
        return tiles.default_config(problem)
    finally:
        tiles.MASKED_AXIS_COST, tiles.ANCHOR_TILES, tiles.AXIS_MASKS_MAX_HEAD_DIM = saved
        for cache in (tiles._best_forward, tiles.default_config):
            cache.cache_clear()


def walk_configs(configs, problem):
    """The default, its tiles walked every way (from the low end or anchored, one mask or masks
    per crossed axis), and the previous default (old tile choice, old walk)."""
    base = configs[0]
    walks = [with_walk(base, anchor, axis_masks) for anchor in (True, False) for axis_masks in (True, False)]
    return [base] + walks + [unmasked_era_default(problem)]


def sweep(index, backward=True, tma_only=False, compile_only=False, rescale_only=False, atomic_only=False,
          walk_only=False, rounds=1, backward_loads_only=False, fold_only=False, small_only=False, exp2_only=False):
    q, k, v, problem = make_inputs(index)
    inputs = AttentionInputs(q, k, v)
    flops = 4 * BATCH * HEADS * problem.head_dim * attended_pairs(problem)
    dense = float("nan") if compile_only else dense_tflops(problem.tokens, problem.head_dim, q.device, q.dtype)
    configs = tiles.candidate_configs(problem)  # the default comes first
    forward_configs = descriptor_configs(configs) if tma_only else configs
    if rescale_only:
        forward_configs, backward = rescale_configs(configs), False
    if fold_only:
        forward_configs, backward = fold_configs(configs), False
    if exp2_only:
        forward_configs, backward = exp2_configs(configs), False
    if atomic_only:
        forward_configs, configs = configs[:1], atomic_configs(configs, problem)
    if walk_only:
        forward_configs = configs = walk_configs(configs, problem)
    if backward_loads_only:
        forward_configs, configs = configs[:1], backward_load_configs(configs)
    if small_only:
        forward_configs = configs = small_tile_configs(configs, problem)
    out, lse = launch.forward(problem, inputs, configs[0])
    result = {"problem": PROBLEMS[index][0], "dense_tflops": dense,
              "forward": time_variants(forward_configs, ["fwd"], lambda c: launch.forward(problem, inputs, c),
                                       (out, lse), flops, dense, compile_only, rounds)}
    if backward:
        go = torch.randn_like(out)
        needs = (True, True, True, False, False, False, False)

        def run(cfg):
            return launch.backward(problem, inputs, out, lse, go, None, needs, cfg)[:3]

        result["backward"] = time_variants(configs, ["dq", "dkdv"], run, run(configs[0]),
                                           compile_only=compile_only, rounds=rounds)
    return result


def label(config):
    parts = []
    for name, c in config.items():
        parts.append(f"{name}: q {c['q']} kv {c['kv']} w{c['warps']} s{c['stages']}{' tma' if c.get('tma') else ''}"
                     f"{' lazy' if c.get('lazy_rescale') else ''}{' exp2/%d' % c['exp2_split'] if c.get('exp2_split') else ''}{' unfolded-scale' if c.get('fold_scale') is False else ''}{' anchored' if c.get('anchor') else ''}"
                     f"{' axis-masks' if c.get('axis_masks') else ''}{' atomic-dq' if c.get('atomic_dq') else ''}{' (element-wise)' if c.get('tma_dq') is False else ''}")
    return "; ".join(parts)


def report(result):
    print(f"\n## {result['problem']} (dense cuDNN {result['dense_tflops']:.0f} TFLOP/s)", flush=True)
    for part in ("forward", "backward"):
        for r in result.get(part, []):
            if "ms" not in r:
                print(f"  {part:8s} {label(r['config'])}: {r['error']}", flush=True)
                continue
            eff = f"  eff {r['efficiency']:.2f}" if "efficiency" in r else ""
            mark = "  <- default" if r["default"] else ""
            print(f"  {part:8s} {r['ms']:7.3f} ms{eff}  x{r['default_over_this']:.2f}  diff {r['rel_diff']:.1e}"
                  f"  {label(r['config'])}{mark}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(str(i) for i in range(len(PROBLEMS))))
    parser.add_argument("--no-backward", action="store_true")
    parser.add_argument("--tma-only", action="store_true",
                        help="forward: the default and the descriptor (TMA) variants only")
    parser.add_argument("--compile-only", action="store_true", help="run each variant once, time nothing")
    parser.add_argument("--rescale-only", action="store_true",
                        help="forward only: the default against the other rescaling rule (lazy or every tile)")
    parser.add_argument("--exp2-only", action="store_true",
                        help="forward only: the default against every other exp2 split (exp2_split.py), "
                             "each with both rescaling rules")
    parser.add_argument("--fold-only", action="store_true",
                        help="forward only: the default against the scale applied before the mask (not folded)")
    parser.add_argument("--atomic-only", action="store_true",
                        help="backward only: the default against the opt-in atomic-dQ backward")
    parser.add_argument("--walk-only", action="store_true",
                        help="the default against its tiles walked without anchoring / per-axis masks, and the "
                             "previous default (tiles chosen without counting masks)")
    parser.add_argument("--backward-loads-only", action="store_true",
                        help="the default against its backward with the streamed tiles read the other way")
    parser.add_argument("--small-only", action="store_true",
                        help="the default against query and key tiles of 16-64 tokens (SMALL_BLOCKS) in every kernel")
    parser.add_argument("--graph", action="store_true",
                        help="time CUDA-graph replays (device time) instead of do_bench (host time included)")
    parser.add_argument("--extra", action="store_true", help="also problems 10 and up: EXTRA_PROBLEMS")
    parser.add_argument("--rounds", type=int, default=1, help="time the variants in turn this many times")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.extra:
        PROBLEMS.extend(EXTRA_PROBLEMS)  # make_inputs reads this same list
    if args.atomic_only:  # the atomic-dQ backward runs only where non-determinism is allowed
        os.environ[tiles.DETERMINISTIC_ENV] = "0"
    if args.graph:
        global bench
        bench = graph_bench
    results = []
    for index in (int(i) for i in args.only.split(",")):
        results.append(sweep(index, not args.no_backward, args.tma_only, args.compile_only, args.rescale_only,
                             args.atomic_only, args.walk_only, args.rounds, args.backward_loads_only, args.fold_only,
                             args.small_only, args.exp2_only))
        if args.compile_only:
            continue
        report(results[-1])
        write_json(args.json, results)


if __name__ == "__main__":
    main()
