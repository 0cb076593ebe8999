"""Problems with score_mod / mask_mod on a GPU: backend triton with the mods compiled into its
kernels (mod_codegen), the flex backend (compiled FlexAttention) and the reference backend, with
backend triton on the same pattern without the mod as the yardstick (what the mods cost).

Times forward and forward+backward through ``haloattn.attention`` (gathers into Flex's token
order and scatters back included), median of triton.testing.do_bench; effective TFLOP/s count
attended pairs only (4 * B * H * D * pairs forward, 2.5x that for the backward), as in
bench_neighborhood.py. The first flex call's wall time (compiling Flex's forward, or forward and
backward) is reported too. Problems with a mask_mod are also timed with backend triton walking
every step (the mask applied per pair, none skipped): what live_steps.py saves; and with the
lists' full flags cleared (mask_mod evaluated on every live step): what skipping the mask on
steps it keeps whole saves.

    python benchmarks/bench_flex_mods.py [--markdown FILE] [--json FILE] [--no-reference]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from unittest import mock

import torch
from triton.testing import do_bench

import haloattn
from gradient_calls import forward_backward
from haloattn.geometry import attended_pairs
from haloattn.problem import build_problem


def alibi(score, b, h, q_idx, kv_idx):
    return score - (h + 1) * 0.01 * (q_idx - kv_idx).abs()


def checker(b, h, q_idx, kv_idx):
    return ((q_idx + kv_idx) % 3) != 0


def padded_image(width, rows, cols):
    """A mask_mod for an image of ``rows`` x ``cols`` padded to a grid ``width`` wide: keys in the
    padding are refused (queries there see nothing and give 0)."""
    def valid(b, h, q_idx, kv_idx):
        return (kv_idx // width < rows) & (kv_idx % width < cols)
    return valid


def gated(score, b, h, q_idx, kv_idx):
    return score * (1.0 + 0.25 * torch.tanh(score))


def packed_documents(length, device, shortest=256, longest=2048, seed=0):
    """A mask_mod for documents of random lengths packed into one sequence: a token sees its own
    document only. Against a window of 2047 most key tiles of a query tile lie in other documents,
    which backend triton skips (live_steps.py) and Flex's block mask leaves out."""
    g = torch.Generator().manual_seed(seed)
    lengths = []
    while sum(lengths) < length:
        lengths.append(int(torch.randint(shortest, longest + 1, (1,), generator=g)))
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[:length].to(device)

    def documents(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]
    return documents


# (name, spatial, window, options, heads, head_dim); mask_mod="documents" is packed_documents.
PROBLEMS = [
    ("2-D 64x64, 13x13, ALiBi-like score_mod", (64, 64), 13, dict(score_mod=alibi), 8, 64),
    ("2-D 128x128, 31x31, checker mask_mod", (128, 128), 31, dict(mask_mod=checker), 16, 128),
    ("3-D 16x32x32, 7x9x9, score_mod + rpb", (16, 32, 32), (7, 9, 9), dict(score_mod=gated, rpb=True), 8, 64),
    ("1-D 8192, window 1023, score_mod + softcap", (8192,), 1023, dict(score_mod=alibi, softcap=30.0), 8, 64),
    ("1-D 32768, window 2047, packed documents of 256-2048 tokens (mask_mod)", (32768,), 2047,
     dict(mask_mod="documents"), 16, 128),
    ("2-D 128x128, 31x31, image of 100x90 padded (mask_mod)", (128, 128), 31,
     dict(mask_mod=padded_image(128, 100, 90)), 16, 128),
]


def make(spatial, window, options, heads, head_dim, requires_grad):
    q, k, v = (torch.randn(1, *spatial, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=requires_grad)
               for _ in range(3))
    kw = dict(options)
    if kw.get("mask_mod") == "documents":
        kw["mask_mod"] = packed_documents(spatial[0], "cuda")
    if kw.pop("rpb", False):
        win = window if isinstance(window, tuple) else (window,) * len(spatial)
        kw["rpb"] = torch.randn(heads, *(2 * w - 1 for w in win), device="cuda", requires_grad=requires_grad)
    return q, k, v, kw


def timed(backend, q, k, v, window, kw, backward):
    def fwd():
        return haloattn.attention(q, k, v, window, backend=backend, **kw)

    if not backward:
        return do_bench(fwd, warmup=5, rep=40, return_mode="median")
    leaves = [t for t in (q, k, v, kw.get("rpb")) if t is not None]
    return do_bench(forward_backward(fwd, leaves, torch.randn_like(fwd())), warmup=5, rep=40, return_mode="median")


@contextlib.contextmanager
def launch_patched(name: str, value):
    """backend triton's ``launch.<name>`` set to ``value``, its launch plans rebuilt on entry and
    exit (plans keep what the module said when they were built)."""
    from haloattn.backends.triton import fast_launch, launch

    fast_launch.clear_plans()
    try:
        with mock.patch.object(launch, name, value):
            yield
    finally:
        fast_launch.clear_plans()


