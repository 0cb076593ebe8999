"""The forward's query-tile boxes (launch.HOST_QUERY_BOXES) on the GPU, in three parts:

1. each half (the query tile read through a box, the output written through one) against
   pointers, bf16, on problems of rank 1-3 at D=64 and D=128;
2. what the query box hands the tensor cores where it goes wrong: with every key equal to the
   unit vector of channel c, a query's log-sum-exp is log(n) + scale * q[c], so the difference of
   the box's LSE from the pointers' names the value the kernel multiplied, q'[c]; each wrong
   row is matched to the query rows and channels of its tile that hold that value;
3. CUDA-graph time of pointers, the output box and both, interleaved (median of three rounds),
   on the issue benchmark's forward problems (B=1, H=16, bf16).

(H100, 2026-12-06 04:20 UTC: the query box alone went wrong at D=64 in the forward, while the
same box loaded and multiplied alone was right: probe_box_roundtrip.py.)

    python3 benchmarks/probe_query_boxes.py
"""

from __future__ import annotations

import torch
from triton.testing import do_bench_cudagraph

from haloattn.backend import AttentionInputs
from haloattn.backends.triton import fast_launch, launch, tiles
from haloattn.problem import build_problem

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
    return problem, (q, k, v), tiles.default_config(problem)


def halves():
    for args, options in [((1, (64, 64), 4, 64, 31), {}), ((1, (3000,), 4, 64, 1023), dict(causal=True)),
                          ((1, (40, 40), 4, 128, 13), {}), ((2, (5, 24, 24), 4, 64, (3, 7, 7)), {}),
                          ((1, (64, 64), 4, 128, 31), {})]:
        problem, (q, k, v), config = case(*args, **options)
        base, base_lse = run_variant("pointers", problem, AttentionInputs(q, k, v), config)
        line = [f"{args} {options} fwd {config['fwd']['q']}x{config['fwd']['kv']}"]
        for name in list(VARIANTS)[1:]:
            out, lse = run_variant(name, problem, AttentionInputs(q, k, v), config)
            line.append(f"{name}: out {(out.float() - base.float()).abs().max().item():.3g} "
                        f"lse {(lse.float() - base_lse.float()).abs().max().item():.3g}")
        print(" | ".join(line), flush=True)


def seen_queries():
    problem, (q, k, v), config = case(1, (64, 64), 4, 64, 31)
    tile = config["fwd"]["q"]
    for channel in (0, 1, 9, 40):
        k = torch.zeros_like(k)
        k[..., channel] = 1.0
        lse = {name: run_variant(name, problem, AttentionInputs(q, k, v), config)[1].float()
               for name in ("pointers", "query box")}
        # LSE layout [B, *spatial, H]; head 0, the first query tile.
        seen = q[0, :tile[0], :tile[1], 0, channel].float() + (
            lse["query box"][0, :tile[0], :tile[1], 0] - lse["pointers"][0, :tile[0], :tile[1], 0]) / problem.scale
        truth = q[0, :tile[0], :tile[1], 0, :].float().reshape(-1, q.shape[-1])
        wrong = (seen.flatten() - truth[:, channel]).abs() > 0.02
        print(f"channel {channel}: {int(wrong.sum())} of {wrong.numel()} rows of tile 0 (head 0) see another value",
              flush=True)
        for row in wrong.nonzero().flatten()[:6].tolist():
            matches = ((truth - seen.flatten()[row]).abs() < 0.01).nonzero().tolist()
            print(f"    row {row} sees {seen.flatten()[row].item():.3f}: held by (row, channel) {matches[:4]}",
                  flush=True)


def timing():
    problems = [("1-D 32768, 2047", (32768,), 2047, {}, 128), ("2-D 31x31", (128, 128), 31, {}, 128),
                ("2-D 31x31 D=64", (128, 128), 31, {}, 64), ("3-D 7x15x15", (16, 48, 48), (7, 15, 15), {}, 128),
                ("16x16 stride 16", (128, 128), 16, dict(stride=16), 128)]
    for label, spatial, window, options, head_dim in problems:
        problem, (q, k, v), config = case(1, spatial, 16, head_dim, window, **options)
        inputs = AttentionInputs(q, k, v)
        names = ("pointers", "output box", "both")
        times = {name: [] for name in names}
        for _ in range(3):
            for name in names:
                run_variant(name, problem, inputs, config)
                times[name].append(do_bench_cudagraph(lambda: run_variant(name, problem, inputs, config), rep=40))
        ms = {name: sorted(t)[1] for name, t in times.items()}
        print(f"{label}: " + ", ".join(f"{name} {t:.4f} ms ({ms['pointers'] / t:.3f}x)" for name, t in ms.items()),
              flush=True)


def main():
    print(f"device: {torch.cuda.get_device_name()}")
    halves()
    seen_queries()
    timing()


if __name__ == "__main__":
    main()
