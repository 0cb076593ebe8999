"""Swin window attention, side by side on one GPU: haloattn (backend triton_window, windows read in
place from the [B, H, W, 3, heads, D] projection) against the attention core Swin runs on windows
already partitioned to [B * nW, heads, N, D]:

* ``sdpa``: ``F.scaled_dot_product_attention`` given Swin's bias (+ shift mask) as ``attn_mask``,
  in several layouts and with its backend chosen by PyTorch or forced (see ``sdpa_layouts``):
  - ``timm``: what timm's fused path passes: the contiguous ``[1, heads, N, N]`` bias for shift 0
    (SDPA pads a copy of that small tensor on every call), bias + mask as one contiguous
    ``[B*nW, heads, N, N]`` tensor for a shift (its rows, 49 elements apart for 7x7 windows, make
    SDPA pad a copy of the whole tensor on every call: the memory-efficient kernel wants every
    stride but the last 8-aligned);
  - ``dense`` (shift 0): what this benchmark used to pass, the bias ``expand``-ed to
    ``[B*nW, heads, N, N]`` (stride 0), which SDPA pads into a full-size copy on every call;
  - ``aligned``: the friendliest layout: the same values in a buffer whose last dimension is
    padded to a multiple of 16 and sliced back to N (``[1, heads, N, N]`` for shift 0,
    ``[B*nW, heads, N, N]`` for a shift), so SDPA uses it in place;
  - ``win-heads`` (shifts only): windows folded into heads, q/k/v viewed as ``[B, nW*heads, N, D]``
    and the aligned mask ``[1, nW*heads, N, N]`` broadcast over the batch (B times smaller);
  the ``/auto``, ``/efficient``, ``/cudnn`` suffix says how the backend was chosen (auto: PyTorch's
  choice, named in the variants table). "sdpa old" is the layout of earlier runs (dense/auto for
  shift 0, timm/auto for a shift); "sdpa best" the fastest variant that ran: ratios use it.
* ``eager``: timm-style ``q * scale @ k^T + bias + mask, softmax, @ v``.

Baselines get their partitioned inputs and their masks for free (not timed): the comparison is
attention against attention. Times are ``triton.testing.do_bench`` medians, host time included;
with ``--cudagraph`` medians of CUDA-graph replays, device time alone, forward and forward+backward
alike (a call whose capture fails is timed with do_bench and marked ``*``, with a footnote saying
why; the JSON gives each figure's method under "<figure> timing"). Forward+backward is the forward
and ``torch.autograd.grad`` of every input: q, k, v and, for the baselines, their masks, which
require grad (Swin's bias trains), as haloattn's rpb table does.

``--sweep`` times haloattn's window kernels over launch configs (windows per program, warps,
pipeline stages) on the Swin-T stage 1 rows, through the backend's ``config`` argument.
``--check`` (CPU, Triton interpreter) checks the mask layouts and that a config reaches the launch.

    python benchmarks/bench_window.py [--quick] [--cudagraph] [--markdown FILE] [--json FILE]
    python benchmarks/bench_window.py --sweep [--markdown FILE] [--json FILE]
    TRITON_INTERPRET=1 python benchmarks/bench_window.py --check
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import time
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

if "--check" in sys.argv and not torch.cuda.is_available():
    # The interpreter must be chosen before the kernels are first imported (tests do the same).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402

import haloattn  # noqa: E402
import haloattn.nn  # noqa: E402
from haloattn.backend import AttentionInputs  # noqa: E402
from haloattn.dispatch import DISPATCHER  # noqa: E402
from haloattn.problem import build_problem  # noqa: E402

from gradient_calls import forward_backward  # noqa: E402

# name: (batch, grid, window, heads, head_dim)
SWIN_T = "Swin-T stage 1"
SHAPES = {
    SWIN_T: (128, (56, 56), 7, 3, 32),
    "Swin-B 384 stage 1": (32, (96, 96), 12, 4, 32),
    "SwinIR 8x8, head_dim 30": (16, (64, 64), 8, 6, 30),
    "Swin V2 16x16": (32, (64, 64), 16, 4, 32),
}

DEVICE = "cuda"

# SDPA's memory-efficient kernel pads (copies) a mask unless every stride but the last is a multiple
# of 8 elements, and pads its mask gradient's last dimension to 16: 16 suits both.
MASK_ALIGN = 16
SDPA_BACKENDS = {"auto": None, "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


# ---------------------------------------------------------------------------------------------
# Swin's bias and mask, and the layouts SDPA gets them in.

def swin_mask(grid, window, shift, device):
    """Swin's [nW, N, N] 0/-100 region mask on the rolled grid (timm's get_attn_mask)."""
    height, width = grid
    labels = torch.zeros(height, width, device=device)
    count = 0
    for hs in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
        for ws in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
            labels[hs, ws] = count
            count += 1
    windows = labels.view(height // window, window, width // window, window).permute(0, 2, 1, 3).reshape(-1, window * window)
    diff = windows[:, None, :] - windows[:, :, None]
    return torch.where(diff != 0, -100.0, 0.0)


def swin_bias(table, window):
    """Swin's [heads, N, N] relative position bias from its table (timm's _get_rel_pos_bias, without
    its .contiguous(): a permuted view)."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
    index = (rel[..., 0] * (2 * window - 1) + rel[..., 1]).to(table.device)
    return table[index.view(-1)].view(window * window, window * window, -1).permute(2, 0, 1)