@contextlib.contextmanager
def full_flags_cleared():
    """backend triton's live-step lists with every full flag cleared, so its kernels evaluate
    mask_mod on every live step."""
    from haloattn.backends.triton import live_steps

    compute = live_steps.LiveSteps.compute

    def cleared(self, tensors):
        lists = compute(self, tensors)
        lists[..., 1:] &= ~1
        return lists
    with mock.patch.object(live_steps.LiveSteps, "compute", cleared):
        yield


# The A/B variants of backend triton on problems with a mask_mod: (label, column title, context).
MASK_VARIANTS = [
    # every step of each tile walked, the mask applied per pair (as before live_steps.py)
    ("triton_every_step", "triton walking every step", lambda: launch_patched("live_steps", lambda *args: None)),
    ("triton_without_full_flags", "triton without full flags", full_flags_cleared),
]


def measure(row, with_reference):
    name, spatial, window, options, heads, head_dim = row
    q, k, v, kw = make(spatial, window, options, heads, head_dim, requires_grad=True)
    problem = build_problem(q, k, v, window, **{n: x for n, x in kw.items()})
    flops = 4 * heads * head_dim * attended_pairs(problem.axes, problem.pattern)
    result = {"problem": name, "gflop_fwd": flops / 1e9}
    torch.cuda.synchronize()
    t0 = time.time()
    haloattn.attention(q, k, v, window, backend="flex", **kw).sum().backward()
    torch.cuda.synchronize()
    result["flex_first_call_s"] = time.time() - t0
    plain = {n: x for n, x in kw.items() if n not in ("score_mod", "mask_mod")}
    runs = [("triton", kw), ("flex", kw), ("triton_without_mod", plain)] + ([("reference", kw)] if with_reference else [])
    variants = {label: context for label, _, context in MASK_VARIANTS} if "mask_mod" in kw else {}
    runs += [(label, kw) for label in variants]
    for label, args in runs:
        backend = "triton" if label.startswith("triton") else label
        for backward in (False, True):
            with variants.get(label, contextlib.nullcontext)():
                ms = timed(backend, q, k, v, window, args, backward)
            key = f"{label}_{'fwdbwd' if backward else 'fwd'}"
            result[key + "_ms"] = ms
            result[key + "_tflops"] = flops * (3.5 if backward else 1.0) / ms / 1e9
    return result


def markdown(rows, device):
    lines = [f"Device: {device}; torch {torch.__version__}; bf16, B=1; effective TFLOP/s (attended pairs).", "",
             "| problem | triton fwd ms (TFLOP/s) | triton fwd+bwd ms | flex fwd ms (TFLOP/s) | flex fwd+bwd ms "
             "| triton / flex speed-up fwd, fwd+bwd | triton without the mod fwd, fwd+bwd ms "
             "| reference fwd, fwd+bwd ms | flex first call s |"
             + "".join(f" {title} fwd, fwd+bwd ms |" for _, title, _ in MASK_VARIANTS),
             "|---|---|---|---|---|---|---|---|---|" + "---|" * len(MASK_VARIANTS)]
    for r in rows:
        ref_f, ref_b = r.get("reference_fwd_ms", float("nan")), r.get("reference_fwdbwd_ms", float("nan"))
        speed = f"{r['flex_fwd_ms'] / r['triton_fwd_ms']:.1f}x, {r['flex_fwdbwd_ms'] / r['triton_fwdbwd_ms']:.1f}x"
        lines.append(
            f"| {r['problem']} | {r['triton_fwd_ms']:.3f} ({r['triton_fwd_tflops']:.0f}) | {r['triton_fwdbwd_ms']:.3f} "
            f"| {r['flex_fwd_ms']:.3f} ({r['flex_fwd_tflops']:.0f}) | {r['flex_fwdbwd_ms']:.3f} | {speed} "
            f"| {r['triton_without_mod_fwd_ms']:.3f}, {r['triton_without_mod_fwdbwd_ms']:.3f} "
            f"| {ref_f:.2f}, {ref_b:.2f} | {r['flex_first_call_s']:.1f} |"
            + "".join(f" {r.get(label + '_fwd_ms', float('nan')):.3f}, {r.get(label + '_fwdbwd_ms', float('nan')):.3f} |"
                      for label, _, _ in MASK_VARIANTS))
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown")
    parser.add_argument("--json")
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--only", help="run the problems whose name holds this text")
    args = parser.parse_args()
    rows = []
    for row in PROBLEMS:
        if args.only and args.only not in row[0]:
            continue
        rows.append(measure(row, not args.no_reference))
        print(json.dumps(rows[-1]), flush=True)
    text = markdown(rows, torch.cuda.get_device_name())
    print(text)
    if args.markdown:
        open(args.markdown, "w").write(text)
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
