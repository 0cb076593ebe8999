"""Forward-mode AD (JVP) on the GPU: what a tangent costs next to the forward, on the issue's
neighbourhood problems and on the shapes models run.

Per problem (bf16, tangents for q, k and v): the forward (backend ``triton``, the dispatcher's
heuristic config), the fused JVP kernel on its own (``backend.jvp`` given the forward's out and
LSE), and ``torch.func.jvp`` of ``haloattn.attention`` end to end (forward + JVP kernel + the
call's host side), all as CUDA-graph medians except the end-to-end call, which torch.func cannot
capture and ``do_bench`` times with its host time. Effective rates count attended pairs only: the
forward 4·B·H·D·pairs (two products of D per pair), the JVP kernel 10·B·H·D·pairs (its five, given
the forward's out and LSE: Q K^T, dQ K^T, Q dK^T, (P dS) V, P dV). Efficiency = effective TFLOP/s
/ dense cuDNN forward TFLOP/s over the same tokens in the same run, as in bench_neighborhood.py.
The JVP tangent is checked against torch.func.jvp of the reference backend in float32 on two heads
of the first batch entry (``--no-check`` skips it).

FlexAttention has no forward-mode rule (its row says what it raises), and neither has NATTEN's
fused kernels (NATTEN #224); dense attention with a mask would have to hold N x N scores and
tangents (17 GB per tensor for the 2-D problems), so the forward is the yardstick.

    python benchmarks/bench_jvp.py [--only 0,1] [--json F] [--markdown F]
    python benchmarks/bench_jvp.py --variants [--only 0,1,5,9]   # the JVP kernel per copy stages / warps
    python benchmarks/bench_jvp.py --wide-heads   # head dims 192 / 256: JVP tile sizes against the refit
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_model_shapes  # noqa: E402
import bench_neighborhood  # noqa: E402

import haloattn  # noqa: E402
from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.dispatch import DISPATCHER  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402


def problems():
    """(name, batch, spatial, heads, kv heads, head dim, window, options): the issue's ten, then
    the model shapes' neighbourhood rows."""
    rows = [(name, bench_neighborhood.BATCH, spatial, bench_neighborhood.HEADS, bench_neighborhood.HEADS, D, window,
             options) for name, spatial, window, options, D in bench_neighborhood.PROBLEMS]
    rows += [row for row in bench_model_shapes.PROBLEMS if row[7].get("pattern") != "window"]
    return rows


def graph_ms(fn) -> float:
    torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=60, return_mode="median")