def partition(x, window):
    """[B, H, W, heads, D] -> [B * nW, heads, N, D] (roll not needed: timing inputs are random)."""
    b, h, w, heads, d = x.shape
    x = x.view(b, h // window, window, w // window, window, heads, d).permute(0, 1, 3, 5, 2, 4, 6)
    return x.reshape(-1, heads, window * window, d).contiguous()


def aligned(t, align=MASK_ALIGN):
    """``t``'s values in a zeroed buffer whose last dimension is padded to a multiple of ``align``,
    sliced back to ``t``'s shape: every stride but the last is then a multiple of ``align``."""
    n = t.shape[-1]
    buffer = t.new_zeros(*t.shape[:-1], -(-n // align) * align)
    buffer[..., :n] = t
    return buffer[..., :n]


def dense_mask(bias, mask, batch, n_windows):
    """The mask this benchmark handed SDPA before (and eager still gets): bias [1, heads, N, N]
    expanded to [B*nW, heads, N, N] (stride 0) for shift 0 (mask None); bias + mask as one
    contiguous [B*nW, heads, N, N] tensor for a shift (what timm builds)."""
    if mask is None:
        return bias.expand(batch * n_windows, -1, -1, -1)
    heads, n = bias.shape[1], bias.shape[-1]
    full = (bias.unsqueeze(1) + mask[None, :, None]).expand(batch, -1, -1, -1, -1)
    return full.reshape(-1, heads, n, n).contiguous()


class Layout(NamedTuple):
    name: str
    mask: torch.Tensor  # broadcastable to the scores of q/k/v in this layout
    windows_in_heads: bool  # q/k/v (and the output) viewed as [B, nW*heads, N, D]


def sdpa_layouts(bias, mask, batch, n_windows):
    """Every way this benchmark hands SDPA Swin's bias [1, heads, N, N] (+ mask [nW, N, N] when
    shifted); each is equal, broadcast to [B*nW, heads, N, N], to the dense one (see --check)."""
    heads, n = bias.shape[1], bias.shape[-1]
    if mask is None:
        return [
            Layout("dense", dense_mask(bias, None, batch, n_windows), False),
            Layout("timm", bias.contiguous(), False),
            Layout("aligned", aligned(bias), False),
        ]
    dense = dense_mask(bias, mask, batch, n_windows)
    per_window = (bias + mask[:, None]).reshape(1, n_windows * heads, n, n)  # [1, nW*heads, N, N]
    return [
        Layout("timm", dense, False),  # = the old dense layout
        Layout("aligned", aligned(dense), False),
        Layout("win-heads", aligned(per_window), True),
    ]


def as_dense(layout, batch, n_windows, heads):
    """The layout's mask broadcast to [B*nW, heads, N, N] (for checks)."""
    n = layout.mask.shape[-1]
    if layout.windows_in_heads:
        return layout.mask.expand(batch, n_windows * heads, n, n).reshape(batch * n_windows, heads, n, n)
    return layout.mask.expand(batch * n_windows, heads, n, n)


def describe(t):
    return f"{list(t.shape)} strides {list(t.stride())}"


# ---------------------------------------------------------------------------------------------
# Timing.

def eager_core(q, k, v, attn_mask, scale):
    attn = (q * scale) @ k.transpose(-2, -1) + attn_mask
    return attn.softmax(-1) @ v


# With --cudagraph, every call (forward, and forward+backward) is timed as CUDA-graph replays: device
# time alone. A short call's host side (argument checks, dispatch, Triton's launcher, autograd's
# engine: 0.1-0.3 ms on the H100's host) can exceed its kernels, and do_bench's events then time
# the host, not the kernels; a graph-timed forward against a do_bench-timed backward would mix both.
CUDAGRAPH = False
GRAPH, DO_BENCH = "cuda graph", "do_bench"  # the timing methods, as the JSON names them


def bench(fn):
    """(median milliseconds, timing method, why the CUDA graph failed or None).

    A call that cannot be captured (an SDPA backend, say) is timed with do_bench instead and the
    failure is returned and printed, so that its figure is marked, never mixed in silently."""
    if not CUDAGRAPH:
        return do_bench(fn, warmup=25, rep=200, return_mode="median"), DO_BENCH, None
    try:
        # do_bench_cudagraph's side stream does not wait for the stream the inputs were made on.
        torch.cuda.synchronize()
        # It calls fn 6 times on a side stream before capturing (a warm-up and 5 to size the graph):
        # the side-stream warm-up PyTorch's CUDA-graph docs ask for before capturing a backward.
        return do_bench_cudagraph(fn, rep=100, return_mode="median"), GRAPH, None
    except Exception as exc:  # whatever broke the capture: the fallback below says what it was
        failure = capture_failure(exc)
    print(f"    CUDA-graph capture failed, timed with do_bench instead: {failure}", flush=True)
    torch.cuda.synchronize()  # the warm-up left on the side stream would run into do_bench's timing
    return do_bench(fn, warmup=25, rep=200, return_mode="median"), DO_BENCH, failure


def capture_failure(exc):
    """One line on why a capture failed. An error inside ``torch.cuda.graph`` makes its exit end the
    capture, which raises again ("operation failed due to a previous error during capture"): the
    first error, at the end of the chain of contexts, is the one that says what was not capturable."""
    first = exc
    while first.__context__ is not None:
        first = first.__context__
    text = " ".join(f"{type(first).__name__}: {first}".split())
    return text[:200] + "..." if len(text) > 200 else text


def store(figures, key, timed):
    """Put a bench() result in ``figures``: the milliseconds under ``key``, the method under
    ``key timing`` and, when the CUDA graph failed, why under ``key graph failure``."""
    ms, method, failure = timed
    figures[key], figures[f"{key} timing"] = ms, method
    if failure is not None:
        figures[f"{key} graph failure"] = failure


def copy_figure(figures, key, source, source_key):
    """A stored figure, its method and its failure (if any), under another key."""
    for suffix in ("", " timing", " graph failure"):
        if source_key + suffix in source:
            figures[key + suffix] = source[source_key + suffix]


def forced(backend):
    return contextlib.nullcontext() if backend is None else sdpa_kernel([backend])


def sdpa_choice(q, k, v, mask, scale):
    """The SDPA backend PyTorch picks for these tensors (auto), by name; "?" if it will not say."""
    try:
        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, False, scale=scale)
    except Exception:  # a private function: its signature may change
        return "?"
    names = {int(member.value): name for name, member in SDPBackend.__members__.items()}
    return names.get(int(choice), str(choice)).lower().replace("_attention", "")


def unsupported_reason(fn, backend):
    """None if ``fn`` runs under ``backend``; else why not (SDPA's warnings, then its error)."""
    with forced(backend), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            return None
        except RuntimeError as exc:
            lines = [str(w.message) for w in caught if not str(w.message).rstrip().endswith("because:")]
            text = " ".join(" ".join(lines + [str(exc)]).split())
            return "unsupported: " + (text[:160] + "..." if len(text) > 160 else text)


def time_sdpa(variant, kind, fn, backend):
    """Time ``fn`` under a forced backend (None: auto) into ``variant[kind]`` (see store); if the
    backend cannot run it, ``variant[kind]`` is None and ``variant[kind + " note"]`` says why."""
    reason = unsupported_reason(fn, backend)
    if reason is not None:
        variant[kind], variant[f"{kind} note"] = None, reason
        return
    with forced(backend):
        store(variant, kind, bench(fn))


def run_shape(name, batch, grid, window, heads, head_dim, shift, dtype, quick):
    device = DEVICE
    n = window * window
    qkv = torch.randn(batch, *grid, 3, heads, head_dim, device=device, dtype=dtype)
    table = torch.randn((2 * window - 1) ** 2, heads, device=device) * 0.02
    rpb = haloattn.nn.swin_table_to_rpb(table, (window, window)).contiguous()
    scale = head_dim ** -0.5
    q, k, v = qkv.unbind(-3)
    qw, kw, vw = (partition(t, window) for t in (q, k, v))
    n_windows = (grid[0] // window) * (grid[1] // window)
    bias = swin_bias(table, window).unsqueeze(0).to(dtype)  # [1, heads, N, N]
    mask = swin_mask(grid, window, shift, device).to(dtype) if shift else None
    layouts = sdpa_layouts(bias, mask, batch, n_windows)
    eager_mask = dense_mask(bias, mask, batch, n_windows)
    folded = (batch, n_windows * heads, n, -1)  # q/k/v of the win-heads layout

    def halo():
        return haloattn.attention(q, k, v, window, pattern="window", shift=shift, scale=scale, rpb=rpb)

    def eager():
        return eager_core(qw, kw, vw, eager_mask, scale)

    result = {"shape": name, "shift": shift, "dtype": str(dtype).replace("torch.", ""), "variants": []}
    store(result, "halo fwd", bench(halo))
    store(result, "eager fwd", bench(eager))
    train = not quick and dtype != torch.float32
    if train:
        # Separate q/k/v leaves, as the baselines get: attention against attention.
        halo_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        rpb_leaf = rpb.clone().requires_grad_(True)
        grad = torch.randn(batch, *grid, heads, head_dim, device=device, dtype=dtype)

        def halo_forward():
            return haloattn.attention(*halo_leaves, window, pattern="window", shift=shift, scale=scale, rpb=rpb_leaf)

        eager_leaves = [t.clone().requires_grad_(True) for t in (qw, kw, vw)]
        eager_leaf = eager_mask.clone().requires_grad_(True)
        grad_w = partition(grad, window)

        def eager_forward():
            return eager_core(*eager_leaves, eager_leaf, scale)

        store(result, "halo fwd+bwd", bench(forward_backward(halo_forward, halo_leaves + [rpb_leaf], grad)))
        store(result, "eager fwd+bwd", bench(forward_backward(eager_forward, eager_leaves + [eager_leaf], grad_w)))

    for layout in layouts:
        shape = folded if layout.windows_in_heads else qw.shape
        fq, fk, fv = (t.view(shape) for t in (qw, kw, vw))
        leaves = mask_leaf = grad_f = None
        if train:
            leaves = [t.view(shape).clone().requires_grad_(True) for t in (qw, kw, vw)]
            grad_f = grad_w.view(shape)
            # The mask as a leaf with the layout's strides (detach keeps them, clone would not for
            # the aligned ones); the old dense layout was cloned (contiguous), and is kept so.
            mask_leaf = (layout.mask.clone() if layout.name == "dense" else layout.mask.detach()).requires_grad_(True)
        for backend_name, backend in SDPA_BACKENDS.items():
            if layout.name == "dense" and backend is not None:
                continue  # the old layout: kept for comparison with earlier runs only
            variant = {"variant": f"{layout.name}/{backend_name}", "mask": describe(layout.mask)}
            if backend is None:
                picks = [sdpa_choice(fq, fk, fv, layout.mask, scale)]
                if train:  # the choice can differ when a backward is needed
                    picks.append(sdpa_choice(*leaves, mask_leaf, scale))
                variant["auto picks"] = " / ".join(dict.fromkeys(picks))

            def fwd(mask=layout.mask, fq=fq, fk=fk, fv=fv):
                return F.scaled_dot_product_attention(fq, fk, fv, attn_mask=mask, scale=scale)

            time_sdpa(variant, "fwd", fwd, backend)
            if train:
                def train_forward(mask=mask_leaf, leaves=leaves):
                    return F.scaled_dot_product_attention(*leaves, attn_mask=mask, scale=scale)

                fwd_bwd = forward_backward(train_forward, leaves + [mask_leaf], grad_f)
                time_sdpa(variant, "fwd+bwd", fwd_bwd, backend)
            result["variants"].append(variant)
            print("    " + format_variant(result, variant), flush=True)
    summarize_sdpa(result, shift)
    print(format_row(result), flush=True)
    return result


def summarize_sdpa(result, shift):
    """The figures of the layout earlier runs used ("old": dense/auto for shift 0, timm/auto, the
    same dense tensor, for a shift), for comparison with them, and the best variant's."""
    old = "dense/auto" if shift == 0 else "timm/auto"
    for kind in ("fwd", "fwd+bwd"):
        timed = [v for v in result["variants"] if v.get(kind) is not None]
        for v in timed:
            if v["variant"] == old:
                copy_figure(result, f"sdpa old {kind}", v, kind)
        if timed:
            # A do_bench fallback (marked) competes too: its host time can only make it lose.
            best = min(timed, key=lambda v: v[kind])
            copy_figure(result, f"sdpa best {kind}", best, kind)
            result[f"sdpa best {kind} variant"] = best["variant"]


# ---------------------------------------------------------------------------------------------
# Tables.

# "sdpa old": the layout of earlier runs (see summarize_sdpa); "sdpa best": the fastest variant.
COLUMNS = ["halo fwd", "sdpa old fwd", "sdpa best fwd", "eager fwd",
           "halo fwd+bwd", "sdpa old fwd+bwd", "sdpa best fwd+bwd", "eager fwd+bwd"]
RATIOS = [("fwd vs best sdpa", "sdpa best fwd", "halo fwd"), ("fwd vs old sdpa", "sdpa old fwd", "halo fwd"),
          ("fwd vs eager", "eager fwd", "halo fwd"), ("fwd+bwd vs best sdpa", "sdpa best fwd+bwd", "halo fwd+bwd"),
          ("fwd+bwd vs eager", "eager fwd+bwd", "halo fwd+bwd")]


def format_header():
    names = [c + " (ms)" for c in COLUMNS] + [r[0] for r in RATIOS] + ["best sdpa fwd / fwd+bwd"]
    return "| shape | shift | dtype | " + " | ".join(names) + " |\n|" + "---|" * (len(names) + 3)


# Figures timed with do_bench because their CUDA graph failed (with --cudagraph) carry this mark,
# and so does a ratio with such a figure on either side; timing_notes() lists why.
FALLBACK_MARK = "*"


def _mark(figures, *keys):
    return FALLBACK_MARK if any(f"{key} graph failure" in figures for key in keys) else ""


def _ms(figures, key):
    return f"{figures[key]:.3f}{_mark(figures, key)}"


def _ratio(row, base, ours):
    if base not in row or ours not in row:
        return "-"
    return f"{row[base] / row[ours]:.2f}x{_mark(row, base, ours)}"


def format_row(row):
    cells = [row["shape"], str(row["shift"]), row["dtype"]]
    cells += [_ms(row, c) if c in row else "-" for c in COLUMNS]
    cells += [_ratio(row, base, ours) for _, base, ours in RATIOS]
    cells.append(f"{row.get('sdpa best fwd variant', '-')} / {row.get('sdpa best fwd+bwd variant', '-')}")
    return "| " + " | ".join(cells) + " |"


VARIANT_HEADER = ("| shape | shift | dtype | sdpa variant | auto picks | fwd (ms) | fwd+bwd (ms) | mask |\n"
                  "|---|---|---|---|---|---|---|---|")


def _time_cell(variant, kind):
    if variant.get(kind) is not None:
        return _ms(variant, kind)
    return variant.get(f"{kind} note") or "-"


def format_variant(row, variant):
    cells = [row["shape"], str(row["shift"]), row["dtype"], variant["variant"], variant.get("auto picks", ""),
             _time_cell(variant, "fwd"), _time_cell(variant, "fwd+bwd"), variant["mask"]]
    return "| " + " | ".join(cells) + " |"


def timing_legend():
    """How the figures were timed: the line above the tables."""
    if not CUDAGRAPH:
        return ("Times: medians of `triton.testing.do_bench`, host time included (`--cudagraph`: device "
                "time). Forward+backward: `torch.autograd.grad` of every input (q, k, v, bias/mask or rpb).")
    return ("Times: medians of CUDA-graph replays (`--cudagraph`), device time alone, forward and "
            "forward+backward alike (`torch.autograd.grad` of every input: q, k, v, bias/mask or rpb); "
            f"`{FALLBACK_MARK}`: timed with `do_bench` instead, host time included, as its CUDA graph "
            "failed (see below); a ratio is marked if either of its figures is.")


def timing_notes(rows):
    """The footnote list: each figure timed with do_bench because its CUDA graph failed, and why
    ("" when none did). Figures of "sdpa old/best" are copies of variants' and listed as those."""
    notes = []
    for row in rows:
        where = f"{row['shape']}, shift {row['shift']}, {row['dtype']}"
        for key in ("halo fwd", "eager fwd", "halo fwd+bwd", "eager fwd+bwd"):
            if f"{key} graph failure" in row:
                notes.append(f"- {where}, {key}: {row[key + ' graph failure']}")
        for v in row["variants"]:
            for kind in ("fwd", "fwd+bwd"):
                if f"{kind} graph failure" in v:
                    notes.append(f"- {where}, sdpa {v['variant']} {kind}: {v[kind + ' graph failure']}")
    if not notes:
        return ""
    return f"\n`{FALLBACK_MARK}` timed with `do_bench`, their CUDA graph having failed:\n\n" + "\n".join(notes) + "\n"


def write_outputs(args, markdown, data):
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)


def run_bench(args):
    print(timing_legend() + "\n", flush=True)
    print(format_header(), flush=True)
    rows = []
    for name, (batch, grid, window, heads, head_dim) in SHAPES.items():
        if args.quick and name != SWIN_T:
            continue
        dtypes = [torch.float16, torch.float32] if name == SWIN_T else [torch.float16]
        for dtype in dtypes:
            for shift in (0, window // 2):
                rows.append(run_shape(name, batch, grid, window, heads, head_dim, shift, dtype, args.quick))
    variants = "\n".join(format_variant(r, v) for r in rows for v in r["variants"])
    markdown = (timing_legend() + "\n\n" + format_header() + "\n" + "\n".join(format_row(r) for r in rows) + "\n\n"
                + VARIANT_HEADER + "\n" + variants + "\n" + timing_notes(rows))
    print("\n" + markdown, flush=True)
    write_outputs(args, markdown, rows)


# ---------------------------------------------------------------------------------------------
# --sweep: launch configs of the window kernels.

# Each point is a CUDA-graph capture and replay (~0.3 s): 19 points a row keep the six rows near
# a minute on an H100.
SWEEP_WINDOWS_PER_PROGRAM = (2, 8)  # and the heuristic's own choice
SWEEP_WARPS = (4, 8)
SWEEP_STAGES = (1, 2, 3)
# (dtype, shift, kind): forward sweeps forward_* keys; forward+backward sweeps backward_* keys
# (the forward keeps its default: the forward rows tune it).
SWEEP_ROWS = [
    (torch.float16, 0, "forward"), (torch.float16, 3, "forward"),
    (torch.float32, 0, "forward"), (torch.float32, 3, "forward"),
    (torch.float16, 0, "backward"), (torch.float16, 3, "backward"),
]
NEEDS_GRAD = (True, True, True, True, False, False, False)  # q, k, v, rpb


def window_problem(batch, grid, window, heads, head_dim, shift, dtype, device):
    """The Problem, inputs and output gradient haloattn.attention would hand triton_window."""
    q, k, v = torch.randn(batch, *grid, 3, heads, head_dim, device=device, dtype=dtype).unbind(-3)
    table = torch.randn((2 * window - 1) ** 2, heads, device=device) * 0.02
    rpb = haloattn.nn.swin_table_to_rpb(table, (window, window)).contiguous()
    problem = build_problem(q, k, v, window, pattern="window", shift=shift, scale=head_dim ** -0.5, rpb=rpb)
    grad = torch.randn_like(q)
    return problem, AttentionInputs(q, k, v, rpb), grad


def window_backend(problem):
    backend = DISPATCHER.get("triton_window")
    reasons = DISPATCHER.verdict(backend, problem).reasons
    if reasons:
        raise RuntimeError(f"triton_window cannot run {problem.describe()}: {reasons}")
    return backend


def default_launch(kind, problem, device):
    """What window_launch picks without a config: {windows_per_program, num_stages, num_warps,
    reload_bias}."""
    from haloattn.backends.triton import window_launch

    launch = window_launch.plan(problem)
    return window_launch._launch_config(kind, launch, problem, device, None, 1, problem.dtype.itemsize)


def sweep_configs(kind, default):
    """None (the default) first, then every grid point as a ``{kind}_...`` config dict."""
    per_program = sorted({default["windows_per_program"], *SWEEP_WINDOWS_PER_PROGRAM})
    configs = [None]
    for wpp, warps, stages in itertools.product(per_program, SWEEP_WARPS, SWEEP_STAGES):
        configs.append({f"{kind}_windows_per_program": wpp, f"{kind}_num_warps": warps,
                        f"{kind}_num_stages": stages, f"{kind}_reload_bias": default["reload_bias"]})
    if kind == "forward":
        # The other way of holding the bias tile (registers or reloaded per window), at the
        # default's windows per program.
        for warps, stages in itertools.product(SWEEP_WARPS, SWEEP_STAGES):
            configs.append({"forward_windows_per_program": default["windows_per_program"],
                            "forward_num_warps": warps, "forward_num_stages": stages,
                            "forward_reload_bias": not default["reload_bias"]})
    return configs


def step(backend, problem, inputs, grad, kind, config):
    """One timed call: the forward, or forward then backward (rpb gradient included)."""
    if kind == "forward":
        return lambda: backend.forward(problem, inputs, config)[0]

    def forward_backward():
        out, lse = backend.forward(problem, inputs, config)
        return backend.backward(problem, inputs, out, lse, grad, None, NEEDS_GRAD, config)[:4]
    return forward_backward


def relative_error(got, want):
    """Largest |got - want| over the outputs, relative to the largest |want| of each."""
    got, want = (x if isinstance(x, (list, tuple)) else [x] for x in (got, want))
    return max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()
               for a, b in zip(got, want))


LABEL_KEYS = ("windows_per_program", "num_warps", "num_stages", "reload_bias")


def config_label(config, kind, default):
    values = default if config is None else {key: config[f"{kind}_{key}"] for key in LABEL_KEYS}
    return tuple(values[key] for key in LABEL_KEYS)


def sweep_row(dtype, shift, kind):
    batch, grid, window, heads, head_dim = SHAPES[SWIN_T]
    problem, inputs, grad = window_problem(batch, grid, window, heads, head_dim, shift, dtype, DEVICE)
    backend = window_backend(problem)
    default = default_launch(kind, problem, inputs.query.device)
    tolerance = 2e-2 if dtype != torch.float32 else 1e-4  # warps change the summation order
    reference = step(backend, problem, inputs, grad, kind, None)()
    trials = []
    for config in sweep_configs(kind, default):
        trial = dict(zip(LABEL_KEYS, config_label(config, kind, default)), default=config is None)
        fn = step(backend, problem, inputs, grad, kind, config)
        try:
            error = relative_error(fn(), reference)
            trial["check"] = "ok" if error <= tolerance else f"MISMATCH {error:.1e}"
            # Graph replays: the backend's own calls need no autograd, and without a graph the
            # host time of these short calls would be timed instead of the kernels.
            trial["ms"] = do_bench_cudagraph(fn, rep=50, return_mode="median")
        except Exception as exc:  # e.g. out of shared memory for deep pipelines: say so, go on
            trial["check"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        trials.append(trial)
    timed = sorted((t for t in trials if "ms" in t), key=lambda t: t["ms"])
    failed = [t for t in trials if "ms" not in t]
    base = next(t for t in trials if t["default"])
    what = "forward" if kind == "forward" else "forward+backward (backward configs)"
    return {
        "row": f"{SWIN_T}, {str(dtype).replace('torch.', '')}, shift {shift}, {what}",
        "kind": kind, "default": base, "best": timed[0] if timed else None,
        "default/best": base["ms"] / timed[0]["ms"] if timed and "ms" in base else None,
        "trials": timed + failed,
    }


def format_sweep(result):
    base, best = result["default"], result["best"]
    lines = [f"### {result['row']}", ""]
    if best is not None and "ms" in base:
        lines.append(f"default (wpp {base['windows_per_program']}, {base['num_warps']} warps, "
                     f"{base['num_stages']} stages, reload bias {base['reload_bias']}): {base['ms']:.3f} ms; "
                     f"best {best['ms']:.3f} ms; "
                     f"default/best {result['default/best']:.2f}x")
        lines.append("")
    lines += ["| rank | windows/program | warps | stages | reload bias | ms | default/this | check |",
              "|---|---|---|---|---|---|---|---|"]
    for rank, t in enumerate(result["trials"], 1):
        ms = f"{t['ms']:.3f}" if "ms" in t else "-"
        ratio = f"{base['ms'] / t['ms']:.2f}x" if "ms" in t and "ms" in base else "-"
        mark = " (default)" if t["default"] else ""
        lines.append(f"| {rank} | {t['windows_per_program']}{mark} | {t['num_warps']} | {t['num_stages']} | "
                     f"{t['reload_bias']} | {ms} | {ratio} | {t['check']} |")
    return "\n".join(lines) + "\n"


def format_sweep_summary(results):
    lines = ["| row | default (wpp, warps, stages, reload bias) | default ms | best (wpp, warps, stages, reload bias) "
             "| best ms | default/best |",
             "|---|---|---|---|---|---|"]
    for r in results:
        base, best = r["default"], r["best"]
        if best is None or "ms" not in base:
            lines.append(f"| {r['row']} | - | - | - | - | - |")
            continue
        lines.append(f"| {r['row']} | {config_label(None, r['kind'], base)} | {base['ms']:.3f} | "
                     f"{config_label(None, r['kind'], best)} | {best['ms']:.3f} | {r['default/best']:.2f}x |")
    return "\n".join(lines) + "\n"


def _compile_one(task):
    """Worker of precompile(): one launch of one (dtype, kind, warps, stages, reload_bias) on a batch-1 problem
    (sizes and grid are runtime arguments of the kernels: the compiled binary is the same)."""
    dtype_name, kind, warps, stages, reload_bias = task
    try:
        _, grid, window, heads, head_dim = SHAPES[SWIN_T]
        dtype = getattr(torch, dtype_name)
        problem, inputs, grad = window_problem(1, grid, window, heads, head_dim, 3, dtype, DEVICE)
        config = {f"{kind}_num_warps": warps, f"{kind}_num_stages": stages, f"{kind}_reload_bias": reload_bias}
        step(window_backend(problem), problem, inputs, grad, kind, config)()
        return None
    except Exception as exc:  # the sweep itself reports the config's failure
        return f"{task}: {type(exc).__name__}"


def precompile(jobs):
    """Compile every swept kernel variant in ``jobs`` processes at once. Warps and stages are
    compile-time (windows per program is not): 30 variants at 1-6 s each would otherwise take most
    of the sweep's time. The sweep then finds them in Triton's on-disk cache."""
    if jobs <= 1:
        return
    import multiprocessing

    tasks = sorted({(str(dtype).replace("torch.", ""), kind, warps, stages, reload_bias)
                    for dtype, _, kind in SWEEP_ROWS for warps in SWEEP_WARPS for stages in SWEEP_STAGES
                    for reload_bias in ((False, True) if kind == "forward" else (False,))})

    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        failures = [f for f in pool.map(_compile_one, tasks, chunksize=1) if f]
    print(f"precompiled {len(tasks)} kernel variants in {jobs} processes: {time.perf_counter() - start:.0f} s"
          + (f" ({len(failures)} failed, timed below: {failures[:3]})" if failures else ""), flush=True)


def run_sweep(args):
    start = time.perf_counter()
    precompile(args.jobs)
    results = []
    for dtype, shift, kind in SWEEP_ROWS:
        results.append(sweep_row(dtype, shift, kind))
        print(format_sweep(results[-1]), flush=True)
        print(f"({time.perf_counter() - start:.0f} s so far)", flush=True)
    summary = format_sweep_summary(results)
    print(summary, flush=True)
    markdown = "## Launch-config sweep\n\n" + summary + "\n" + "\n".join(format_sweep(r) for r in results)
    write_outputs(args, markdown, results)


# ---------------------------------------------------------------------------------------------
# --check: what can be checked without a GPU.

@contextlib.contextmanager
def recorded_launches():
    """Record (kernel, grid, NUM_STAGES, num_warps) of every window-kernel launch."""
    from haloattn.backends.triton import fast_launch

    launches, original = [], fast_launch.resolve

    class Recorder:
        def __init__(self, fn):
            self.fn, self.kernel = fn, original(fn)

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                stages = dict(zip(self.fn.arg_names, args), **kwargs)["NUM_STAGES"]
                launches.append((self.fn.__name__, grid, stages, kwargs["num_warps"]))
                return self.kernel[grid](*args, **kwargs)
            return launch

    fast_launch.clear_plans()  # launches through a plan's compiled kernel would not be recorded
    fast_launch.resolve = Recorder
    try:
        yield launches
    finally:
        fast_launch.resolve = original
        fast_launch.clear_plans()


def check_layouts(device):
    # 7x7 windows: 49-token rows, which the aligned layouts pad to 64
    batch, grid, window, heads, head_dim, dtype = 2, (14, 14), 7, 2, 16, torch.float32
    n, n_windows = window * window, 4
    table = torch.randn((2 * window - 1) ** 2, heads, device=device)
    bias = swin_bias(table, window).unsqueeze(0).to(dtype)
    qw, kw, vw = (torch.randn(batch * n_windows, heads, n, head_dim, device=device) for _ in range(3))
    for shift in (0, 3):
        mask = swin_mask(grid, window, shift, device).to(dtype) if shift else None
        reference = dense_mask(bias, mask, batch, n_windows)
        want = eager_core(qw, kw, vw, reference, 0.25)
        for layout in sdpa_layouts(bias, mask, batch, n_windows):
            assert torch.equal(as_dense(layout, batch, n_windows, heads), reference), layout.name
            if layout.name in ("aligned", "win-heads"):
                strides = layout.mask.stride()
                assert strides[-1] == 1 and all(s % MASK_ALIGN == 0 for s in strides[:-1]), (layout.name, strides)
            shape = (batch, n_windows * heads, n, head_dim) if layout.windows_in_heads else qw.shape
            got = F.scaled_dot_product_attention(*(t.view(shape) for t in (qw, kw, vw)), attn_mask=layout.mask,
                                                 scale=0.25)
            torch.testing.assert_close(got.reshape(want.shape), want, atol=1e-4, rtol=1e-4)  # GPU kernels too
            print(f"  shift {shift} {layout.name:<10} mask {describe(layout.mask)}: values and SDPA output match")


def check_configs(device):
    """A config reaches the launch (grid, stages, warps change) and results still match the reference."""
    batch, grid, window, heads, head_dim, shift = 1, (14, 14), 7, 2, 16, 3
    problem, inputs, grad = window_problem(batch, grid, window, heads, head_dim, shift, torch.float32, device)
    backend = window_backend(problem)
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs[:4]]
    want = haloattn.attention(*leaves[:3], window, pattern="window", shift=shift, scale=head_dim ** -0.5,
                              rpb=leaves[3], backend="reference")
    want_grads = torch.autograd.grad(want, leaves, grad)
    config = {"forward_windows_per_program": 1, "forward_num_warps": 2, "forward_num_stages": 3,
              "backward_windows_per_program": 4, "backward_num_warps": 4, "backward_num_stages": 2}
    seen = {}
    for name, cfg in (("default", None), ("config", config)):
        with recorded_launches() as launches:
            out = step(backend, problem, inputs, grad, "forward", cfg)()
            grads = step(backend, problem, inputs, grad, "backward", cfg)()
        torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
        for got, ref in zip(grads, want_grads):
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
        seen[name] = launches
        print(f"  {name}: launches {launches}; output and q/k/v/rpb gradients match the reference")
    assert seen["default"] != seen["config"], "the config did not change the launches"
    forward_launch = [l for l in seen["config"] if l[0] == "window_forward_kernel"][0]
    backward_launch = [l for l in seen["config"] if l[0] == "window_backward_kernel"][-1]
    assert forward_launch[2:] == (3, 2) and backward_launch[2:] == (2, 4), seen["config"]


def run_check():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"mask layouts ({device}):")
    check_layouts(device)
    print(f"launch configs ({device}, TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}):")
    check_configs(device)
    print("check passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="Swin-T stage 1 forward only")
    parser.add_argument("--sweep", action="store_true",
                        help="time launch configs of the window kernels (Swin-T stage 1)")
    parser.add_argument("--check", action="store_true", help="check mask layouts and config passing (CPU is enough)")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="--sweep: processes compiling the kernel variants up front (1: compile as timed)")
    parser.add_argument("--markdown", help="also write the tables to this file")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--cudagraph", action="store_true",
                        help="time forward and forward+backward calls as CUDA-graph replays (device time, "
                             "no host overhead); a call that cannot be captured falls back to do_bench, marked *")
    args = parser.parse_args()
    global CUDAGRAPH
    CUDAGRAPH = args.cudagraph
    if args.check:
        return run_check()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    run_sweep(args) if args.sweep else run_bench(args)


if __name__ == "__main__":
    main()
