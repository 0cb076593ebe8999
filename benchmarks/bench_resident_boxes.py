"""Resident tiles through host descriptors of boxes (launch.HOST_RESIDENT_BOXES: the forward's
query tile in and output out; dQ's Q, dO, O in and dQ out; dK/dV's K, V in and dK, dV out) against
pointer gathers and scatters, on the default configs: the neighbourhood benchmark's problems, the
extra model-shaped ones and the short walks of bench_short_walks.py (where a program's few loads
and stores weigh most). Forward, and backward with dQ's boxes alone and with both kernels',
CUDA-graph medians of interleaved rounds; every output compared bit for bit.

    python3 benchmarks/bench_resident_boxes.py [--rounds 3] [--only 1,5] [--passes forward,backward] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernel_variants import EXTRA_PROBLEMS  # noqa: E402
from bench_neighborhood import BATCH, HEADS, PROBLEMS  # noqa: E402
from bench_short_walks import PROBLEMS as SHORT_WALKS, interleaved_ms  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import fast_launch, launch, tiles  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402


def problems():
    """(name, batch, spatial, heads, head dim, window, options) of every problem timed."""
    out = [(name, BATCH, spatial, HEADS, D, window, options) for name, spatial, window, options, D in
           PROBLEMS + EXTRA_PROBLEMS]
    for batch, spatial, heads, D, window, options in SHORT_WALKS[:9]:  # the blocked and small-window ones
        out.append((f"{batch}x{spatial} window {window} {options} D={D} heads {heads}", batch, spatial, heads, D,
                    window, options))
    return out


def with_boxes(on, fn):
    """``fn`` run with HOST_RESIDENT_BOXES on for the kernels in ``on``, off for the others (plans
    rebuilt on a change)."""
    wanted = {kernel: kernel in on for kernel in launch.HOST_RESIDENT_BOXES}

    def run():
        if launch.HOST_RESIDENT_BOXES != wanted:
            launch.HOST_RESIDENT_BOXES.update(wanted)
            fast_launch.clear_plans()
        return fn()
    return run


def pass_runs(name, problem, inputs, config):
    """{variant: thunk} of one pass: pointers against boxes (the backward: dQ's alone, then both
    kernels')."""
    if name == "forward":
        fn = lambda: launch.forward(problem, inputs, config)  # noqa: E731
        return {"pointer": with_boxes((), fn), "boxes": with_boxes(("fwd",), fn)}
    out, lse = launch.forward(problem, inputs, config)
    go = torch.randn_like(out)
    needs = (True, True, True, False, False, False, False)
    fn = lambda: launch.backward(problem, inputs, out, lse, go, None, needs, config)[:3]  # noqa: E731
    return {"pointer": with_boxes((), fn), "dq boxes": with_boxes(("dq",), fn), "boxes": with_boxes(("dq", "dkdv"), fn)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only")
    parser.add_argument("--passes", default="forward,backward")
    parser.add_argument("--json")
    args = parser.parse_args()
    chosen = problems()
    if args.only:
        chosen = [chosen[int(i)] for i in args.only.split(",")]
    print(f"device: {torch.cuda.get_device_name()}")
    print("| problem | pass | tiles | pointer ms | boxes ms | speed-up | dQ's boxes alone | outputs |\n"
          "|---|---|---|---|---|---|---|---|")
    rows = []
    for name, batch, spatial, heads, D, window, options in chosen:
        torch.manual_seed(0)
        if "pattern" in options:
            continue  # Swin windows take the window kernels
        q, k, v = (torch.randn(batch, *spatial, heads, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        problem = build_problem(q, k, v, window, **options)
        inputs = AttentionInputs(q, k, v)
        config = tiles.default_config(problem)
        for pass_name in args.passes.split(","):
            runs = pass_runs(pass_name, problem, inputs, config)
            results = {label: run() for label, run in runs.items()}
            equal = all(torch.equal(a, b) for r in results.values() for a, b in zip(results["pointer"], r))
            ms = interleaved_ms(runs, args.rounds)
            part = config["fwd"] if pass_name == "forward" else config["dq"]
            tiles_text = f"{part['q']}x{part['kv']} tma {part['tma']} pack {part.get('pack', 1)}"
            speed_up = {label: ms["pointer"] / t for label, t in ms.items()}
            rows.append({"problem": name, "pass": pass_name, "config": config, "ms": ms, "speed_up": speed_up,
                         "equal": equal})
            dq_only = f"{speed_up['dq boxes']:.3f}x" if "dq boxes" in ms else "-"
            print(f"| {name} | {pass_name} | {tiles_text} | {ms['pointer']:.4f} | {ms['boxes']:.4f} | "
                  f"{speed_up['boxes']:.3f}x | {dq_only} | {'equal' if equal else 'DIFFERENT'} |", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
