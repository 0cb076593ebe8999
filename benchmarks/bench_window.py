"""Swin window attention, side by side on one GPU: haloattn (backend triton_window, windows read in
place from the [B, H, W, 3, heads, D] projection) against the attention core Swin runs on windows
already partitioned to [B * nW, heads, N, D]:

* ``sdpa``: ``F.scaled_dot_product_attention`` given Swin's dense bias + shift-mask tensor (timm's
  fused path), float16 / bfloat16;
* ``eager``: timm-style ``q * scale @ k^T + bias + mask, softmax, @ v``.

Baselines get their partitioned inputs and the dense bias+mask for free (not timed): the
comparison is attention against attention. Times are ``triton.testing.do_bench`` medians.

    python benchmarks/bench_window.py [--quick] [--markdown FILE]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import haloattn
import haloattn.nn

# name: (batch, grid, window, heads, head_dim)
SHAPES = {
    "Swin-T stage 1": (128, (56, 56), 7, 3, 32),
    "Swin-B 384 stage 1": (32, (96, 96), 12, 4, 32),
    "SwinIR 8x8, head_dim 30": (16, (64, 64), 8, 6, 30),
}


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
    """Swin's [heads, N, N] relative position bias from its table (timm's _get_rel_pos_bias)."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
    index = (rel[..., 0] * (2 * window - 1) + rel[..., 1]).to(table.device)
    return table[index.view(-1)].view(window * window, window * window, -1).permute(2, 0, 1)


def partition(x, window):
    """[B, H, W, heads, D] -> [B * nW, heads, N, D] (roll not needed: timing inputs are random)."""
    b, h, w, heads, d = x.shape
    x = x.view(b, h // window, window, w // window, window, heads, d).permute(0, 1, 3, 5, 2, 4, 6)
    return x.reshape(-1, heads, window * window, d).contiguous()


def eager_core(q, k, v, attn_mask, scale):
    attn = (q * scale) @ k.transpose(-2, -1) + attn_mask
    return attn.softmax(-1) @ v


def bench(fn, grads=None):
    return do_bench(fn, warmup=25, rep=200, grad_to_none=grads, return_mode="median")


def run_shape(name, batch, grid, window, heads, head_dim, shift, dtype, rows, quick):
    device = "cuda"
    tokens_per_window = window * window
    qkv = torch.randn(batch, *grid, 3, heads, head_dim, device=device, dtype=dtype)
    table = torch.randn((2 * window - 1) ** 2, heads, device=device) * 0.02
    rpb = haloattn.nn.swin_table_to_rpb(table, (window, window)).contiguous()
    scale = head_dim ** -0.5
    q, k, v = qkv.unbind(-3)
    qw, kw, vw = (partition(t, window) for t in (q, k, v))
    n_windows = (grid[0] // window) * (grid[1] // window)
    attn_mask = swin_bias(table, window).unsqueeze(0).to(dtype)  # [1, heads, N, N]
    if shift:
        mask = swin_mask(grid, window, shift, device).to(dtype)
        attn_mask = (attn_mask.unsqueeze(1) + mask[None, :, None]).expand(batch, -1, -1, -1, -1)
        attn_mask = attn_mask.reshape(batch * n_windows, heads, tokens_per_window, tokens_per_window).contiguous()
    else:
        attn_mask = attn_mask.expand(batch * n_windows, -1, -1, -1)

    def halo():
        return haloattn.attention(q, k, v, window, pattern="window", shift=shift, scale=scale, rpb=rpb)

    def sdpa():
        return F.scaled_dot_product_attention(qw, kw, vw, attn_mask=attn_mask, scale=scale)

    def eager():
        return eager_core(qw, kw, vw, attn_mask, scale)

    result = {"shape": name, "shift": shift, "dtype": str(dtype).replace("torch.", "")}
    result["halo fwd"] = bench(halo)
    if dtype != torch.float32:
        result["sdpa fwd"] = bench(sdpa)
    result["eager fwd"] = bench(eager)

    if dtype != torch.float32 and not quick:
        # Separate q/k/v leaves, as the baselines get: attention against attention.
        halo_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        rpb_leaf = rpb.clone().requires_grad_(True)
        grad = torch.randn(batch, *grid, heads, head_dim, device=device, dtype=dtype)

        def halo_train():
            out = haloattn.attention(*halo_leaves, window, pattern="window", shift=shift, scale=scale, rpb=rpb_leaf)
            out.backward(grad)

        leaves = [t.clone().requires_grad_(True) for t in (qw, kw, vw)]
        mask_leaf = attn_mask.clone().requires_grad_(True)
        grad_w = partition(grad, window)

        def sdpa_train():
            F.scaled_dot_product_attention(*leaves, attn_mask=mask_leaf, scale=scale).backward(grad_w)

        def eager_train():
            eager_core(*leaves, mask_leaf, scale).backward(grad_w)

        result["halo fwd+bwd"] = bench(halo_train, halo_leaves + [rpb_leaf])
        result["sdpa fwd+bwd"] = bench(sdpa_train, leaves + [mask_leaf])
        result["eager fwd+bwd"] = bench(eager_train, leaves + [mask_leaf])
    rows.append(result)
    print(format_row(result), flush=True)


COLUMNS = ["halo fwd", "sdpa fwd", "eager fwd", "halo fwd+bwd", "sdpa fwd+bwd", "eager fwd+bwd"]


def format_header():
    head = "| shape | shift | dtype | " + " | ".join(c + " (ms)" for c in COLUMNS) + " | fwd vs sdpa | fwd vs eager | fwd+bwd vs sdpa |"
    return head + "\n|" + "---|" * (len(COLUMNS) + 6)


def _ratio(row, base, ours):
    return f"{row[base] / row[ours]:.2f}x" if base in row and ours in row else "-"


def format_row(row):
    cells = [row["shape"], str(row["shift"]), row["dtype"]]
    cells += [f"{row[c]:.3f}" if c in row else "-" for c in COLUMNS]
    cells += [_ratio(row, "sdpa fwd", "halo fwd"), _ratio(row, "eager fwd", "halo fwd"),
              _ratio(row, "sdpa fwd+bwd", "halo fwd+bwd")]
    return "| " + " | ".join(cells) + " |"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="Swin-T stage 1 forward only")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    print(format_header(), flush=True)
    rows = []
    for name, (batch, grid, window, heads, head_dim) in SHAPES.items():
        dtypes = [torch.float16, torch.float32] if name == "Swin-T stage 1" else [torch.float16]
        shifts = (0, window // 2) if name == "Swin-T stage 1" or not args.quick else (window // 2,)
        if args.quick and name != "Swin-T stage 1":
            continue
        for dtype in dtypes:
            for shift in shifts:
                run_shape(name, batch, grid, window, heads, head_dim, shift, dtype, rows, args.quick)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(format_header() + "\n" + "\n".join(format_row(r) for r in rows) + "\n")


if __name__ == "__main__":
    main()
