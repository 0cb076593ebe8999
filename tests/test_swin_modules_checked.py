"""Pattern "window", haloattn.nn's window modules and the timm integration: regressions
for the bugs found, each checked against a float64 computation written from SEMANTICS.md section 4
(Swin's roll -> partition -> region mask -> reverse -> roll, or explicitly enumerated windows) on
fresh random inputs."""

import copy
import io
import itertools
import math

import pytest
import torch

import haloattn
import oracle


def _swin_roll_attention(q, k, v, window, shift, table):
    """Swin's own path for a 2-D grid divisible by the window, in float64: roll(-s), partition,
    scores + relative_position_bias_table[relative_position_index] (query minus key) + the -100
    region mask, softmax, reverse, roll(+s)."""
    q, k, v = (t.double() for t in (q, k, v))
    B, X, Y, H, D = q.shape
    (wh, ww), (sh, sw) = window, shift
    q, k, v = (torch.roll(t, (-sh, -sw), (1, 2)) for t in (q, k, v))

    def partition(t):  # [B, X, Y, ...] -> [B, nW, wh * ww, ...]
        n = t.shape[0]
        t = t.reshape(n, X // wh, wh, Y // ww, ww, *t.shape[3:]).transpose(2, 3)
        return t.reshape(n, (X // wh) * (Y // ww), wh * ww, *t.shape[5:])

    region = torch.zeros(X, Y)
    count = 0
    for hs in ((0, -wh), (-wh, -sh), (-sh, None)) if sh else ((0, None),):
        for ws in ((0, -ww), (-ww, -sw), (-sw, None)) if sw else ((0, None),):
            region[slice(*hs), slice(*ws)] = count
            count += 1
    labels = partition(region[None, :, :, None])[0, :, :, 0]
    mask = (labels[:, None, :] != labels[:, :, None]).double() * -100.0
    coords = list(itertools.product(range(wh), range(ww)))
    index = torch.tensor([[(a - c + wh - 1) * (2 * ww - 1) + (b - d + ww - 1) for c, d in coords] for a, b in coords])
    bias = table.double()[index.view(-1)].view(wh * ww, wh * ww, H).permute(2, 0, 1)
    Q, K, V = partition(q), partition(k), partition(v)
    s = torch.einsum("bwihd,bwjhd->bwhij", Q, K) * D ** -0.5 + bias + mask[None, :, None]
    o = (s.softmax(-1) @ V.permute(0, 1, 3, 2, 4)).permute(0, 1, 3, 2, 4)
    o = o.reshape(B, X // wh, Y // ww, wh, ww, H, -1).transpose(2, 3).reshape(B, X, Y, H, -1)
    return torch.roll(o, (sh, sw), (1, 2))


def test_own_oracle_is_swin():
    """The roll oracle above equals haloattn's window pattern (the rpb as Swin's flipped table)."""
    from haloattn.nn import swin_table_to_rpb

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, 6, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    table = torch.randn(7 * 5, 2, generator=gen, dtype=torch.float64)
    ref = _swin_roll_attention(q, k, v, (4, 3), (2, 1), table)
    out = haloattn.attention(q, k, v, (4, 3), pattern="window", shift=(2, 1), rpb=swin_table_to_rpb(table, (4, 3)),
                             backend="reference")
    assert oracle.rel_error(out, ref) < 1e-10


# --- timm integration ---------------------------------------------------------------------------


def _timm_swin():
    swin_transformer = pytest.importorskip("timm.models.swin_transformer")
    torch.manual_seed(0)
    return swin_transformer.SwinTransformer(
        img_size=56, patch_size=4, window_size=7, embed_dim=32, depths=(2, 2), num_heads=(2, 4),
        num_classes=10, drop_path_rate=0.0,
    ).double().eval()


def test_patched_timm_swin_survives_torch_save_and_load():
    """patch_swin bound its replacement with types.MethodType, which pickle stores as
    getattr(block, "_haloattn_attn"): torch.save(model) succeeded but torch.load raised
    AttributeError. The loaded model must run haloattn and give the stock model's logits."""
    try:
        from haloattn.integrations.timm import patch_swin
        stock = _timm_swin()
    except Exception as exc:  # timm missing, or its torchvision built for another torch
        pytest.skip(f"timm is not importable: {exc}")
    patched = patch_swin(copy.deepcopy(stock))
    buffer = io.BytesIO()
    torch.save(patched, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    x = torch.randn(2, 3, 56, 56, dtype=torch.float64)
    with torch.no_grad():
        assert oracle.rel_error(loaded(x), stock(x)) < 1e-10
    # Still patched (not silently back on timm's roll/partition path), and bound to its own block.
    from timm.models.swin_transformer import SwinTransformerBlock

    for block in loaded.modules():
        if isinstance(block, SwinTransformerBlock):
            assert block._attn.func.__name__ == "_haloattn_attn" and block._attn.args[0] is block
    copied = copy.deepcopy(patched)
    block = copied.layers[0].blocks[1]
    assert block._attn.args[0] is block


def test_patch_swin_refusal_leaves_the_model_unpatched():
    """A model refused for attention dropout in a later block was left with its earlier blocks
    patched."""
    try:
        from haloattn.integrations.timm import patch_swin
        from timm.models.swin_transformer import SwinTransformerBlock
        model = _timm_swin()
    except Exception as exc:
        pytest.skip(f"timm is not importable: {exc}")
    model.layers[1].blocks[1].attn.attn_drop.p = 0.1
    with pytest.raises(ValueError, match="attention dropout 0.1"):
        patch_swin(model)
    assert all("_attn" not in vars(b) for b in model.modules() if isinstance(b, SwinTransformerBlock))


def test_patched_timm_block_matches_swin_roll_oracle():
    """One shifted timm block, patched, against the roll oracle on the block's own weights."""
    try:
        from haloattn.integrations.timm import patch_swin
        model = _timm_swin()
    except Exception as exc:
        pytest.skip(f"timm is not importable: {exc}")
    block = model.layers[0].blocks[1]
    assert tuple(block.shift_size) == (3, 3)
    patch_swin(model)
    x = torch.randn(2, 14, 14, 32, dtype=torch.float64)
    attn = block.attn
    q, k, v = attn.qkv(x).unflatten(-1, (3, attn.num_heads, -1)).unbind(-3)
    ref = attn.proj(_swin_roll_attention(q, k, v, (7, 7), (3, 3), attn.relative_position_bias_table).flatten(-2))
    with torch.no_grad():
        assert oracle.rel_error(block._attn(x), ref) < 1e-10


# --- haloattn.nn argument checks ----------------------------------------------------------------


@pytest.mark.parametrize("build, error, message", [
    (lambda nn: nn.WindowAttention(32, 2, 7, shift=7), ValueError,
     r"shift on axis 0 is 7; allowed: 0 <= shift < window \(7\)"),
    (lambda nn: nn.WindowAttention(32, 2, (4, 7), shift=(0, -1)), ValueError,
     r"shift on axis 1 is -1; allowed: 0 <= shift < window \(7\)"),
    (lambda nn: nn.WindowAttention(32, 2, 7, stride=2), ValueError,
     r"stride on axis 0 is 2 but pattern 'window' has no stride"),
    (lambda nn: nn.NeighborhoodAttention2d(32, 2, 7, shift=3), ValueError,
     r"shift on axis 0 is 3 but pattern is 'neighborhood'"),
    (lambda nn: nn.WindowAttention(32, 2, 7, dilation=(1, 0)), ValueError, r"dilation on axis 1 is 0; it must be >= 1"),
    (lambda nn: nn.WindowAttention(32, 2, 7, shift=3.0), TypeError, r"shift on axis 0 is 3.0 \(float\)"),
    (lambda nn: nn.WindowAttention(32, 2, 7, causal=1), TypeError, r"causal on axis 0 is 1; expected a bool"),
    (lambda nn: nn.WindowAttention(32, 2, 7, softcap=-1.0), ValueError, r"softcap=-1.0"),
    (lambda nn: nn.WindowAttention(32, 0, 7), ValueError, r"num_heads=0; expected an int >= 1"),
    (lambda nn: nn.WindowAttention(32, 2, 7, head_dim=0), ValueError, r"head_dim=0; expected an int >= 1"),
    (lambda nn: nn.WindowAttention(32, 2, (7, 7, 7, 7)), ValueError,
     r"window=\(7, 7, 7, 7\) gives 4 spatial axes; allowed: 1, 2 or 3"),
], ids=["shift_eq_window", "negative_shift_axis1", "stride", "shift_neighborhood", "dilation0", "float_shift",
        "int_causal", "softcap", "zero_heads", "zero_head_dim", "rank4"])
def test_modules_check_their_options_when_built(build, error, message):
    """These were accepted by the constructor and failed only at the first forward (num_heads=0
    with a ZeroDivisionError, a rank-4 window with an error about the query's dimensions)."""
    import haloattn.nn as hnn

    with pytest.raises(error, match=message):
        build(hnn)


def test_module_options_valid_for_any_grid_still_build():
    """The construction check uses the smallest grid the window and dilation allow: nothing valid
    is refused, and the block then runs on larger grids, partial windows included."""
    import haloattn.nn as hnn

    module = hnn.WindowAttention(8, 2, (3, 2), shift=(2, 1), dilation=(2, 3), causal=(True, False)).double()
    hnn.NeighborhoodAttention1d(8, 2, 5, stride=5, dilation=4)
    hnn.WindowAttention(8, 1, 1)
    x = torch.randn(1, 11, 7, 8, dtype=torch.float64)
    assert module(x).shape == x.shape
