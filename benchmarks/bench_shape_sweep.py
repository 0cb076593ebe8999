"""Off-list problems: random shapes no issue names, timed against dense cuDNN, to find where a
backend falls off its own rate.

The issue benchmark (bench_neighborhood.py) and the model shapes (bench_model_shapes.py) are the
shapes the kernels were tuned on. A kernel tuned to those only shows elsewhere: at head dims
that are not powers of two (48, 80, 96, 160, 192), at 256, in float16 or float32, with grouped
heads, a value head dim of its own, grids that are not multiples of a tile, windows of every
size. This script draws such problems from a seed (sizes large enough to time), and per problem
and backend (the dispatcher's choice, and every other fused backend that takes it) times the
forward and forward+backward (``do_bench`` medians) beside dense cuDNN SDPA over the same tokens
and head dim, and reports:

* efficiency: effective TFLOP/s over attended pairs / dense cuDNN's (the issue's definition;
  float32 problems against dense bfloat16, the rate a user would compare with);
* for ``triton``, the pairs its default forward tiles compute per attended pair (a box tiling's
  waste, benchmarks/efficiency_bounds.py) and the product, the kernel's rate on the pairs it
  computes as a fraction of cuDNN's: the figure that should not depend on the problem's shape.
  One far below the others at its head dim is a cliff;
* each output's largest error against the reference backend in float32 on the GPU.

Compiles happen first, in parallel worker processes that run each problem once (Triton's disk
cache then serves the timing phase), so the timed phase measures kernels, not compiles.

    python benchmarks/bench_shape_sweep.py [--seeds 0:24] [--workers 8] [--json F] [--markdown F]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

FUSED = ("triton", "triton_window", "cuda")
# Query-head tokens per problem (batch x tokens x heads): enough work to time on an H100/H200
# (0.05-2 ms a forward), little enough for the float32 reference on the GPU; and at most
# MAX_FLOP of window products (4 B H D tokens |window|, an upper bound of the attended FLOPs).
TOKEN_HEADS = (2**18, 2**20)
MAX_FLOP = 1.5e11


def random_problem(seed: int) -> dict:
    """A neighbourhood problem drawn from ``seed``: shapes and features no benchmark lists."""
    rng = random.Random(104729 * seed + 17)
    rank = rng.choice((1, 2, 2, 2, 3, 3))
    if rank == 1:
        spatial = [rng.randint(1500, 20000)]
        window = [rng.choice((rng.randint(17, 255), rng.randint(256, 1500)))]
    elif rank == 2:
        spatial = [rng.randint(20, 150), rng.randint(20, 150)]
        window = [rng.randint(3, min(41, s)) for s in spatial]
    else:
        spatial = [rng.randint(4, 24), rng.randint(12, 56), rng.randint(12, 56)]
        window = [rng.randint(2, min(9, spatial[0])), *(rng.randint(3, min(19, s)) for s in spatial[1:])]
    if rng.random() < 0.5:  # square windows, as models use them
        window = [min(window[-1], s) for s in spatial]
    dilation = [1] * rank
    if rng.random() < 0.25:
        a = rng.randrange(rank)
        dilation[a] = max(1, min(rng.choice((2, 3, 4)), spatial[a] // window[a]))
    causal = [rng.random() < 0.15 for _ in range(rank)]
    stride = [1] * rank
    if rng.random() < 0.15:
        stride = [rng.randint(1, w) for w in window]
    head_dim = rng.choice((32, 48, 64, 80, 96, 128, 160, 192, 256))
    heads = rng.choice((2, 4, 6, 8, 12, 16))
    kv_heads = heads if rng.random() < 0.7 else rng.choice([h for h in range(1, heads) if heads % h == 0] or [heads])
    value_dim = head_dim if rng.random() < 0.85 else rng.choice((32, 64, 128))
    dtype = rng.choices(("bfloat16", "float16", "float32"), weights=(6, 3, 1))[0]
    tokens = math.prod(spatial)
    batch = max(1, min(64, round(rng.uniform(*TOKEN_HEADS) / (tokens * heads))))
    batch = max(1, min(batch, int(MAX_FLOP / (4 * heads * head_dim * tokens * math.prod(window)))))
    return dict(seed=seed, spatial=spatial, window=window, dilation=dilation, causal=causal, stride=stride,
                head_dim=head_dim, value_dim=value_dim, heads=heads, kv_heads=kv_heads, dtype=dtype, batch=batch)


def describe(p: dict) -> str:
    grid = "x".join(map(str, p["spatial"]))
    win = "x".join(map(str, p["window"]))
    extras = []
    if any(d > 1 for d in p["dilation"]):
        extras.append("dil " + "x".join(map(str, p["dilation"])))
    if any(p["causal"]):
        extras.append("causal " + "".join("c" if c else "-" for c in p["causal"]))
    if any(s > 1 for s in p["stride"]):
        extras.append("stride " + "x".join(map(str, p["stride"])))
    heads = f"{p['heads']}/{p['kv_heads']}" if p["kv_heads"] != p["heads"] else str(p["heads"])
    dims = f"{p['head_dim']}" + (f"/{p['value_dim']}" if p["value_dim"] != p["head_dim"] else "")
    return (f"#{p['seed']} {grid} w {win}{' ' + ', '.join(extras) if extras else ''}; B {p['batch']}, "
            f"H {heads}, D {dims}, {p['dtype']}")


def make_inputs(p: dict, device="cuda"):
    torch.manual_seed(p["seed"])
    dtype = getattr(torch, p["dtype"])
    q = torch.randn(p["batch"], *p["spatial"], p["heads"], p["head_dim"], device=device, dtype=dtype)
    k = torch.randn(p["batch"], *p["spatial"], p["kv_heads"], p["head_dim"], device=device, dtype=dtype)
    v = torch.randn(p["batch"], *p["spatial"], p["kv_heads"], p["value_dim"], device=device, dtype=dtype)
    kwargs = dict(window=tuple(p["window"]), dilation=tuple(p["dilation"]), causal=tuple(p["causal"]),
                  stride=tuple(p["stride"]))
    return q, k, v, kwargs


def runnable(q, k, v, kwargs):
    import haloattn

    explanation = haloattn.explain(q, k, v, verbose=False, **kwargs)
    return explanation.chosen, [v.name for v in explanation.verdicts if v.can_run and v.name in FUSED]


def run_once(p: dict) -> None:
    """One forward+backward per backend (the compile phase: fills Triton's cache)."""
    import haloattn

    q, k, v, kwargs = make_inputs(p)
    _, backends = runnable(q, k, v, kwargs)
    for backend in backends:
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = haloattn.attention(*leaves, backend=backend, **kwargs)
        torch.autograd.grad(out, leaves, torch.randn_like(out))
    torch.cuda.synchronize()


def bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def dense_tflops(p: dict) -> dict:
    """Dense cuDNN SDPA over the problem's tokens at its head dim (bfloat16 for float32 problems)."""
    dtype = torch.bfloat16 if p["dtype"] == "float32" else getattr(torch, p["dtype"])
    tokens, D = math.prod(p["spatial"]), p["head_dim"]
    batch = max(1, round(p["batch"] * p["heads"] / 8))  # 8 heads, the same token-heads
    q, k = (torch.randn(batch, 8, tokens, D, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    v = torch.randn(batch, 8, tokens, p["value_dim"], device="cuda", dtype=dtype, requires_grad=True)
    go = torch.randn(batch, 8, tokens, p["value_dim"], device="cuda", dtype=dtype)
    flops = 2 * batch * 8 * tokens * tokens * (D + p["value_dim"])
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        fwd = bench(lambda: F.scaled_dot_product_attention(q, k, v))
        fwdbwd = bench(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v), (q, k, v), go))
    return {"dense_fwd_tflops": flops / fwd / 1e9, "dense_fwdbwd_tflops": 3.5 * flops / fwdbwd / 1e9}


def triton_waste(problem, attended: int) -> float:
    from efficiency_bounds import computed_pairs

    from haloattn.backends.triton import tiles

    fwd = tiles.default_config(problem)["fwd"]
    return computed_pairs(problem, fwd["q"], fwd["kv"]) / attended


def time_problem(p: dict) -> dict:
    import haloattn
    from bench_neighborhood import attended_pairs

    from haloattn.problem import build_problem

    q, k, v, kwargs = make_inputs(p)
    problem = build_problem(q, k, v, **kwargs)
    chosen, backends = runnable(q, k, v, kwargs)
    attended = attended_pairs(problem)
    fwd_flops = 2 * p["heads"] * (p["head_dim"] + p["value_dim"]) * attended
    row = {"problem": describe(p), "params": p, "default_backend": chosen, "runs": backends}
    row.update(dense_tflops(p))
    if "triton" in backends:
        row["triton_waste"] = triton_waste(problem, attended)
    reference = haloattn.attention(q.float(), k.float(), v.float(), backend="reference", **kwargs)
    go = torch.randn_like(reference).to(q.dtype)
    for backend in backends:
        out = haloattn.attention(q, k, v, backend=backend, **kwargs)
        row[f"{backend}_max_abs_error"] = (out.float() - reference).abs().max().item()
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        fwd = bench(lambda: haloattn.attention(q, k, v, backend=backend, **kwargs))
        fwdbwd = bench(lambda: torch.autograd.grad(haloattn.attention(*leaves, backend=backend, **kwargs), leaves, go))
        for step, ms, flops in (("fwd", fwd, fwd_flops), ("fwdbwd", fwdbwd, 3.5 * fwd_flops)):
            row[f"{backend}_{step}_ms"] = ms
            row[f"{backend}_{step}_eff"] = flops / ms / 1e9 / row[f"dense_{step}_tflops"]
    if "triton_waste" in row:
        row["triton_fwd_rate"] = row["triton_fwd_eff"] * row["triton_waste"]
    return row


def markdown(rows) -> str:
    lines = ["| problem | default | backend | fwd ms | fwd eff | f+b ms | f+b eff | triton computed/attended "
             "| triton fwd rate on computed | max abs err (fp32 ref) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['problem']} | {row.get('default_backend', '-')} | failed: {row['error'][:120]} "
                         f"| | | | | | | |")
            continue
        for backend in row["runs"]:
            waste = f"{row['triton_waste']:.2f}" if backend == "triton" and "triton_waste" in row else ""
            rate = f"{row['triton_fwd_rate']:.2f}" if backend == "triton" and "triton_fwd_rate" in row else ""
            lines.append(f"| {row['problem']} | {row['default_backend']} | {backend} | {row[f'{backend}_fwd_ms']:.3f} "
                         f"| {row[f'{backend}_fwd_eff']:.2f} | {row[f'{backend}_fwdbwd_ms']:.3f} "
                         f"| {row[f'{backend}_fwdbwd_eff']:.2f} | {waste} | {rate} "
                         f"| {row[f'{backend}_max_abs_error']:.1e} |")
    return "\n".join(lines)


def compile_phase(seeds, workers: int, timeout: float) -> dict:
    """Each problem run once in worker processes, ``workers`` at a time; returns failures by seed."""
    failures, pending = {}, list(seeds)
    running = []
    while pending or running:
        while pending and len(running) < workers:
            seed = pending.pop(0)
            cmd = [sys.executable, os.path.abspath(__file__), "--compile-one", str(seed)]
            running.append((seed, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
        seed, proc = running.pop(0)
        try:
            _, err = proc.communicate(timeout=timeout)
            if proc.returncode:
                failures[seed] = (err.strip().splitlines() or ["exit %d" % proc.returncode])[-1]
        except subprocess.TimeoutExpired:
            proc.kill()
            failures[seed] = f"compile phase over {timeout:.0f} s"
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:24", help="start:stop")
    parser.add_argument("--workers", type=int, default=8, help="parallel processes of the compile phase")
    parser.add_argument("--compile-timeout", type=float, default=400.0)
    parser.add_argument("--compile-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    if args.compile_one is not None:
        run_once(random_problem(args.compile_one))
        return
    start, _, stop = args.seeds.partition(":")
    seeds = range(int(start), int(stop))
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    failures = compile_phase(seeds, args.workers, args.compile_timeout)
    rows = []
    for seed in seeds:
        p = random_problem(seed)
        try:
            rows.append(time_problem(p))
        except Exception as exc:  # a failure is a finding: reported, never hidden
            rows.append({"problem": describe(p), "params": p, "error": f"{type(exc).__name__}: {exc}",
                         "compile_failure": failures.get(seed)})
            torch.cuda.empty_cache()
        print(json.dumps(rows[-1]), flush=True)
        if args.json:  # after every problem: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                           "compile_failures": failures}, f, indent=1)
    table = markdown(rows)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
