"""The 16-bit forward at head dims above 128 under a few tile shapes, against its default.

At 160-256 channels the default forward tile (64 queries x 64 keys, 4 warps, 2 stages) takes
about 164 KiB of shared memory and 248-255 registers a thread, so one program (4 warps) runs
per multiprocessor, against two at 128 channels; the off-list sweep of 2026-12-04 read these
forwards at 0.23-0.31 of cuDNN's rate on the pairs they compute (0.4-0.6 at 128 channels).
Per problem and config (the default, "before": the forward of before
tiles.WIDE_16BIT_FORWARD_RULE, and VARIANTS): the forward's median time (``do_bench``), its
speed-up over the default, and its output's relative error against the reference backend in
float32 on the GPU.

    python benchmarks/bench_wide_forward_tiles.py [--only 0,2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

import haloattn
from haloattn.backend import AttentionInputs
from haloattn.backends.triton import launch, tiles
from haloattn.problem import build_problem

# (name, spatial, window, options, heads, kv_heads, head_dim, batch)
PROBLEMS = [
    ("1-D 8192, causal window 4096, GQA 8/4, D=256 (Gemma-style local layer)", (8192,), 4096, {"causal": True}, 8, 4,
     256, 2),
    ("2-D 56x112, 12x12, D=192", (56, 112), 12, {}, 6, 6, 192, 22),
    ("2-D 48x26, 12x12, D=256", (48, 26), 12, {}, 16, 16, 256, 44),
    ("2-D 85x62, 26x10, GQA 12/1, D=160", (85, 62), (26, 10), {}, 12, 1, 160, 12),
    ("3-D 16x32x32, 5x9x9, D=160", (16, 32, 32), (5, 9, 9), {}, 8, 8, 160, 2),
    ("3-D 7x19x55, 2x4x16 causal on axis 1, D=192", (7, 19, 55), (2, 4, 16), {"causal": (False, True, False)}, 6, 6,
     192, 22),
    ("2-D 64x64, 17x17, D=256", (64, 64), 17, {}, 8, 8, 256, 4),
    # off-list checks of a default chosen on the rows above (added 2026-12-05)
    ("1-D 4096, window 511, D=192", (4096,), 511, {}, 8, 8, 192, 4),
    ("2-D 32x48, 13x13 dilation 2, D=160", (32, 48), 13, {"dilation": 2}, 8, 8, 160, 8),
    ("3-D 8x24x24, 3x7x7, GQA 4/2, D=256", (8, 24, 24), (3, 7, 7), {}, 4, 2, 256, 2),
    # 1-D rows for the 8-warp 128 x 64 forward, which beat the rule's tiles on both 1-D rows above
    # and lost on every 2-D and 3-D one (added 2026-12-05, 06:00 UTC)
    ("1-D 16384, window 1023, D=256", (16384,), 1023, {}, 8, 8, 256, 1),
    ("1-D 8192, causal window 2048, GQA 16/2, D=192", (8192,), 2048, {"causal": True}, 16, 2, 192, 1),
    ("1-D 32768, causal window 4096, GQA 4/1, D=160", (32768,), 4096, {"causal": True}, 4, 1, 160, 1),
    ("1-D 2048, window 127, D=256, B=4", (2048,), 127, {}, 16, 16, 256, 4),
    ("1-D 8192, window 511 dilation 2, D=256", (8192,), 511, {"dilation": 2}, 8, 8, 256, 2),
    ("1-D 4096, window 256 stride 64, D=192", (4096,), 256, {"stride": 64}, 8, 8, 192, 4),
]
# (queries, keys, warps, stages) per program. (64 x 32 on two stages: 98 KiB, 226 registers at 256
# channels, sm90_compile, 2026-12-04. 64 x 64 on one stage, timed on 2026-12-05, read an illegal
# address on a 3-D problem; no forward runs on one stage since, tiles.MIN_FORWARD_STAGES.)
VARIANTS = [(64, 64, 4, 2), (64, 32, 4, 2), (128, 32, 8, 2), (128, 64, 8, 2)]


def config_for(problem, bm, bn, warps, stages):
    base = tiles.default_config(problem)
    ext = tiles.group_extents(problem)
    fwd = dict(base["fwd"], q=tiles.fit(base["fwd"]["q"], ext, bm), kv=tiles.fit(base["fwd"]["kv"], ext, bn),
               warps=warps, stages=stages)
    return tiles.normalise(dict(base, fwd=fwd), problem)


def forward_before_the_rule(problem, default):
    """The default with the forward of before tiles.WIDE_16BIT_FORWARD_RULE (2026-12-05): the
    cost model's."""
    return tiles.normalise(dict(default, fwd=tiles._config_on_forward_boxes(problem)["fwd"]), problem)


def bf16_problem(spec, seed):
    """(name, problem, inputs, the reference backend's float32 output) of a PROBLEMS-style spec,
    drawn on the GPU from ``seed``."""
    name, spatial, window, options, heads, kv_heads, dim, batch = spec
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, *spatial, heads, dim, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, *spatial, kv_heads, dim, device="cuda", generator=g, dtype=torch.bfloat16)
            for _ in range(2))
    ref = haloattn.attention(q.float(), k.float(), v.float(), window, backend="reference", **options)
    return name, build_problem(q, k, v, window, **options), AttentionInputs(q, k, v), ref


def time_forward(problem, inputs, config, ref):
    """(median forward ms, the output's relative error against ``ref``) of ``config``."""
    out, _ = launch.forward(problem, inputs, config)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    return do_bench(lambda: launch.forward(problem, inputs, config), warmup=25, rep=100, return_mode="median"), err


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(str(i) for i in range(len(PROBLEMS))))
    parser.add_argument("--json")
    parser.add_argument("--skip", default="", help="variants left out, without spaces: e.g. 64x64w4s1,128x32w8s2")
    args = parser.parse_args()
    rows = []
    for index in (int(i) for i in args.only.split(",")):
        name, problem, inputs, ref = bf16_problem(PROBLEMS[index], index)
        default = tiles.normalise(None, problem)
        print(f"# {name}: default {default['fwd']}", flush=True)
        base_ms = None
        for label, config in [("default", default), ("before", forward_before_the_rule(problem, default))] + [
                (f"{bm}x{bn} w{w} s{s}", config_for(problem, bm, bn, w, s)) for bm, bn, w, s in VARIANTS]:
            if label != "default" and (config["fwd"] == default["fwd"] or label.replace(" ", "") in args.skip.split(",")):
                continue
            ms, err = time_forward(problem, inputs, config, ref)
            base_ms = base_ms or ms
            rows.append(dict(problem=name, variant=label, fwd=config["fwd"], ms=ms, error=err,
                             speedup=base_ms / ms))
            print(f"  {label}: {ms:.3f} ms, rel error {err:.1e}, {base_ms / ms:.2f}x the default", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
