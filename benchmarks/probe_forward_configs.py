"""The triton forward under forced configs, each in its own process (an illegal address ends a
process's CUDA context), against the reference backend in float64 on the same device. Written
to pin down which config factor breaks a forward (2026-11-29: 64-query tiles with 8 warps at
split head dims in float32 failed on an H200).

    python benchmarks/probe_forward_configs.py            # every variant below
    python benchmarks/probe_forward_configs.py --set stage_one   # the one-stage forward's variants
    python benchmarks/probe_forward_configs.py --one '{"dtype": "float32", ...}'   # one variant

A variant: dtype, head_dim, value_dim, grid, window, stride, precision (tl.dot's float32
products: "tf32x3", "ieee" or "tf32"), optionally batch, heads and kv_heads (default 1, 2, 2),
and ``fwd``: config keys that override the default's forward (``q``/``kv`` tiles, ``warps``,
``stages``, ``split_heads``, ``tma``...).
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

GRID, WINDOW, STRIDE = (16, 16), (5, 5), (1, 1)


def variants():
    base = dict(grid=GRID, window=WINDOW, stride=STRIDE, fwd={"q": [8, 8], "kv": [8, 8]})
    for dtype, (d, dv), warps, split, precision in itertools.product(
            ("float32", "bfloat16"), ((80, 48), (72, 64), (144, 64), (64, 64), (128, 128)), (4, 8), (True, False),
            ("tf32x3",)):
        if (d, dv) in ((64, 64), (128, 128)) and split:
            continue
        yield dict(base, dtype=dtype, head_dim=d, value_dim=dv, precision=precision,
                   fwd=dict(base["fwd"], warps=warps, split_heads=split))
    for precision, warps in itertools.product(("ieee", "tf32"), (4, 8)):
        yield dict(base, dtype="float32", head_dim=80, value_dim=48, precision=precision,
                   fwd=dict(base["fwd"], warps=warps, split_heads=True))
    # Value dims whose tail the head does not fill (72 = 64 + 8 of 16): wrong in bfloat16 on
    # 64-query tiles while they split (2026-11-29), padded since (tiles.head_split).
    for dtype, warps in itertools.product(("bfloat16", "float16"), (4, 8)):
        yield dict(base, dtype=dtype, head_dim=72, value_dim=72, precision="tf32x3",
                   fwd=dict(base["fwd"], warps=warps, split_heads=True))


def stage_one_variants():
    """The forward on one stage (a tuning candidate for wide 16-bit heads on 2026-12-04-05): on an
    H200 the 3-D 16x32x32, 5x9x9, head dim 160 problem of bench_wide_forward_tiles.py ended in an
    illegal address under it, where ranks 1 and 2 at head dims 192 and 256 ran. Which factor: rank,
    split heads, descriptor loads, the head dim; and the two-stage control. (Found, 2026-12-05:
    a 32-channel head tail, on every rank; tiles.MIN_FORWARD_STAGES.)"""
    video = dict(grid=(16, 32, 32), window=(5, 9, 9), stride=(1, 1, 1), batch=2, heads=8, kv_heads=8,
                 dtype="bfloat16", head_dim=160, value_dim=160, precision="tf32x3")
    boxes = {"q": [2, 4, 8], "kv": [2, 2, 16], "warps": 4}
    for stages, tma, split in itertools.product((1, 2), (True, False), (True, False)):
        yield dict(video, fwd=dict(boxes, stages=stages, tma=tma, split_heads=split))
    for d in (64, 128, 256):
        yield dict(video, head_dim=d, value_dim=d, fwd=dict(boxes, stages=1, tma=True))
    yield dict(video, grid=(8, 16, 16), window=(3, 5, 5), batch=1, heads=2, kv_heads=2, fwd=dict(boxes, stages=1, tma=True))
    for tma in (True, False):
        yield dict(video, grid=(32, 32), window=(9, 9), stride=(1, 1), fwd={"q": [8, 8], "kv": [8, 8], "warps": 4,
                                                                             "stages": 1, "tma": tma})
        yield dict(video, grid=(2048,), window=(127,), stride=(1,), fwd={"q": [64], "kv": [64], "warps": 4,
                                                                         "stages": 1, "tma": tma})
    yield dict(video, fwd={"q": [2, 4, 8], "kv": [2, 2, 8], "warps": 4, "stages": 2, "tma": True})


VARIANT_SETS = {"split_heads": variants, "stage_one": stage_one_variants}


def run_one(variant: dict) -> str:
    import torch

    import haloattn
    from haloattn.backend import AttentionInputs
    from haloattn.backends.triton import launch, tiles
    from haloattn.problem import build_problem

    torch.backends.cuda.matmul.allow_tf32 = variant["precision"] == "tf32"
    if variant["precision"] != "tf32":
        os.environ["HALOATTN_TRITON_FLOAT32"] = variant["precision"]
    dtype = getattr(torch, variant["dtype"])
    g = torch.Generator(device="cuda").manual_seed(0)
    batch, grid = variant.get("batch", 1), tuple(variant["grid"])
    heads, kv_heads = variant.get("heads", 2), variant.get("kv_heads", 2)
    q = torch.randn(batch, *grid, heads, variant["head_dim"], device="cuda", generator=g, dtype=dtype)
    k = torch.randn(batch, *grid, kv_heads, variant["head_dim"], device="cuda", generator=g, dtype=dtype)
    v = torch.randn(batch, *grid, kv_heads, variant["value_dim"], device="cuda", generator=g, dtype=dtype)
    options = dict(stride=tuple(variant["stride"]))
    problem = build_problem(q, k, v, tuple(variant["window"]), **options)
    tiles.MIN_FORWARD_STAGES = 1  # the probe runs the one-stage forward the library refuses
    base = tiles.default_config(problem)
    cfg = dict(base, fwd=dict(base["fwd"], **variant["fwd"]))
    ran = tiles.normalise(cfg, problem)["fwd"]
    assert all(ran[key] == value for key, value in variant["fwd"].items()), f"the forward ran {ran}"
    out, lse = launch.forward(problem, AttentionInputs(q, k, v), cfg)
    torch.cuda.synchronize()
    ref, ref_lse = haloattn.attention(q.double(), k.double(), v.double(), tuple(variant["window"]),
                                      backend="reference", return_lse=True, **options)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    lse_err = (lse.double() - ref_lse).abs().max().item()
    return f"out {err:.2e} lse {lse_err:.2e}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--one", help="one variant (JSON), in this process")
    parser.add_argument("--processes", type=int, default=8, help="variants run at once")
    parser.add_argument("--set", choices=sorted(VARIANT_SETS), default="split_heads", help="which variants")
    args = parser.parse_args()
    if args.one:
        print(run_one(json.loads(args.one)))
        return
    def launch(variant):
        return subprocess.run([sys.executable, __file__, "--one", json.dumps(variant)], capture_output=True, text=True,
                              timeout=300)

    todo = list(VARIANT_SETS[args.set]())
    with ThreadPoolExecutor(args.processes) as pool:
        runs = list(pool.map(launch, todo))
    for variant, done in zip(todo, runs):
        last = (done.stdout.strip().splitlines() or ["-"])[-1]
        verdict = last if done.returncode == 0 else f"FAILED ({(done.stderr.strip().splitlines() or ['?'])[-1][:120]})"
        label = (f"{variant['dtype']:9s} grid {'x'.join(map(str, variant['grid']))} window "
                 f"{'x'.join(map(str, variant['window']))} D {variant['head_dim']:3d}/{variant['value_dim']:3d} "
                 f"{variant['precision']:6s} {json.dumps(variant['fwd'])}")
        print(f"{label}  {verdict}", flush=True)


if __name__ == "__main__":
    main()
