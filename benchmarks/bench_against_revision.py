"""Backend ``triton`` of the working tree against the same package from another revision, side by
side in one process: for a kernel change that no config key can switch off, the only A/B whose
ratio is not moved by the clock drift between two processes or two machines.

    git archive <rev> backends/triton | tar -x -C /tmp/base       # the other revision's package
    python benchmarks/bench_against_revision.py --base /tmp/base/backends/triton \\
        [--only 1,5] [--extra] [--rounds 3] [--no-forward | --no-backward] [--this-config JSON] [--json FILE]

The other package is imported as ``haloattn.backends.triton_base`` (its relative imports resolve
inside it; both share the working tree's core). Each problem runs both packages' default configs
(each package's own ``tiles``), forward and backward, timed in turn round after round; each keeps
the median of its rounds. Printed per problem and pass: both times, base / this (above 1: this tree
is faster) and the largest relative difference between their results (bf16 rounding, not 0:
the packages may order sums differently).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernel_variants import EXTRA_PROBLEMS, dense_tflops, relative_difference, write_json  # noqa: E402
from bench_neighborhood import BATCH, HEADS, PROBLEMS, attended_pairs, bench, make_inputs  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import launch as this_launch  # noqa: E402

NEEDS = (True, True, True, False, False, False, False)  # dq, dk, dv


def import_base(path: str):
    """The package at ``path`` as ``haloattn.backends.triton_base``; returns its launch module."""
    name = "haloattn.backends.triton_base"
    spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"),
                                                  submodule_search_locations=[path])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    return importlib.import_module(name + ".launch")


def time_in_turn(runs: dict, rounds: int) -> dict:
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            times[name].append(bench(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def merged(config: dict, overrides: dict) -> dict:
    return {part: dict(cfg, **overrides.get(part, {})) for part, cfg in config.items()}


def compare(index, base_launch, rounds, forward=True, overrides=None, backward_too=True):
    q, k, v, problem = make_inputs(index)
    config = merged(this_launch.tiles.default_config(problem), overrides) if overrides else None
    inputs = AttentionInputs(q, k, v)
    launches = {"base": base_launch, "this": this_launch}
    pairs = attended_pairs(problem)
    flops = 4 * BATCH * HEADS * problem.head_dim * pairs
    dense = dense_tflops(problem.tokens, problem.head_dim, q.device, q.dtype)
    row = {"problem": PROBLEMS[index][0], "dense_tflops": dense}
    configs = {"base": None, "this": config}
    outputs = {name: la.forward(problem, inputs, configs[name]) for name, la in launches.items()}
    if forward and rounds:
        ms = time_in_turn({name: (lambda la=la, c=configs[name]: la.forward(problem, inputs, c))
                           for name, la in launches.items()}, rounds)
        row["forward"] = dict(ms, base_over_this=ms["base"] / ms["this"],
                              rel_diff=relative_difference(outputs["this"], outputs["base"]),
                              efficiency=flops / ms["this"] / 1e9 / dense)
    if not backward_too:
        return row
    go = torch.randn_like(outputs["this"][0])
    out, lse = outputs["this"]

    def backward(name):
        return launches[name].backward(problem, inputs, out, lse, go, None, NEEDS, configs[name])[:3]

    grads = {name: backward(name) for name in launches}
    if not rounds:  # compile only
        return row
    ms = time_in_turn({name: (lambda name=name: backward(name)) for name in launches}, rounds)
    row["backward"] = dict(ms, base_over_this=ms["base"] / ms["this"],
                           rel_diff=relative_difference(grads["this"], grads["base"]),
                           efficiency=2.5 * flops / ms["this"] / 1e9 / dense)
    return row


def report(row):
    cells = [row["problem"]]
    for part in ("forward", "backward"):
        if part in row:
            r = row[part]
            cells.append(f"{part} {r['base']:.3f} -> {r['this']:.3f} ms ({r['base_over_this']:.3f}x, "
                         f"eff {r['efficiency']:.2f}, diff {r['rel_diff']:.1e})")
    print(" | ".join(cells), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="folder of the other revision's backends/triton")
    parser.add_argument("--only", default=None, help="problem indices, comma-separated (default: all)")
    parser.add_argument("--extra", action="store_true", help="also problems 10 and up: EXTRA_PROBLEMS")
    parser.add_argument("--rounds", type=int, default=3,
                        help="0: run each kernel once, untimed (fills the Triton cache for a later run)")
    parser.add_argument("--no-forward", action="store_true", help="time the backward only")
    parser.add_argument("--no-backward", action="store_true", help="time the forward only")
    parser.add_argument("--this-config", type=json.loads, default=None,
                        help='JSON merged into this tree\'s default config per kernel, e.g. \'{"dkdv": {"stages": 1}}\'')
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.extra:
        PROBLEMS.extend(EXTRA_PROBLEMS)  # make_inputs reads this same list
    base_launch = import_base(os.path.abspath(args.base))
    indices = [int(i) for i in args.only.split(",")] if args.only else range(len(PROBLEMS))
    print(f"# {torch.cuda.get_device_name()}: base {args.base} against this tree, {args.rounds} rounds", flush=True)
    results = []
    for index in indices:
        results.append(compare(index, base_launch, args.rounds, not args.no_forward, args.this_config,
                               not args.no_backward))
        if args.rounds:
            report(results[-1])
        write_json(args.json, results)


if __name__ == "__main__":
    main()