def dense_forward_tflops(batch, heads, tokens, head_dim) -> float:
    q, k, v = (torch.randn(batch, heads, tokens, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ms = graph_ms(lambda: F.scaled_dot_product_attention(q, k, v))
    return 4 * batch * heads * head_dim * tokens * tokens / ms / 1e9


def flex_forward_ad() -> str:
    """What torch.func.jvp through FlexAttention does on this torch (eager, a tiny problem)."""
    try:
        from torch.nn.attention.flex_attention import flex_attention

        q = torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.bfloat16)
        torch.func.jvp(lambda q: flex_attention(q, q, q), (q,), (torch.randn_like(q),))
        return "runs"
    except Exception as exc:  # reported, it is the finding
        return " ".join(f"{type(exc).__name__}: {exc}".split())[:160]


def check_slice(q, k, v, tq, tk, tv, window, options, tangent) -> float:
    """Relative error of the tangent of the first batch entry's first two heads (the same windows:
    heads do not change the geometry) against the reference backend in float32."""
    group = q.shape[-2] // k.shape[-2]
    queries = (slice(0, 1), Ellipsis, slice(0, 2), slice(None))
    kv = (slice(0, 1), Ellipsis, slice(0, -(-2 // group)), slice(None))
    parts = [t[queries if i in (0, 3) else kv].float() for i, t in enumerate((q, k, v, tq, tk, tv))]
    _, ref = torch.func.jvp(lambda q, k, v: haloattn.attention(q, k, v, window, backend="reference", **options),
                            tuple(parts[:3]), tuple(parts[3:]))
    ours = tangent[queries].float()
    return ((ours - ref).norm() / ref.norm()).item()


def time_problem(row, check: bool) -> dict:
    name, batch, spatial, heads, kv_heads, D, window, options = row
    gen = torch.Generator(device="cuda").manual_seed(len(name))

    def randn(h):
        return torch.randn(batch, *spatial, h, D, device="cuda", dtype=torch.bfloat16, generator=gen)

    q, k, v, tq, tk, tv = randn(heads), randn(kv_heads), randn(kv_heads), randn(heads), randn(kv_heads), randn(kv_heads)
    problem = build_problem(q, k, v, window, **options)
    backend = DISPATCHER.get("triton")
    inputs, tangents = AttentionInputs(q, k, v), AttentionInputs(tq, tk, tv)
    pairs = bench_neighborhood.attended_pairs(problem)
    result = {"problem": name, "pairs": pairs}
    out, lse = backend.forward(problem, inputs)
    result["fwd_ms"] = graph_ms(lambda: backend.forward(problem, inputs))
    result["jvp_kernel_ms"] = graph_ms(lambda: backend.jvp(problem, inputs, tangents, out, lse))
    result["jvp_only_v_ms"] = graph_ms(lambda: backend.jvp(problem, inputs, AttentionInputs(None, None, tv), out, lse))
    call = lambda: torch.func.jvp(lambda q, k, v: haloattn.attention(q, k, v, window, backend="triton", **options),  # noqa: E731
                                  (q, k, v), (tq, tk, tv))
    result["func_jvp_ms"] = do_bench(call, warmup=10, rep=60, return_mode="median")
    result["forward_call_ms"] = do_bench(lambda: haloattn.attention(q, k, v, window, backend="triton", **options),
                                         warmup=10, rep=60, return_mode="median")
    dense = dense_forward_tflops(batch, heads, problem.tokens, D)
    result["dense_fwd_tflops"] = dense
    # attended_pairs counts the batch already
    result["fwd_tflops"] = 4 * heads * D * pairs / result["fwd_ms"] / 1e9
    result["jvp_tflops"] = 10 * heads * D * pairs / result["jvp_kernel_ms"] / 1e9
    result["fwd_eff"] = result["fwd_tflops"] / dense
    result["jvp_eff"] = result["jvp_tflops"] / dense
    result["jvp_over_fwd"] = result["jvp_kernel_ms"] / result["fwd_ms"]
    if check:
        _, tangent = call()
        result["rel_err_vs_reference"] = check_slice(q, k, v, tq, tk, tv, window, options, tangent)
    return result


def triton_jvp_problem(row, seed: int):
    """A row's problem with random bf16 q, k, v and tangents for all three, the triton backend and
    its forward's out and LSE: (name, problem, backend, inputs, tangents, out, lse)."""
    name, batch, spatial, heads, kv_heads, D, window, options = row
    options = dict(options)
    value_dim = options.pop("value_dim", D)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, tq, tk, tv = (torch.randn(batch, *spatial, h, width, device="cuda", dtype=torch.bfloat16, generator=gen)
                           for h, width in ((heads, D), (kv_heads, D), (kv_heads, value_dim), (heads, D),
                                            (kv_heads, D), (kv_heads, value_dim)))
    problem = build_problem(q, k, v, window, **options)
    backend = DISPATCHER.get("triton")
    inputs, tangents = AttentionInputs(q, k, v), AttentionInputs(tq, tk, tv)
    out, lse = backend.forward(problem, inputs)
    return name, problem, backend, inputs, tangents, out, lse


def time_variants(row) -> dict:
    """The JVP kernel (tangents of q, k, v) with the dQ config's copy stages set to 1, 2, 3 and with
    8 warps, CUDA-graph ms, median of three interleaved rounds; each tangent's largest relative
    difference from the default's."""
    from haloattn.backends.triton import tiles

    name, problem, backend, inputs, tangents, out, lse = triton_jvp_problem(row, seed=len(row[0]))
    base = tiles.default_config(problem)
    variants = {"default": base}
    for label, change in (("stages1", dict(stages=1)), ("stages2", dict(stages=2)), ("stages3", dict(stages=3)),
                          ("warps8", dict(warps=8))):
        variants[label] = dict(base, dq=dict(base["dq"], **change))
    reference = backend.jvp(problem, inputs, tangents, out, lse, base)[0].float()
    result = {"problem": name}
    for label, cfg in variants.items():
        tangent = backend.jvp(problem, inputs, tangents, out, lse, cfg)[0].float()
        result[label + "_rel_diff"] = ((tangent - reference).norm() / reference.norm()).item()
    times = {label: [] for label in variants}
    for _ in range(3):
        for label, cfg in variants.items():
            times[label].append(graph_ms(lambda: backend.jvp(problem, inputs, tangents, out, lse, cfg)))
    result.update({label + "_ms": sorted(t)[1] for label, t in times.items()})
    result["fwd_ms"] = graph_ms(lambda: backend.forward(problem, inputs))
    return result


# Head dims above 128, where the JVP kernel's four streamed tiles outgrow the dQ tiles' shared memory.
WIDE_HEADS = [(f"2-D 64x64, 13x13, 8 heads of {D}, batch 2", 2, (64, 64), 8, 8, D, 13, {}) for D in (192, 256)] + [
    ("2-D 64x64, 13x13, 8 heads of 192, D_v 64, batch 2", 2, (64, 64), 8, 8, 192, 13, {"value_dim": 64})]


def time_wide_heads(row) -> dict:
    """The JVP kernel at a wide head: the dQ tiles as given, which Triton refuses at their first
    launch and the launcher's generic refit (launch._run_fitted) then shrinks ("refit"), against
    explicit (queries, keys) tile sizes that fit: CUDA-graph ms, median of three interleaved
    rounds, each tangent's relative difference from the refit's, and the default's tiles."""
    from haloattn.backends.triton import fast_launch, tiles

    name, problem, backend, inputs, tangents, out, lse = triton_jvp_problem(row, seed=row[5])
    base = tiles.default_config(problem)
    extents = tiles.group_extents(problem)
    configs = {"refit": None, "default": base}
    for q_tokens, kv_tokens in ((64, 32), (32, 32), (16, 32), (32, 16), (16, 16)):
        configs[f"q{q_tokens}_kv{kv_tokens}"] = dict(base, dq=dict(
            base["dq"], q=tiles.fit(base["dq"]["q"], extents, q_tokens), kv=tiles.fit(base["dq"]["kv"], extents, kv_tokens)))
    fitted = tiles.jvp_tiles
    times, tangent = {label: [] for label in configs}, {}
    try:
        for _ in range(3):
            for label, cfg in configs.items():
                tiles.jvp_tiles = (lambda problem, dq: dq) if label == "refit" else fitted
                fast_launch.clear_plans()
                tangent[label] = backend.jvp(problem, inputs, tangents, out, lse, cfg)[0].float()  # refits outside the graph
                times[label].append(graph_ms(lambda: backend.jvp(problem, inputs, tangents, out, lse, cfg)))
    finally:
        tiles.jvp_tiles = fitted
        fast_launch.clear_plans()
    own = fitted(problem, base["dq"])
    result = {"problem": name, "default_tiles": [own["q"], own["kv"], own["warps"]]}
    for label in configs:
        result[label + "_rel_diff"] = ((tangent[label] - tangent["refit"]).norm() / tangent["refit"].norm()).item()
    result.update({label + "_ms": sorted(t)[1] for label, t in times.items()})
    result["fwd_ms"] = graph_ms(lambda: backend.forward(problem, inputs))
    return result


def markdown(rows, flex_note: str) -> str:
    lines = [
        "| problem | fwd ms | fwd eff | JVP kernel ms | JVP eff | JVP / fwd | JVP of v only ms | torch.func.jvp call ms "
        "| forward call ms | rel. error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['problem']} | {r['fwd_ms']:.3f} | {r['fwd_eff']:.2f} | {r['jvp_kernel_ms']:.3f} | {r['jvp_eff']:.2f} | "
            f"{r['jvp_over_fwd']:.2f} | {r['jvp_only_v_ms']:.3f} | {r['func_jvp_ms']:.3f} | {r['forward_call_ms']:.3f} | "
            f"{r.get('rel_err_vs_reference', float('nan')):.1e} |")
    lines.append("")
    lines.append(f"FlexAttention under torch.func.jvp: {flex_note}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma list of problem indices")
    parser.add_argument("--no-check", dest="check", action="store_false")
    parser.add_argument("--variants", action="store_true", help="time the JVP kernel's copy stages and warps instead")
    parser.add_argument("--wide-heads", action="store_true", help="time JVP tile sizes at head dims 192 and 256")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    rows = problems()
    chosen = [int(i) for i in args.only.split(",")] if args.only else range(len(rows))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    if args.wide_heads:
        for row in WIDE_HEADS:
            print(json.dumps(time_wide_heads(row)), flush=True)
        return
    if args.variants:
        for i in chosen:
            print(json.dumps(time_variants(rows[i])), flush=True)
        return
    results = []
    for i in chosen:
        results.append(time_problem(rows[i], args.check))
        print(json.dumps(results[-1]), flush=True)
    note = flex_forward_ad()
    table = markdown(results, note)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": results, "flex": note}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
