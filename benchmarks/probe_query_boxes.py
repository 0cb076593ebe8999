"""Which half of the forward's query-tile boxes (launch.HOST_QUERY_BOXES) goes wrong on the GPU:
the query tile read through a box, the output written through one, or both, against pointers and
the float64 oracle, on the bfloat16 D=64 problems whose GPU tests failed with both on (H200,
2026-12-06, RESULTS.md "Resident tiles through host descriptors"); then each variant's
CUDA-graph time on 2-D 31x31 at D=128 and D=64 (variants in turn, median of three rounds).

    python3 benchmarks/probe_query_boxes.py
"""

from __future__ import annotations

import os
import sys

import torch
from triton.testing import do_bench_cudagraph

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import oracle  # noqa: E402

from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.backends.triton import fast_launch, launch, tiles  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

VARIANTS = {"pointers": (False, False), "query box": (True, False), "output box": (False, True), "both": (True, True)}


def run_variant(name, problem, inputs, config):
    query, output = VARIANTS[name]
    if launch.HOST_QUERY_BOXES != {"query": query, "output": output}:
        launch.HOST_QUERY_BOXES.update(query=query, output=output)
        fast_launch.clear_plans()
    return launch.forward(problem, inputs, config)


def case(batch, spatial, heads, head_dim, window, **options):
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, *spatial, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    problem = build_problem(q, k, v, window, **options)
    return problem, AttentionInputs(q, k, v), tiles.default_config(problem), (q, k, v)


def main():
    print(f"device: {torch.cuda.get_device_name()}")
    for args, options in [((1, (64, 64), 4, 64, 31), {}), ((1, (3000,), 4, 64, 1023), dict(causal=True)),
                          ((1, (40, 40), 4, 128, 13), {}), ((2, (5, 24, 24), 4, 64, (3, 7, 7)), {})]:
        problem, inputs, config, (q, k, v) = case(*args, **options)
        ref, _ = oracle.attention(q.double().cpu(), k.double().cpu(), v.double().cpu(), args[-1], **options)
        base, _ = run_variant("pointers", problem, inputs, config)
        line = [f"{args} {options} fwd {config['fwd']['q']}x{config['fwd']['kv']}"]
        for name in VARIANTS:
            out, _ = run_variant(name, problem, inputs, config)
            line.append(f"{name}: diff {(out.float() - base.float()).abs().max().item():.3g} "
                        f"oracle {oracle.rel_error(out.cpu(), ref):.3g}")
        print(" | ".join(line), flush=True)
    for head_dim in (128, 64):
        problem, inputs, config, _ = case(1, (128, 128), 16, head_dim, 31)
        times = {name: [] for name in VARIANTS}
        for _ in range(3):
            for name in VARIANTS:
                run_variant(name, problem, inputs, config)
                times[name].append(do_bench_cudagraph(lambda: run_variant(name, problem, inputs, config), rep=40))
        ms = {name: sorted(t)[1] for name, t in times.items()}
        print(f"2-D 128x128 31x31 D={head_dim}: " + ", ".join(
            f"{name} {t:.4f} ms ({ms['pointers'] / t:.3f}x)" for name, t in ms.items()), flush=True)


if __name__ == "__main__":
    main()
