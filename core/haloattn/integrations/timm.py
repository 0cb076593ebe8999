"""Run timm's Swin Transformer (V1) window attention on haloattn, in place.

timm's ``SwinTransformerBlock._attn`` rolls the grid, pads it, partitions it into windows, runs
``WindowAttention`` with a -100 region mask, then reverses all of it. :func:`patch_swin` replaces
that path per block with one :func:`haloattn.attention` call (pattern ``"window"``, the block's
shift) on the un-rolled grid, reusing the block's own ``qkv``/``proj`` layers, scale and relative
position bias table (a flipped view of the same parameter, so training updates the model's
weights). Outputs equal the stock model's up to the -100 mask (e^-100 is below float32 rounding).
"""

from __future__ import annotations

import functools

import torch

from ..api import attention
from ..nn import swin_table_to_rpb

__all__ = ["patch_swin"]


def _haloattn_attn(block, x: torch.Tensor) -> torch.Tensor:
    """Replacement for ``SwinTransformerBlock._attn``: ``x`` is the normed ``[B, H, W, C]`` grid."""
    attn = block.attn
    _, height, width, _ = x.shape
    win_h, win_w = block.window_size
    if height % win_h or width % win_w:
        # timm pads such grids with unmasked zero tokens; haloattn's partial windows differ.
        raise ValueError(
            f"patched Swin block got a {height}x{width} grid, not divisible by its window {win_h}x{win_w}: "
            "timm would pad it with unmasked zero tokens, which haloattn does not reproduce; use grids "
            "divisible by the window (or the unpatched model)"
        )
    if block.training and attn.attn_drop.p > 0:
        raise ValueError(f"attention dropout (attn_drop={attn.attn_drop.p}) is not supported by haloattn")
    q, k, v = attn.qkv(x).unflatten(-1, (3, attn.num_heads, -1)).unbind(-3)
    rpb = swin_table_to_rpb(attn.relative_position_bias_table, block.window_size)
    out = attention(
        q, k, v, tuple(block.window_size), pattern="window", shift=tuple(block.shift_size),
        scale=attn.scale, rpb=rpb,
    )
    return attn.proj_drop(attn.proj(out.flatten(-2)))


def patch_swin(model: torch.nn.Module) -> torch.nn.Module:
    """Make every timm ``SwinTransformerBlock`` of ``model`` run its window attention on haloattn.

    Patches in place and returns ``model``. Raises ``ValueError`` when the model has no Swin V1
    block (Swin V2's cosine attention is not covered) or a block has attention dropout.
    """
    from timm.models.swin_transformer import SwinTransformerBlock

    blocks = [m for m in model.modules() if isinstance(m, SwinTransformerBlock)]
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no timm SwinTransformerBlock (Swin V1) to patch")
    # Check every block before patching any: a refused model is left as it was, not half patched.
    for block in blocks:
        if block.attn.attn_drop.p > 0:
            raise ValueError(
                f"a Swin block has attention dropout {block.attn.attn_drop.p}; haloattn has none (build the "
                "model with attn_drop_rate=0)"
            )
    for block in blocks:
        # A partial, not types.MethodType: pickle stores a bound method as getattr(block, "_haloattn_attn"),
        # which fails on load, so torch.save(model) wrote a file torch.load could not read. The partial
        # pickles as this module's function plus the block (and deep-copies onto the copied block).
        block._attn = functools.partial(_haloattn_attn, block)
    return model
