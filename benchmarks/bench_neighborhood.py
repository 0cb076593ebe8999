"""Neighbourhood attention on one GPU: haloattn backend ``triton`` against FlexAttention (compiled,
with a block mask built for the same neighbourhood) and dense cuDNN SDPA over the same tokens.

Effective TFLOP/s count attended pairs only (exact, from haloattn.geometry): forward
4 * B * H * D * pairs, forward+backward 3.5x that; dense SDPA counts every pair. Efficiency =
effective TFLOP/s of a method / dense cuDNN TFLOP/s in the same run. Times are
``triton.testing.do_bench`` medians. ``--tune`` also times every tuning candidate's forward
and reports how far the heuristic default is from the best.

    python benchmarks/bench_neighborhood.py [--tune] [--no-flex] [--json FILE] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import haloattn
from haloattn.geometry import key_range
from haloattn.problem import build_problem

# name: (spatial, window, options, head_dim)
PROBLEMS = [
    ("1-D 32768, window 2047", (32768,), 2047, {}, 128),
    ("2-D 128x128, 31x31", (128, 128), 31, {}, 128),
    ("2-D 128x128, 63x63", (128, 128), 63, {}, 128),
    ("2-D 128x128, 31x31 dilation 2", (128, 128), 31, {"dilation": 2}, 128),
    ("2-D 128x128, 31x31 causal axis 0", (128, 128), 31, {"causal": (True, False)}, 128),
    ("3-D 16x48x48, 7x15x15", (16, 48, 48), (7, 15, 15), {}, 128),
    ("3-D 16x48x48, 7x15x15 causal time", (16, 48, 48), (7, 15, 15), {"causal": (True, False, False)}, 128),
    ("2-D 128x128, 32x32 stride 16", (128, 128), 32, {"stride": 16}, 128),
    ("2-D 128x128, 16x16 stride 16", (128, 128), 16, {"stride": 16}, 128),
    ("2-D 128x128, 31x31, D=64", (128, 128), 31, {}, 64),
]
BATCH, HEADS = 1, 16


def attended_pairs(problem) -> int:
    """Exact attended (query, key) pairs: the pattern is an AND over axes, so pairs factor."""
    pairs = 1
    for axis in problem.axes:
        i = torch.arange(axis.length)
        _, lo, hi = key_range(axis, problem.pattern, i)
        pairs *= int((hi - lo).sum())
    return pairs * problem.batch


def bench(fn, grad_to_none=None) -> float:
    return do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median")


# ---- FlexAttention: one mask_mod for every problem (parameters in a device tensor, rank 3), so
# torch.compile traces it once per token count instead of once per problem.
FLEX_PARAMS = None


def flex_mask_mod(b, h, q_idx, kv_idx):
    P = FLEX_PARAMS
    ok = None
    qrest, krest = q_idx, kv_idx
    for a in (2, 1, 0):
        L, K, S, Dl, C = P[a, 0], P[a, 1], P[a, 2], P[a, 3], P[a, 4]
        i, j = qrest % L, krest % L
        qrest, krest = qrest // L, krest // L
        g = i % Dl
        x, y = i // Dl, j // Dl
        Lg = (L - g + Dl - 1) // Dl
        leader = torch.minimum((x // S) * S + S // 2, Lg - 1)
        start = torch.minimum(torch.clamp(leader - K // 2, min=0), Lg - K)
        centred = (y >= start) & (y < start + K)
        leader_c = torch.minimum((x // S) * S + S - 1, Lg - 1)
        causal = (y >= torch.clamp(leader_c - K + 1, min=0)) & (y <= x)
        axis_ok = ((j % Dl) == g) & torch.where(C > 0, causal, centred)
        ok = axis_ok if ok is None else ok & axis_ok
    return ok


def set_flex_params(problem, device):
    global FLEX_PARAMS
    rows = [[1, 1, 1, 1, 0]] * (3 - problem.rank)
    rows += [[a.length, a.window, a.stride, a.dilation, int(a.causal)] for a in problem.axes]
    values = torch.tensor(rows, dtype=torch.int64, device=device)
    if FLEX_PARAMS is None:
        FLEX_PARAMS = values
    else:
        FLEX_PARAMS.copy_(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tune", action="store_true", help="time every tuning candidate (forward)")
    parser.add_argument("--no-flex", action="store_true")
    parser.add_argument("--flex-backward-budget", type=float, default=150.0,
                        help="seconds of the run after which Flex backward is skipped (its compile is slow)")
    parser.add_argument("--only", default="", help="comma list of problem indices")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    block_mask_fn = torch.compile(create_block_mask, dynamic=False)
    from haloattn.backends.triton import launch, tiles

    device = torch.device("cuda")
    dtype = torch.bfloat16
    began = time.time()
    dense_cache = {}
    rows = []
    only = {int(i) for i in args.only.split(",") if i}
    for index, (name, spatial, window, options, D) in enumerate(PROBLEMS):
        if only and index not in only:
            continue
        torch.manual_seed(index)
        q, k, v = (torch.randn(BATCH, *spatial, HEADS, D, device=device, dtype=dtype) for _ in range(3))
        problem = build_problem(q, k, v, window, **options)
        N = problem.tokens
        pairs = attended_pairs(problem)
        fwd_flops = 4 * BATCH * HEADS * D * pairs
        row = {"problem": name, "tokens": N, "pairs_per_query": pairs / N, "head_dim": D}

        # dense cuDNN over the same tokens (cached per N, D)
        if (N, D) not in dense_cache:
            dq, dk, dv = (torch.randn(BATCH, HEADS, N, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
            dgo = torch.randn(BATCH, HEADS, N, D, device=device, dtype=dtype)
            dense_flops = 4 * BATCH * HEADS * D * N * N
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                t_f = bench(lambda: F.scaled_dot_product_attention(dq, dk, dv))
                t_b = bench(lambda: F.scaled_dot_product_attention(dq, dk, dv).backward(dgo), [dq, dk, dv])
            dense_cache[(N, D)] = (dense_flops / t_f / 1e9, 3.5 * dense_flops / t_b / 1e9, t_f, t_b)
            del dq, dk, dv, dgo
        dense_fwd, dense_fb, _, _ = dense_cache[(N, D)]
        row.update(dense_fwd_tflops=dense_fwd, dense_fwdbwd_tflops=dense_fb)

        # haloattn triton
        out = haloattn.attention(q, k, v, window, backend="triton", **options)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out2 = haloattn.attention(q, k, v, window, backend="triton", **options)
        torch.cuda.synchronize()
        lse_bytes = out2.numel() // D * 4
        row["fwd_extra_bytes"] = torch.cuda.max_memory_allocated() - base - out2.numel() * out2.element_size() - lse_bytes
        del out2
        t_f = bench(lambda: haloattn.attention(q, k, v, window, backend="triton", **options))
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
        go = torch.randn_like(out)

        def fwd_bwd():
            haloattn.attention(qg, kg, vg, window, backend="triton", **options).backward(go)

        t_b = bench(fwd_bwd, [qg, kg, vg])
        ours_f, ours_b = fwd_flops / t_f / 1e9, 3.5 * fwd_flops / t_b / 1e9
        row.update(triton_fwd_ms=t_f, triton_fwdbwd_ms=t_b, triton_fwd_tflops=ours_f, triton_fwdbwd_tflops=ours_b,
                   fwd_efficiency=ours_f / dense_fwd, fwdbwd_efficiency=ours_b / dense_fb)

        if args.tune:
            timings = {}
            for cfg in tiles.candidate_configs(problem):
                key = json.dumps(cfg["fwd"], sort_keys=True)
                if key in timings:
                    continue
                timings[key] = bench(lambda: launch.forward(problem, haloattn.backend.AttentionInputs(q, k, v), cfg))
            default_key = json.dumps(tiles.default_config(problem)["fwd"], sort_keys=True)
            best_key = min(timings, key=timings.get)
            row.update(tune_default_over_best=timings[default_key] / timings[best_key], tune_best=json.loads(best_key),
                       tune_ms=timings)

        if not args.no_flex:
            set_flex_params(problem, device)
            fq, fk, fv = (t.flatten(1, -3).transpose(1, 2) for t in (q, k, v))  # [B, H, N, D] views
            block_mask = block_mask_fn(flex_mask_mod, BATCH, 1, N, N, device=device)
            f_out = flex(fq, fk, fv, block_mask=block_mask)
            row["flex_vs_triton_rel_error"] = ((f_out.transpose(1, 2).reshape(out.shape).float() - out.float()).norm()
                                               / out.float().norm()).item()
            t_ff = bench(lambda: flex(fq, fk, fv, block_mask=block_mask))
            row.update(flex_fwd_ms=t_ff, flex_fwd_tflops=fwd_flops / t_ff / 1e9, speedup_fwd_vs_flex=t_ff / t_f)
            if time.time() - began < args.flex_backward_budget:
                fqg, fkg, fvg = (t.detach().clone().requires_grad_(True) for t in (fq, fk, fv))
                fgo = torch.randn_like(f_out)
                t_fb = bench(lambda: flex(fqg, fkg, fvg, block_mask=block_mask).backward(fgo), [fqg, fkg, fvg])
                row.update(flex_fwdbwd_ms=t_fb, flex_fwdbwd_tflops=3.5 * fwd_flops / t_fb / 1e9,
                           speedup_fwdbwd_vs_flex=t_fb / t_b)
            del block_mask, f_out
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, qg, kg, vg, out, go
        torch.cuda.empty_cache()

    header = ("| problem | pairs/query | triton fwd TFLOP/s | eff fwd | triton fwd+bwd TFLOP/s | eff fwd+bwd "
              "| cuDNN dense fwd / fwd+bwd TFLOP/s | Flex fwd TFLOP/s | x Flex fwd | Flex fwd+bwd TFLOP/s | x Flex fwd+bwd "
              "| fwd extra memory | default/tuned fwd |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]

    def fmt(v, spec=".0f"):
        return "-" if v is None else format(v, spec)

    for r in rows:
        lines.append(
            f"| {r['problem']} | {r['pairs_per_query']:.0f} | {r['triton_fwd_tflops']:.0f} | {r['fwd_efficiency']:.2f} "
            f"| {r['triton_fwdbwd_tflops']:.0f} | {r['fwdbwd_efficiency']:.2f} "
            f"| {r['dense_fwd_tflops']:.0f} / {r['dense_fwdbwd_tflops']:.0f} | {fmt(r.get('flex_fwd_tflops'))} "
            f"| {fmt(r.get('speedup_fwd_vs_flex'), '.1f')} | {fmt(r.get('flex_fwdbwd_tflops'))} "
            f"| {fmt(r.get('speedup_fwdbwd_vs_flex'), '.1f')} | {r['fwd_extra_bytes'] / 2**20:.1f} MiB "
            f"| {fmt(r.get('tune_default_over_best'), '.2f')} |"
        )
    table = "\n".join(lines)
    print(table)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "seconds": time.time() - began}
    print(json.dumps(meta))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
