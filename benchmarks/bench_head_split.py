"""The triton kernels on head dims that are not powers of two: one padded block against a block
and a tail (tiles.head_split, config ``split_heads``), and, above head dim 128, the backward's
in-step waits for its dQ / dK products (``wait_dq`` / ``wait_dk``), side by side in one run.

Per problem and head dim (bf16), each variant's forward and backward (dQ, dK, dV) are timed in
alternating rounds (CUDA-graph replays, median per round, median of rounds) and its output and
gradients compared with the reference backend in float32:

* ``padded``: one padded block, no in-step waits (the kernels before 2026-11-29);
* ``padded+waits``: the same with the in-step waits;
* ``split``: block and tail, no waits;
* ``split+waits``: block and tail with the waits.

Variants that build the same kernels as an earlier one are left out (head dims with nothing to
split; waits at head dims up to 128, where the default does not wait).

    python benchmarks/bench_head_split.py [--rounds 3] [--dims 80,160] [--compile-only] [--json F] [--markdown F]

``--compile-only`` runs each kernel once untimed (parallel processes, one per head dim, fill
Triton's cache before the timed run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
from triton.testing import do_bench_cudagraph

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_neighborhood import attended_pairs  # noqa: E402

import haloattn  # noqa: E402
from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import launch, tiles  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

# (name, batch, spatial, heads, window, options): shapes of the model and issue benchmarks.
PROBLEMS = [
    ("2-D 128x128, 31x31", 1, (128, 128), 8, 31, {}),
    ("3-D 16x32x32, 5x9x9, batch 2", 2, (16, 32, 32), 8, (5, 9, 9), {}),
]
HEAD_DIMS = (80, 160, 192, 256)
NEEDS = (True, True, True, False, False, False, False)


def variants(problem):
    """name -> config, leaving out those that build the same kernels as an earlier one."""
    base = tiles.default_config(problem)
    out = {}
    for split in (False, True):
        for waits in (False, True):
            cfg = {part: dict(c, split_heads=split) for part, c in base.items()}
            cfg["dq"]["wait_dq"] = waits
            cfg["dkdv"]["wait_dk"] = waits
            if split and not tiles.splits_heads(problem):
                continue  # nothing to split
            if waits and not tiles.wide_backward(problem):
                continue
            out[("split" if split else "padded") + ("+waits" if waits else "")] = cfg
    return out


def run(rounds, dims, compile_only=False):
    rows = []
    for name, batch, spatial, heads, window, options in PROBLEMS:
        for D in dims:
            torch.manual_seed(D)
            q, k, v = (torch.randn(batch, *spatial, heads, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            go = torch.randn_like(q)
            problem = build_problem(q, k, v, window, **options)
            inputs = AttentionInputs(q, k, v)
            configs = variants(problem)
            outs = {}
            for label, cfg in configs.items():
                out, lse = launch.forward(problem, inputs, cfg)
                outs[label] = (out, lse, launch.backward(problem, inputs, out, lse, go, None, NEEDS, cfg)[:3])
            if compile_only:
                continue
            leaves = [t.float().requires_grad_(True) for t in (q, k, v)]
            ref = haloattn.attention(*leaves, window, backend="reference", **options)
            ref_grads = torch.autograd.grad(ref, leaves, go.float())
            row = {"problem": name, "head_dim": D, "blocks": tiles.head_blocks(problem), "variants": list(configs)}
            for label, (out, _, grads) in outs.items():
                row[f"{label} error"] = max([(out.float() - ref).abs().max().item()]
                                            + [((g.float() - r).norm() / r.norm()).item() for g, r in zip(grads, ref_grads)])
            times = {f"{label} {step}": [] for label in configs for step in ("fwd", "bwd")}
            for _ in range(rounds):
                for label, cfg in configs.items():
                    out, lse, _ = outs[label]
                    times[f"{label} fwd"].append(do_bench_cudagraph(
                        lambda: launch.forward(problem, inputs, cfg), rep=40, return_mode="median"))
                    times[f"{label} bwd"].append(do_bench_cudagraph(
                        lambda: launch.backward(problem, inputs, out, lse, go, None, NEEDS, cfg), rep=40,
                        return_mode="median"))
            row.update({f"{key} ms": statistics.median(t) for key, t in times.items()})
            row["attended_tflop"] = 4 * heads * D * attended_pairs(problem) / 1e12
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def markdown(rows):
    labels = ("padded", "padded+waits", "split", "split+waits")
    head = ["problem", "head dim", "blocks (D, tail, Dv, tail)"] + [f"{l} fwd / bwd ms" for l in labels]
    head += ["best against padded, fwd / bwd", "largest error"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["problem"], str(r["head_dim"]), str(tuple(r["blocks"]))]
        for label in labels:
            cells.append(f"{r[f'{label} fwd ms']:.3f} / {r[f'{label} bwd ms']:.3f}" if label in r["variants"] else "-")
        best_fwd = min(r[f"{l} fwd ms"] for l in r["variants"])
        best_bwd = min(r[f"{l} bwd ms"] for l in r["variants"])
        cells.append(f"{r['padded fwd ms'] / best_fwd:.2f}x / {r['padded bwd ms'] / best_bwd:.2f}x")
        cells.append(f"{max(r[f'{l} error'] for l in r['variants']):.1e}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dims", default=",".join(map(str, HEAD_DIMS)))
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    dims = [int(d) for d in args.dims.split(",")]
    if args.compile_only:
        run(0, dims, compile_only=True)
        torch.cuda.synchronize()
        return
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows = run(args.rounds, dims)
    table = markdown(rows)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
